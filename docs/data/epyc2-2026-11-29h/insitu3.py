"""Probe: a plain all-reduce's in-situ cost (after a chunk of K 256-matmuls, less the chunk
alone) by size, windows alternated; medians and quartiles over rounds."""
import os, time, statistics, torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
a, b = torch.randn(256, 256), torch.randn(256, 256)
K = int(os.environ.get("K", "24")); CALLS = int(os.environ.get("CALLS", "6"))
MiB = 1 << 20
SZ = [float(s) for s in os.environ.get("SZ", "0.5,1,2,4,8").split(",")]
bufs = {s: torch.zeros(int(s * MiB) // 4) for s in SZ}
def win(s):
    x = bufs.get(s)
    dist.barrier()
    if x is not None: dist.all_reduce(x)
    t0 = time.perf_counter()
    for _ in range(CALLS):
        for _ in range(K): torch.mm(a, b)
        if x is not None: dist.all_reduce(x)
    return (time.perf_counter() - t0) / CALLS
keys = [None] + SZ
res = {k: [] for k in keys}
for _ in range(int(os.environ.get("ROUNDS", "30"))):
    for k in keys: res[k].append(win(k))
c = statistics.median(res[None])
def q(v):
    v = sorted((x - c) * 1e3 for x in v); n = len(v)
    return f"{v[n // 4]:.2f}/{statistics.median(v):.2f}/{v[3 * n // 4]:.2f}"
print(rank, f"K {K} chunk {c*1e3:.2f} ms;", " ".join(f"{s}MiB {q(res[s])}" for s in SZ), flush=True)
dist.destroy_process_group()

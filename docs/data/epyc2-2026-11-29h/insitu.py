"""Probe: what a tp all-reduce costs in situ (after a chunk of work), plain vs DTensor."""
import os, time, statistics, torch, torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
one_pg = dist.new_group([rank]) if False else None
mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
N = 2 * 1024 * 1024 // 4
x = torch.randn(N)
a, b = torch.randn(256, 256), torch.randn(256, 256)
K = int(os.environ.get("K", "12")); CALLS = 8
def chunk():
    for _ in range(K): torch.mm(a, b)
def plain():
    dist.all_reduce(x)
def dt_nowait():
    d = DTensor.from_local(x, mesh, [Partial()], run_check=False)
    return d.redistribute(mesh, [Replicate()]).to_local()
def dt_wait():
    y = dt_nowait()
    return y + 0  # use it: waits like the model's next op
def loop(kind):
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(CALLS):
        if kind[0] == "c": chunk()
        if kind[1] == "p": plain()
        elif kind[1] == "n": dt_nowait()
        elif kind[1] == "w": y = dt_wait(); y[0].item()
    t = time.perf_counter() - t0
    dist.barrier()
    return t / CALLS
kinds = ["c-", "cp", "cw", "cn", "-p", "-w", "-n"]
for k in kinds: loop(k)
res = {k: [] for k in kinds}
for _ in range(int(os.environ.get("ROUNDS", "40"))):
    for k in kinds: res[k].append(loop(k))
m = {k: statistics.median(v) * 1e3 for k, v in res.items()}
print(rank, "K", K, " ".join(f"{k} {v:.3f}" for k, v in m.items()),
      "| plain in situ %.3f, dt(wait) in situ %.3f, b2b plain %.3f dt %.3f, predicted-style %.3f" % (
      m["cp"] - m["c-"], m["cw"] - m["c-"], m["-p"], m["-w"], m["cp"] - m["c-"] + m["-w"] - m["-p"]), flush=True)
dist.destroy_process_group()

"""DTensor's extra over the plain all-reduce: back to back (as bench.dtensor_reduce_curve)
vs after a chunk of K 256-matmuls whose next chunk reads the result (pairs alternated)."""
import os, time, statistics, torch, torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate
torch.set_num_threads(1)
dist.init_process_group("gloo"); rank = dist.get_rank()
mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
K = int(os.environ.get("K", "24")); PAIRS = int(os.environ.get("PAIRS", "150"))
nbytes = int(float(os.environ.get("MB", "2")) * (1 << 20))
x = torch.zeros(nbytes // 4)
a, b = torch.randn(256, 256), torch.randn(256, 256)
def dt(t):
    d = DTensor.from_local(t, mesh, [Partial()], run_check=False)
    return d.redistribute(mesh, [Replicate()]).to_local()
def chunk(src):
    c = a + src[:65536].view(256, 256)  # reads the reduction's result
    for _ in range(K): c = torch.mm(c, b) * 1e-3
    return c
res = {k: [] for k in ("b2b_plain", "b2b_dt", "situ_plain", "situ_dt")}
for _ in range(3): dist.all_reduce(x); dt(x)
y = x
for _ in range(PAIRS):
    for k in res:
        dist.barrier()
        t0 = time.perf_counter()
        if k == "b2b_plain": dist.all_reduce(x)
        elif k == "b2b_dt": dt(x)
        elif k == "situ_plain": chunk(x); dist.all_reduce(x); chunk(x)
        else: chunk(y); y = dt(x); chunk(y)
        res[k].append(time.perf_counter() - t0)
m = {k: statistics.median(v) * 1e3 for k, v in res.items()}
d_b2b = statistics.median(p - q for p, q in zip(res["b2b_dt"], res["b2b_plain"])) * 1e3
d_situ = statistics.median(p - q for p, q in zip(res["situ_dt"], res["situ_plain"])) * 1e3
print(rank, f"K {K} {nbytes>>10} KiB", " ".join(f"{k} {v:.2f}" for k, v in m.items()),
      f"| extra b2b {d_b2b:.2f} in situ {d_situ:.2f}", flush=True)
dist.barrier(); dist.destroy_process_group()

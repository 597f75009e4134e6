"""A DTensor Partial -> Replicate reduction on a one-rank mesh, against a plain all-reduce
(2026-11-28). Run: OMP_NUM_THREADS=1 python dt1.py"""
import os, time, statistics, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29545")
torch.set_num_threads(1)
dist.init_process_group("gloo", rank=0, world_size=1)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate
mesh = init_device_mesh("cpu", (1,))
for mb in (0.0625, 2, 8):
    x = torch.randn(int(mb * 2**20) // 4)
    def dt():
        d = DTensor.from_local(x, mesh, [Partial()], run_check=False)
        return d.redistribute(mesh, [Replicate()]).to_local()
    def plain(): dist.all_reduce(x)
    for f in (dt, plain):
        for _ in range(5): f()
    ts = []; ps = []
    for _ in range(50):
        t0 = time.perf_counter(); dt(); t1 = time.perf_counter(); plain(); t2 = time.perf_counter()
        ts.append(t1 - t0); ps.append(t2 - t1)
    print(mb, "MB dtensor 1-rank", round(statistics.median(ts)*1e3, 3), "ms; plain all_reduce 1-rank", round(statistics.median(ps)*1e3, 3))

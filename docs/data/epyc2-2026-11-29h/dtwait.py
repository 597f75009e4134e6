"""Does the calibration's DTensor reduction return before the all-reduce has finished?"""
import time, statistics, torch, torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate
import torch.distributed._functional_collectives as funcol
torch.set_num_threads(1)
dist.init_process_group("gloo"); rank = dist.get_rank()
mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
x = torch.zeros(2 * 1024 * 1024 // 4)
def reduce(wait):
    d = DTensor.from_local(x, mesh, [Partial()], run_check=False)
    y = d.redistribute(mesh, [Replicate()]).to_local()
    if wait:
        y = funcol.wait_tensor(y) if not hasattr(y, "wait") else y.wait()
    return y
print(rank, type(reduce(False)).__name__, flush=True)
res = {"plain": [], "dt": [], "dt_wait": [], "dt+barrier": []}
for _ in range(60):
    for k in res:
        dist.barrier(); t0 = time.perf_counter()
        if k == "plain": dist.all_reduce(x)
        elif k == "dt": reduce(False)
        elif k == "dt_wait": reduce(True)
        else: reduce(False); dist.barrier()
        res[k].append(time.perf_counter() - t0)
print(rank, " ".join(f"{k} {statistics.median(v)*1e3:.3f}" for k, v in res.items()), flush=True)
dist.destroy_process_group()

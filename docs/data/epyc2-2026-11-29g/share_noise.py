"""DTensor share stage (bench.model_dtensor_share) five times at 7, 15 and 31 pairs of
windows, one worker: its spread. OMP_NUM_THREADS=1 python share_noise.py"""
import sys, time, statistics
import torch, torch.distributed as dist
torch.set_num_threads(1)
from ptd.runtime.calibrate import bench
from ptd.runtime.calibrate.bench import Sync
from ptd.runtime.calibrate.workers import op_model
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
sync = Sync(1, 0, None, None, None, lambda: None, 60.0)
for w in (7, 15, 31):
    bench.DTENSOR_SHARE_WINDOWS = w
    t0 = time.time()
    vals = [bench.model_dtensor_share(op_model(), sync, 0.05, 3) for _ in range(5)]
    print(w, [round(v * 100, 1) for v in vals], f"{(time.time()-t0)/5:.1f} s each", flush=True)

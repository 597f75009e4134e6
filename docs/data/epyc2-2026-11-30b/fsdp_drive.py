"""The ZeRO-3-in-place stage on its own, before it was wired into ptd calibrate (2026-11-30, 02:00 UTC):
    OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc-per-node 2 docs/data/epyc2-2026-11-30b/fsdp_drive.py
probes.txt holds three runs and the residual each gives against the profile of docs/data/epyc2-2026-11-30/bench1."""
import json, os, torch, torch.distributed as dist
torch.set_num_threads(1)
from ptd.runtime.calibrate.fsdp_situ import fsdp_situ
dist.init_process_group("gloo"); rank = dist.get_rank(); n = dist.get_world_size()
class B:
    def wait(self, t): dist.barrier()
r = fsdp_situ(rank, n, None, B(), 60, rounds=int(os.environ.get("ROUNDS", 12)))
print("RES", rank, json.dumps(r), flush=True)
dist.barrier()

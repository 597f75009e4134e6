"""The ZeRO-3-in-place stage on a group of four (4 workers on the 2 cores), priced as a group
of four by three of this session's profiles: why the stage stays on pairs.
    OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc-per-node 4 docs/data/epyc2-2026-11-30b/fsdp_drive.py | grep RES > /tmp/probe4.txt
    .venv/bin/python docs/data/epyc2-2026-11-30b/group4.py /tmp/probe4.txt"""
import dataclasses, json, sys
from ptd.cost.estimate import estimate
from ptd.runtime.calibrate.tp_situ import SITU_MODEL
from ptd.specs.hardware import ClusterSpec, load_hardware
from ptd.specs.plan import ParallelPlan
pts = [json.loads(line.split(" ", 2)[2]) for line in open(sys.argv[1])]
meas = sum(sum(p["fsdp"]) - sum(p["plain"]) for p in pts) / len(pts)
plain = sum(sum(p["plain"]) for p in pts) / len(pts)
for b in (4, 5, 6):
    hw = load_hardware(f"docs/data/epyc2-2026-11-30b/bench{b}/calibrated.toml").replace(fsdp_situ_measured={})
    c = ClusterSpec(hw, 4)
    z3 = ParallelPlan(dp=4, zero=3, seq_len=256, micro_batch=4, global_batch=16)
    z = estimate(SITU_MODEL, c, z3).step
    d = estimate(SITU_MODEL, c, dataclasses.replace(z3, zero=0)).step
    pr = z.forward + z.backward + z.dp_comm_exposed - d.forward - d.backward
    print(f"bench{b}: ZeRO-3 above plain measured {meas*1e3:.1f} ms, priced {pr*1e3:.1f}; residual a gather "
          f"{(meas - pr) / 6 * 1e3:.2f} ms; the plain model measured {plain*1e3:.0f} ms, priced {(d.forward + d.backward)*1e3:.0f}")

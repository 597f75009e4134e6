"""What each bench's profile charges one tp-2 all-reduce of 2 MiB after 7.9 ms of work (the
bench grid's tp 2 chunk): fit, DTensor extra, blocking wait, in-place residual.
    .venv/bin/python docs/data/epyc2-2026-11-29h/price_tp2.py"""
import glob, os, statistics
from ptd.specs.hardware import load_hardware, ClusterSpec
from ptd.cost.comm import collective_time
here = os.path.dirname(os.path.abspath(__file__))
parts, whole = [], []
for d in sorted(glob.glob(f"{here}/bench*/calibrated.toml")):
    hw = load_hardware(d); c = ClusterSpec(hw, 2)
    f, e, w, r = (collective_time("all_reduce", 2 << 20, 2, hw), c.dtensor_reduce(2 << 20),
                  c.blocking_wait(0.0079, 2), hw.tp_situ_at(2 << 20, 2))
    parts.append(f + e + w); whole.append(f + e + w + r)
    print(d.split("/")[-2], " ".join(f"{v * 1e3:.2f}" for v in (f, e, w, r)), f"| {(f + e + w) * 1e3:.2f} -> {(f + e + w + r) * 1e3:.2f} ms")
for name, v in (("parts", parts), ("with the residual", whole)):
    print(f"{name}: mean {statistics.mean(v) * 1e3:.2f} ms, s.d. {statistics.stdev(v) * 1e3:.2f}")

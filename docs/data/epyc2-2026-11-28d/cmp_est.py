"""Predicted step time of the default `ptd bench scaling` grid (small, seq 128, global batch 16,
fp32) under each calibrated profile given, side by side, with the parts that differ by more than
8%.  Usage: python cmp_est.py A/calibrated.toml B/calibrated.toml"""
import sys
from ptd.bench.scaling import layout, STRATEGIES
from ptd.specs import get_preset, ParallelPlan, ClusterSpec, load_hardware
from ptd.cost.estimate import estimate
profs = sys.argv[1:]
hws = [load_hardware(p) for p in profs]
model = get_preset("small")
seen = set()
for n in (1, 2, 4):
    for s in STRATEGIES:
        lay = layout(s, n)
        if lay in seen: continue
        seen.add(lay)
        per = 16 // lay.dp; m = 2 * lay.pp if lay.pp > 1 else 1; mb = max(1, per // m)
        kw = dict(dp=lay.dp, tp=lay.tp, pp=lay.pp, zero=lay.zero, micro_batch=mb, global_batch=16, seq_len=128, dtype="fp32")
        if lay.pp > 1: kw["schedule"] = "1f1b"
        plan = ParallelPlan(**kw)
        outs = []
        for hw in hws:
            e = estimate(model, ClusterSpec(hw, lay.n), plan)
            b = e.step
            outs.append(b)
        name = f"n{n} dp{lay.dp} tp{lay.tp} pp{lay.pp} z{lay.zero}"
        print(name.ljust(22), " | ".join(f"{b.total*1e3:6.0f}" for b in outs))
        keys = [k for k, v in vars(outs[0]).items() if isinstance(v, float) and v > 0.002]
        for k in keys:
            vals = [getattr(b, k) for b in outs]
            if max(vals) > 1.08 * min(vals) and max(vals) - min(vals) > 0.005:
                print("    ", k.ljust(20), " | ".join(f"{v*1e3:6.1f}" for v in vals))

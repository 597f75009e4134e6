"""Every `ptd bench scaling --json` result kept under docs/data/epyc2-*: for each bench, the
one-worker row's measured / predicted step (the level: how fast the machine ran against
the calibration the prediction used) and each other row's ratio divided by it (the shape:
what the cost model gets right or wrong between layouts, whatever the machine's speed).

    python docs/data/epyc2-2026-11-28e/shape_vs_level.py

The benches ran under the cost model of their day (docs/measuring.md says which); this
reads what each one printed, it predicts nothing again."""

import collections
import glob
import json
import os
import statistics as st

here = os.path.dirname(os.path.abspath(__file__))
files = sorted(glob.glob(os.path.join(here, "..", "epyc2-*", "scaling*.json")))
shape = collections.defaultdict(list)
print(f"{'bench':38s} level  shape: median  min   max")
for f in files:
    rows = json.load(open(f))["measured"]["speedup"]
    ratio = {(r["strategy"], r["n"]): r["step_s"] / r["step_s_pred"] for r in rows
             if r.get("step_s") and r.get("step_s_pred")}
    one = ratio[("ddp", 1)]
    # (the grid's "3d" rows are ddp 2 and tp 2 x pp 2: each layout counted once)
    rel = {k: v / one for k, v in ratio.items() if k[1] > 1 and k != ("3d", 2)}
    for k, v in rel.items():
        shape[k].append(v)
    v = list(rel.values())
    name = os.path.relpath(f, os.path.join(here, ".."))
    print(f"{name:38s} {one:5.2f}  {st.median(v):13.2f} {min(v):5.2f} {max(v):5.2f}")
print(f"\n{len(files)} benches; each layout's shape ratio over them")
for (s, n), v in sorted(shape.items()):
    label = "tp2 x pp2" if s == "3d" else f"{s} {n}"
    print(f"{label:10s} median {st.median(v):.2f}  range {min(v):.2f}-{max(v):.2f}")

# ZeRO-3's forward and backward beyond DDP's at the same worker count, from each bench's
# profiled breakdown (one profiled step per row), measured against predicted, in ms
print("\nZeRO-3's forward + backward beyond DDP's (ms), median over the benches")
for n in (2, 4):
    got, want = [], []
    for f in files:
        b = {(x["strategy"], x["n"]): x for x in json.load(open(f))["measured"]["breakdown"]}
        if ("ddp", n) in b and ("zero3", n) in b:
            for out, side in ((got, "measured"), (want, "predicted")):
                z, d = b[("zero3", n)][side], b[("ddp", n)][side]
                out.append(1e3 * (z["forward"] + z["backward"] - d["forward"] - d["backward"]))
    print(f"{n} workers: measured {st.median(got):.0f} (range {min(got):.0f} to {max(got):.0f}),"
          f" predicted {st.median(want):.0f}")

"""Re-price a stored `ptd bench scaling` with the current cost model and the profile the
bench ran with (its own calibrated.toml): measured / predicted per row, stored and now.
The measurements do not change; only the model does.

    .venv/bin/python docs/data/epyc2-2026-11-29e/reprice.py docs/data/epyc2-2026-11-29d
"""
import json
import sys

from ptd.bench import scaling as S
from ptd.specs import ParallelPlan, get_preset, load_hardware
from ptd.summary.compare import predict

d = sys.argv[1]
D = json.load(open(f"{d}/scaling.json"))
meta = D["meta"]
hw = load_hardware(f"{d}/calibrated.toml")
model = get_preset(meta["model"])
seen = set()
for x in D["runs"]:
    if (x["strategy"], x["n"]) in seen or (x["n"] == 1 and x["strategy"] != "ddp"):
        continue
    seen.add((x["strategy"], x["n"]))
    dp, tp, pp, z = x["layout"]
    lay = S.layout(x["strategy"], x["n"])
    plan = ParallelPlan(dp=dp, tp=tp, pp=pp, zero=z, schedule="1f1b", dtype="fp32",
                        micro_batch=S.micro_batch(lay, meta["global_batch"]),
                        global_batch=meta["global_batch"], seq_len=meta["seq_len"])
    meas = x["summary"]["measured"]["step_time_s"]
    old = x["summary"]["predicted"]["step_time_s"]
    now = predict(model, plan, hw).step.total
    print(f"{x['strategy']:6s} {x['n']}  measured {meas * 1e3:4.0f} ms  predicted then "
          f"{old * 1e3:4.0f} ({meas / old:.2f})  now {now * 1e3:4.0f} ({meas / now:.2f})")

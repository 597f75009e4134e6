"""One bench's measurements priced with two profiles and with each of two fields swapped
between them: which field moved the prediction. (Twenty-sixth session.)

    .venv/bin/python docs/data/epyc2-2026-11-29f/swap.py BENCH_DIR OTHER.toml
BENCH_DIR holds the bench's scaling.json and the calibrated.toml it ran with.
"""
import dataclasses
import json
import sys

from ptd.bench import scaling as S
from ptd.specs import ParallelPlan, get_preset, load_hardware
from ptd.summary.compare import predict

d, other = sys.argv[1], sys.argv[2]
D = json.load(open(f"{d}/scaling.json"))
meta = D["meta"]
new, old = load_hardware(f"{d}/calibrated.toml"), load_hardware(other)
variants = {"bench's": new, "other": old,
            "other+bench's shapes": dataclasses.replace(
                old, gemm_shapes_measured=new.gemm_shapes_measured),
            "other+bench's memory": dataclasses.replace(
                old, memory_bandwidth_measured=new.memory_bandwidth_measured)}
model = get_preset(meta["model"])
print(f"{'row':9s} {'measured':>8s} " + " ".join(f"{k:>21s}" for k in variants))
for x in D["measured"]["speedup"]:
    lay = S.layout(x["strategy"], x["n"])
    if x["n"] == 1 and x["strategy"] != "ddp":
        continue
    plan = ParallelPlan(dp=lay.dp, tp=lay.tp, pp=lay.pp, zero=lay.zero, schedule="1f1b",
                        dtype="fp32", micro_batch=S.micro_batch(lay, meta["global_batch"]),
                        global_batch=meta["global_batch"], seq_len=meta["seq_len"])
    meas = x["step_s"]
    cells = [f"{meas / predict(model, plan, hw).step.total:21.2f}" for hw in variants.values()]
    print(f"{x['strategy']:6s} {x['n']:2d} {meas * 1e3:6.0f}ms " + " ".join(cells))

"""Price each bench's tp rows by its profile with and without tp_situ_measured, and with the
tp step's parts: measured / predicted (with > without)."""
import dataclasses, json, sys
from ptd.bench import scaling as S
from ptd.specs import ParallelPlan, get_preset, load_hardware
from ptd.summary.compare import predict
for d in sys.argv[1:]:
    D = json.load(open(f"{d}/scaling.json")); meta = D["meta"]
    hw = load_hardware(f"{d}/calibrated.toml")
    hw0 = dataclasses.replace(hw, tp_situ_measured={})
    model = get_preset(meta["model"]); cells = []
    for x in D["measured"]["speedup"]:
        lay = S.layout(x["strategy"], x["n"])
        if lay.tp == 1: continue
        plan = ParallelPlan(dp=lay.dp, tp=lay.tp, pp=lay.pp, zero=lay.zero, schedule="1f1b", dtype="fp32",
                            micro_batch=S.micro_batch(lay, meta["global_batch"]), global_batch=meta["global_batch"], seq_len=meta["seq_len"])
        m = x["step_s"]; a, b = predict(model, plan, hw).step, predict(model, plan, hw0).step
        cells.append(f"tp{lay.tp}pp{lay.pp} {m / a.total:.2f}>{m / b.total:.2f} (tp_comm {a.tp_comm*1e3:.0f}/{b.tp_comm*1e3:.0f} bubble {a.bubble*1e3:.0f}/{b.bubble*1e3:.0f})")
    print(d, " ".join(cells), {n: [(int(p[0]), round(p[1]*1e3, 2)) for p in pts] for n, pts in hw.tp_situ_measured.items()})

"""Each bench's rows priced by its profile as the final code reads it (tp_situ_measured of 2
workers only), and without tp_situ_measured: the table's cells."""
import dataclasses, json, sys
from ptd.bench import scaling as S
from ptd.specs import ParallelPlan, get_preset, load_hardware
from ptd.summary.compare import predict
NAMES = {"ddp": "dp", "zero1": "ZeRO-1 over", "zero2": "ZeRO-2 over", "zero3": "ZeRO-3 over", "tp": "tp", "pp": "pp", "3d": "tp 2 x pp 2"}
for d in sys.argv[1:]:
    D = json.load(open(f"{d}/scaling.json")); meta = D["meta"]
    hw = load_hardware(f"{d}/calibrated.toml")
    hw = dataclasses.replace(hw, tp_situ_measured={k: v for k, v in hw.tp_situ_measured.items() if k <= 2})
    hw0 = dataclasses.replace(hw, tp_situ_measured={})
    model = get_preset(meta["model"]); rows = {}; seen = set()
    for x in D["measured"]["speedup"]:
        if x["plan"] in seen: continue
        seen.add(x["plan"])
        lay = S.layout(x["strategy"], x["n"])
        plan = ParallelPlan(dp=lay.dp, tp=lay.tp, pp=lay.pp, zero=lay.zero, schedule="1f1b", dtype="fp32",
                            micro_batch=S.micro_batch(lay, meta["global_batch"]), global_batch=meta["global_batch"], seq_len=meta["seq_len"])
        name = "one worker" if x["n"] == 1 else (NAMES[x["strategy"]] + ("" if x["strategy"] == "3d" else f" {x['n']}"))
        rows[name] = (x["step_s"] / predict(model, plan, hw).step.total, x["step_s"] / predict(model, plan, hw0).step.total)
    inside = sum(0.85 <= r <= 1.15 for r, _ in rows.values())
    worst = max(rows, key=lambda k: abs(rows[k][0] - 1))
    one = rows["one worker"][0]
    div = [r / one for r, _ in rows.values()]
    wdiv = max(div, key=lambda v: abs(v - 1))
    pts = hw.tp_situ_measured.get(2, ())
    print(f"| {d.split('/')[-1]} | {open(d + '/start.txt').read().split(' UTC')[0][11:16]} | {inside} of {len(rows)} | {one:.2f} | {worst}, {rows[worst][0]:.2f} | {sum(0.85 <= v <= 1.15 for v in div)} of {len(div)} ({wdiv:.2f}) | {rows['tp 2'][0]:.2f} ({rows['tp 2'][1]:.2f}) | " + " / ".join(f"{p[1]*1e3:.2f}" for p in pts) + " |")

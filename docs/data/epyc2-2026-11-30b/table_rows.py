"""Each bench's rows priced by its profile as the code at this session's end reads it, and
ZeRO-3 over 2 also without fsdp_situ_measured: the table's cells.
    .venv/bin/python docs/data/epyc2-2026-11-30b/table_rows.py docs/data/epyc2-2026-11-30b/bench*"""
import dataclasses, json, sys
from ptd.bench import scaling as S
from ptd.specs import ParallelPlan, get_preset, load_hardware
from ptd.summary.compare import predict
NAMES = {"ddp": "dp", "zero1": "ZeRO-1 over", "zero2": "ZeRO-2 over", "zero3": "ZeRO-3 over",
         "tp": "tp", "pp": "pp", "3d": "tp 2 x pp 2"}
for d in sys.argv[1:]:
    D = json.load(open(f"{d}/scaling.json")); meta = D["meta"]
    hw = load_hardware(f"{d}/calibrated.toml")
    hw0 = dataclasses.replace(hw, fsdp_situ_measured={})
    model = get_preset(meta["model"]); rows = {}; seen = set()
    for x in D["measured"]["speedup"]:
        if x["plan"] in seen: continue
        seen.add(x["plan"])
        lay = S.layout(x["strategy"], x["n"])
        plan = ParallelPlan(dp=lay.dp, tp=lay.tp, pp=lay.pp, zero=lay.zero, schedule="1f1b", dtype="fp32",
                            micro_batch=S.micro_batch(lay, meta["global_batch"]),
                            global_batch=meta["global_batch"], seq_len=meta["seq_len"])
        name = "one worker" if x["n"] == 1 else (NAMES[x["strategy"]] + ("" if x["strategy"] == "3d" else f" {x['n']}"))
        rows[name] = (x["step_s"] / predict(model, plan, hw).step.total,
                      x["step_s"] / predict(model, plan, hw0).step.total)
    inside = sum(0.85 <= r <= 1.15 for r, _ in rows.values())
    worst = max(rows, key=lambda k: abs(rows[k][0] - 1))
    one = rows["one worker"][0]
    div = [r / one for r, _ in rows.values()]
    wdiv = max(div, key=lambda v: abs(v - 1))
    pts = hw.fsdp_situ_measured.get(2, ())
    print(f"| {d.split('/')[-1]} | {open(d + '/start.txt').read().split(' UTC')[0][11:16]} | {inside} of {len(rows)} "
          f"| {one:.2f} | {worst}, {rows[worst][0]:.2f} | {sum(0.85 <= v <= 1.15 for v in div)} of {len(div)} ({wdiv:.2f}) "
          f"| {rows['ZeRO-3 over 2'][0]:.2f} ({rows['ZeRO-3 over 2'][1]:.2f}) | "
          + " / ".join(f"{p[1]*1e3:.2f}" for p in pts) + " |")

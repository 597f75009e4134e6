"""Price benches (folders with scaling.json and calibrated.toml) by their profile, and by it
with FSDP2 unit costs at 2 and 4 workers from fsdp_pair.py: which rows move.
    .venv/bin/python reprice_fsdp.py BENCH_DIR..."""
import dataclasses, json, sys
from ptd.bench import scaling as S
from ptd.specs import ParallelPlan, get_preset, load_hardware
from ptd.summary.compare import predict
PAIR = {"fsdp_unit_forward": {2: 0.60e-3, 4: 0.98e-3}, "fsdp_unit_backward": {2: 0.56e-3, 4: 1.55e-3},
        "fsdp_unit_keep_forward": {2: 0.54e-3, 4: 0.89e-3}, "fsdp_unit_keep_backward": {2: 0.16e-3, 4: 1.04e-3}}
for d in sys.argv[1:]:
    D = json.load(open(f"{d}/scaling.json")); meta = D["meta"]
    hw = load_hardware(f"{d}/calibrated.toml")
    ov = {k: dict(v) for k, v in hw.overheads_measured.items()}
    for k, v in PAIR.items():
        ov[k] = {**ov[k], **v}
    hw2 = dataclasses.replace(hw, overheads_measured=ov)
    model = get_preset(meta["model"]); cells = []
    for x in D["measured"]["speedup"]:
        lay = S.layout(x["strategy"], x["n"])
        if x["strategy"] not in ("ddp", "zero1", "zero2", "zero3") or x["n"] == 1: continue
        plan = ParallelPlan(dp=lay.dp, tp=lay.tp, pp=lay.pp, zero=lay.zero, schedule="1f1b", dtype="fp32",
                            micro_batch=S.micro_batch(lay, meta["global_batch"]), global_batch=meta["global_batch"], seq_len=meta["seq_len"])
        m = x["step_s"]
        cells.append(f"{x['strategy']}{x['n']} {m / predict(model, plan, hw).step.total:.2f}>{m / predict(model, plan, hw2).step.total:.2f}")
    print(d.split("/")[-2:], " ".join(cells))

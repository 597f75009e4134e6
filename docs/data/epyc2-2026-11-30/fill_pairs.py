# (twenty-ninth session) run from the repository root, with the bench folders as for fill_busy.py:
#   .venv/bin/python docs/data/epyc2-2026-11-30/fill_pairs.py DIR...
"""3d4: alt A = bubble priced with the neighbour alone; alt B = A plus k where the group's
collectives (all but their blocking waits) occupy the cores as computation does."""
import dataclasses, json, sys
from ptd.bench import scaling as S
from ptd.specs import ParallelPlan, get_preset, load_hardware, ClusterSpec
from ptd.cost import step as ST
from ptd.summary.compare import predict
orig_pipe, orig_rate = ST.pipeline, ST.pipeline_rate
MODE = {"bub": False, "k": False}
def rate(plan, cluster, mbt, cp_exposed):
    if plan.pp <= 1: return 1.0
    waiting = mbt.tf + mbt.tb + cp_exposed
    if MODE["k"] and mbt.wait > 0:
        # number of blocking collectives on the rank: from the counts the step uses
        tpc = ST._tp_collectives(MODEL, plan, cluster, plan.seq_len * plan.micro_batch, True, False, "autocast")
        # the last rank's collectives (the slowest rank here: it holds the output layer)
        n = mbt.nl * (tpc.n_f + tpc.n_b) + tpc.n_out_f + 1
        waiting = n * mbt.wait + cp_exposed
    return ST.pipeline_sharing(cluster, plan.dtype, plan.tp * plan.cp, plan.n_microbatches,
                               ST._fill(plan), mbt.f + mbt.b + mbt.rc, waiting)
def pipe(model, plan, cluster, mbt, cp_exposed, r=None):
    bub, p2p = orig_pipe(model, plan, cluster, mbt, cp_exposed, r)
    if not MODE["bub"] or plan.pp != 2: return bub, p2p
    g = plan.tp * plan.cp
    if g >= cluster.workers_per_node: return bub, p2p
    a = ST.micro_batch(model, plan, ClusterSpec(cluster.hardware, g, g), "flash", True, True, "autocast")
    k = rate(plan, cluster, mbt, cp_exposed) if r is None else r
    fill = ST._fill(plan)
    return bub - fill * ((mbt.f + mbt.b + mbt.rc) * k + mbt.tf + mbt.tb + cp_exposed) \
        + fill * (a.f + a.b + a.rc + a.tf + a.tb + cp_exposed), p2p
ST.pipeline, ST.pipeline_rate = pipe, rate
tot = {}
for d in sys.argv[1:]:
    D = json.load(open(f"{d}/scaling.json")); meta = D["meta"]
    hw = load_hardware(f"{d}/calibrated.toml")
    hw = dataclasses.replace(hw, tp_situ_measured={k: v for k, v in hw.tp_situ_measured.items() if k <= 2})
    MODEL = model = get_preset(meta["model"]); out = []
    for x in D["runs"]:
        if x["strategy"] not in ("pp", "3d") or x["n"] < 2 or not x["summary"]: continue
        lay = S.layout(x["strategy"], x["n"])
        plan = ParallelPlan(dp=lay.dp, tp=lay.tp, pp=lay.pp, zero=lay.zero, schedule="1f1b", dtype="fp32",
                            micro_batch=S.micro_batch(lay, meta["global_batch"]), global_batch=meta["global_batch"], seq_len=meta["seq_len"])
        M = x["summary"]["measured"]; meas = M["step_time_s"]; mb = M["breakdown"]
        cells = []
        for name, b, k in (("now", False, False), ("A", True, False), ("B", True, True)):
            MODE.update(bub=b, k=k); s = predict(model, plan, hw).step
            cells.append(f"{name} {meas/s.total:.2f} (c {mb['compute']/s.compute:.2f} b {mb['bubble']/max(s.bubble,1e-9):.2f})")
            tot.setdefault((x['strategy'], x['n'], name), []).append(meas / s.total)
        out.append(f"{x['strategy']}{x['n']}: " + " ".join(cells))
    print(d.split('/')[-2][-3:], d.split('/')[-1], " | ".join(o for o in out if o.startswith("3d4") or o.startswith("pp4")))
import statistics as st
for key, v in sorted(tot.items()):
    print(key, f"mean {st.mean(v):.3f} sd {st.pstdev(v):.3f} min {min(v):.2f} max {max(v):.2f}")

# (twenty-ninth session) run from the repository root:
#   .venv/bin/python docs/data/epyc2-2026-11-30/fill_busy.py $(ls -d docs/data/epyc2-2026-11-29*/bench*/ | sed "s,/$,," | while read d; do [ -f $d/calibrated.toml ] && echo $d; done)
"""General fill: each idle slot's work priced with as many workers busy as the 1F1B
schedule has busy then (slot simulation, f=1, b=2), rank-averaged."""
import dataclasses, json, sys, statistics as stt
from ptd.bench import scaling as S
from ptd.specs import ParallelPlan, get_preset, load_hardware, ClusterSpec
from ptd.cost import step as ST
from ptd.summary.compare import predict

def idle_busy(p, m, f=1.0, b=2.0):
    orders = []
    for r in range(p):
        w = min(p - 1 - r, m); o = [("F", i) for i in range(w)]; fi, bi = w, 0
        while bi < m:
            if fi < m: o.append(("F", fi)); fi += 1
            o.append(("B", bi)); bi += 1
        orders.append(o)
    done = {}; t = [0.0] * p; idx = [0] * p; iv = [[] for _ in range(p)]
    while any(idx[r] < len(orders[r]) for r in range(p)):
        for r in range(p):
            if idx[r] >= len(orders[r]): continue
            k, i = orders[r][idx[r]]
            if k == "F": dep = done.get(("F", r - 1, i)) if r > 0 else 0.0
            else: dep = done.get(("B", r + 1, i)) if r < p - 1 else done.get(("F", r, i))
            if dep is None: continue
            s = max(t[r], dep); e = s + (f if k == "F" else b)
            iv[r].append((s, e)); done[(k, r, i)] = e; t[r] = e; idx[r] += 1
    T = max(t); pts = sorted({x for r in range(p) for a in iv[r] for x in a} | {0.0, T})
    tot = {}
    for r in range(p):
        for a, c in zip(pts, pts[1:]):
            mid = (a + c) / 2
            if any(s <= mid < e for s, e in iv[r]): continue
            busy = sum(any(s <= mid < e for s, e in iv[q]) for q in range(p))
            tot[busy] = tot.get(busy, 0) + c - a
    z = sum(tot.values()); return {k: v / z for k, v in tot.items()}

orig = ST.pipeline
def alt(model, plan, cluster, mbt, cp_exposed, rate=None):
    bub, p2p = orig(model, plan, cluster, mbt, cp_exposed, rate)
    if plan.pp < 2: return bub, p2p
    g = plan.tp * plan.cp
    k = ST.pipeline_rate(plan, cluster, mbt, cp_exposed) if rate is None else rate
    fill = ST._fill(plan)
    new = 0.0
    for busy, frac in idle_busy(plan.pp, plan.n_microbatches).items():
        wb = min(cluster.workers_per_node, busy * g * plan.dp)
        a = ST.micro_batch(model, plan, ClusterSpec(cluster.hardware, wb, wb), "flash", True, True, "autocast")
        new += frac * (a.f + a.b + a.rc + a.tf + a.tb + cp_exposed)
    return bub - fill * ((mbt.f + mbt.b + mbt.rc) * k + mbt.tf + mbt.tb + cp_exposed) + fill * new, p2p
tot = {}
for d in sys.argv[1:]:
    D = json.load(open(f"{d}/scaling.json")); meta = D["meta"]
    hw = load_hardware(f"{d}/calibrated.toml")
    hw = dataclasses.replace(hw, tp_situ_measured={k: v for k, v in hw.tp_situ_measured.items() if k <= 2})
    model = get_preset(meta["model"]); out = []
    for x in D["runs"]:
        if x["strategy"] not in ("pp", "3d") or x["n"] < 2 or not x["summary"]: continue
        lay = S.layout(x["strategy"], x["n"])
        if lay.pp < 2: continue
        plan = ParallelPlan(dp=lay.dp, tp=lay.tp, pp=lay.pp, zero=lay.zero, schedule="1f1b", dtype="fp32",
                            micro_batch=S.micro_batch(lay, meta["global_batch"]), global_batch=meta["global_batch"], seq_len=meta["seq_len"])
        M = x["summary"]["measured"]; mb = M["breakdown"]
        ST.pipeline = orig; s0 = predict(model, plan, hw).step
        ST.pipeline = alt; s1 = predict(model, plan, hw).step; ST.pipeline = orig
        tot.setdefault(f"{x['strategy']}{x['n']} m{plan.n_microbatches}", []).append((M["step_time_s"]/s0.total, M["step_time_s"]/s1.total, mb["bubble"]/s0.bubble, mb["bubble"]/s1.bubble))
for key, v in tot.items():
    cols = list(zip(*v))
    print(key, " ".join(f"{n} {stt.mean(c):.3f}±{stt.pstdev(c):.3f}" for n, c in zip(("step now", "step gen", "bubble now", "bubble gen"), cols)))

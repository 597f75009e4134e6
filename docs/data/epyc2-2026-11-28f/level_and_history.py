"""What moves `ptd bench scaling`'s rows on the 2-core box (fifteenth session, docs/measuring.md).

Part 1 reads benches_steps.json (every run of seven three-round benches of 2026-11-28: each
run's clean step times and its prediction, as that day's code priced it) and prints, per
bench: the layouts within 15% with a run's step as the mean of its clean steps (what ptd
reports) and as their median; the level (one-worker row, measured / predicted); the count
after dividing by it; the one-worker ratio in each round.

Part 2 re-prices the one-worker row and the grid of six benches with this tree's cost model,
under the bench's own calibration and under a merge of it with every calibration before it
(the median of each matmul, memory and operator figure): would a profile holding several
moments of the machine have put the rows nearer? Run from the repository root:
    .venv/bin/python docs/data/epyc2-2026-11-28f/level_and_history.py
"""
import copy, json, statistics as st, tomllib
from pathlib import Path
from ptd.bench.scaling import layout
from ptd.cost.estimate import estimate
from ptd.specs import ClusterSpec, ParallelPlan, get_preset
from ptd.specs.hardware import hardware_from_dict

HERE = Path(__file__).parent
DATA = HERE.parent
ONE = "n1-dp1-tp1-pp1-z0"

print("part 1: seven benches, each layout's median round")
benches = json.load(open(HERE / "benches_steps.json"))
for name, b in benches.items():
    rows: dict[str, list] = {}
    for r in b["runs"]:
        rows.setdefault(r["layout"], []).append(r)
    def ratios(agg):
        return {k: st.median(agg(r["clean_steps_s"]) / r["predicted_s"] for r in v) for k, v in rows.items()}
    mean, med = ratios(st.mean), ratios(st.median)
    level = mean[ONE]
    within = lambda d, lv=1.0: sum(abs(v / lv - 1) <= 0.15 for v in d.values())
    one_by_round = [r["measured_s"] / r["predicted_s"] for r in sorted(rows[ONE], key=lambda r: r["round"])]
    print(f"  {name:28s} within 15%: mean {within(mean)}/14, median {within(med)}/14;"
          f" level {level:.2f}, after it {within(mean, level)}/14;"
          f" one worker by round {' '.join(f'{x:.2f}' for x in one_by_round)};"
          f" its step {st.median(r['measured_s'] for r in rows[ONE]) * 1e3:.0f} ms")

print("part 2: each bench priced with its own calibration / with the median of it and every earlier one")
profiles = [("27c", DATA / "epyc2-2026-11-27c/calibrated.toml"), ("27d", DATA / "epyc2-2026-11-27d/calibrated.toml"),
            ("28", DATA / "epyc2-2026-11-28/calibrated.toml"), ("28again", DATA / "epyc2-2026-11-28/calibrated_again.toml"),
            ("28second", DATA / "epyc2-2026-11-28/calibrated_second.toml"), ("s12_0725", HERE / "profiles/s12_0725.toml"),
            ("A", HERE / "profiles/A_0943.toml"), ("B", HERE / "profiles/B_0945.toml"), ("A2", HERE / "profiles/A2_0951.toml"),
            ("B2", HERE / "profiles/B2_0954.toml"), ("C", HERE / "profiles/C_1021.toml"), ("D", HERE / "profiles/D_1023.toml"),
            ("m14", HERE / "profiles/m14_1312.toml")]
H = {k: tomllib.load(open(p, "rb"))["hardware"] for k, p in profiles}
MERGED = ["gemm_flops_measured", "gemm_shapes_measured", "memory_bandwidth_measured",
          "attention_shapes_measured", "op_overhead_measured", "eager_bandwidth_fraction"]

def median_tree(ts):
    if all(isinstance(t, (int, float)) for t in ts):
        return st.median(ts)
    if all(isinstance(t, dict) for t in ts):
        keys = set(ts[0]).intersection(*ts[1:])
        return {**ts[-1], **{k: median_tree([t[k] for t in ts]) for k in keys}}
    return ts[-1]

def merged(names):
    d = copy.deepcopy(H[names[-1]])
    for f in MERGED:
        vals = [H[n][f] for n in names if f in H[n]]
        if vals:
            d[f] = median_tree(vals)
    return d

model = get_preset("small")
def price(hwd, lay):
    per = 16 // lay.dp
    m = 2 * lay.pp if lay.pp > 1 else 1
    kw = dict(dp=lay.dp, tp=lay.tp, pp=lay.pp, zero=lay.zero, micro_batch=max(1, per // m),
              global_batch=16, seq_len=128, dtype="fp32", **({"schedule": "1f1b"} if lay.pp > 1 else {}))
    return estimate(model, ClusterSpec(hardware_from_dict(copy.deepcopy(hwd), "x"), lay.n), ParallelPlan(**kw)).step.total

def measured_rows(key):
    if key in ("27c", "27d", "28"):
        s = json.load(open(DATA / f"epyc2-2026-11-{key}/scaling.json"))
        return [(layout(r["strategy"], r["n"]), r["step_s"]) for r in s["measured"]["speedup"]]
    name = {"s12_0725": "12th-5 (07:26)", "D": "13th bench_D (10:24)", "m14": "14th (13:10)"}[key]
    rows: dict[str, list] = {}
    for r in benches[name]["runs"]:
        rows.setdefault(r["layout"], []).append(r["measured_s"])
    out = []
    for k, v in rows.items():
        n, dp, tp, pp, z = (int(x[2:] if x.startswith(("dp", "tp", "pp")) else x[1:]) for x in k.split("-"))
        out.append((_lay(n, dp, tp, pp, z), st.median(v)))
    return out

def _lay(n, dp, tp, pp, z):
    from ptd.bench.scaling import STRATEGIES
    for s in STRATEGIES:
        lay = layout(s, n)
        if (lay.dp, lay.tp, lay.pp, lay.zero) == (dp, tp, pp, z):
            return lay
    raise KeyError((n, dp, tp, pp, z))

order = [k for k, _ in profiles]
for key in ("27c", "27d", "28", "s12_0725", "D", "m14"):
    hist = order[:order.index(key) + 1]
    seen, res = set(), {"own": [], "history": []}
    for lay, m in measured_rows(key):
        if (lay.n, lay.dp, lay.tp, lay.pp, lay.zero) in seen:
            continue
        seen.add((lay.n, lay.dp, lay.tp, lay.pp, lay.zero))
        res["own"].append((lay.n, m / price(H[key], lay)))
        res["history"].append((lay.n, m / price(merged(hist), lay)))
    txt = []
    for k, v in res.items():
        lv = [x for n, x in v if n == 1][0]
        txt.append(f"{k}: level {lv:.2f}, {sum(abs(x - 1) <= 0.15 for _, x in v)}/{len(v)} within 15%")
    print(f"  {key:9s} ({len(hist):2d} calibrations) " + "; ".join(txt))

"""Re-price the bench rows of scaling.json with a profile's blocking waits as ptd now derives
them and as it did before 2026-11-28 (chunk as timed, all-reduce less its fit), from the
same calibration (its JSON keeps the timed chunk). Usage, from this folder:
  python ablate.py scaling.json calibrated.toml calibrated_second.toml calibrated_second.json
(ptd calibrate --model small --out X.toml writes X.toml and X.json)."""
import json, sys
from ptd.specs import ClusterSpec, ParallelPlan
from ptd.specs.model import load_model
from ptd.specs.hardware import load_hardware
from ptd.cost.estimate import estimate
from ptd.cost.comm import bus_factor
d = json.load(open(sys.argv[1]))
rows = [r for r in d["measured"]["speedup"] if r["n"] > 1 or r["strategy"] == "ddp"]
def old_curve(jpath):
    s = json.load(open(jpath))["summary"]
    fit = next(c for c in s["collectives"] if c["kind"] == "all_reduce" and c["group_size"] == 2)
    base = fit["alpha"] + bus_factor("all_reduce", 2) * 2**20 / fit["bus_bandwidth"]
    return {int(n): tuple(sorted((p[3], max(0.0, p[2] - base)) for p in pts)) for n, pts in s["blocking"].items()}
def plan_of(r):
    kw = dict(seq_len=128, dtype="fp32")
    for tok in r["plan"].split():
        for k, f in (("dp", "dp"), ("tp", "tp"), ("pp", "pp"), ("zero", "zero"), ("mb", "micro_batch"), ("gb", "global_batch")):
            if tok.startswith(k) and tok[len(k):].isdigit(): kw[f] = int(tok[len(k):])
        if tok in ("1f1b", "gpipe", "interleaved"): kw["schedule"] = tok
    return ParallelPlan(**kw)
model = load_model("small")
bench = load_hardware(sys.argv[2])
new = load_hardware(sys.argv[3])
old = new.replace(blocking_wait_measured=old_curve(sys.argv[4]))
print("%-6s %s %8s %8s %8s %8s %6s %6s" % ("strat", "N", "meas", "bench", "new", "old", "m/new", "m/old"))
for r in rows:
    p = plan_of(r)
    f = lambda hw: estimate(model, ClusterSpec(hw, p.world_size), p).step.total
    b, n_, o = f(bench), f(new), f(old)
    print("%-6s %d %8.0f %8.0f %8.0f %8.0f %6.2f %6.2f" % (r["strategy"], r["n"], r["step_s"]*1e3, b*1e3, n_*1e3, o*1e3, r["step_s"]/n_, r["step_s"]/o))

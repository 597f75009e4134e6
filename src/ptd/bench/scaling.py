"""``ptd bench scaling``: the scaling tables of the tutorials, measured on this machine and
predicted by the cost model beside them, then predicted at cluster scale.

**Measured.** One model and one global batch (strong scaling); each strategy at each worker
count is one real ``ptd train`` run (the launcher, torchrun, gloo) of a few steps; its
``summary.json`` gives the measured step time (clean steps), the breakdown of a profiled
step, model states counted from the tensors and the activation peak -- each with the cost
model's prediction for the same plan. N = 1 is the same single process for every strategy.

* speedup ``S(N) = T(1) / T(N)`` and efficiency ``S/N``, measured and predicted;
* Amdahl's parallel fraction ``P`` fitted per strategy over its worker counts
  (:func:`ptd.cost.metrics.fit_parallel_fraction`), measured and predicted;
* memory per device by ZeRO stage (and for every strategy): parameters, gradients,
  optimizer states and activation peak, measured and predicted;
* the step-time breakdown per strategy at the largest worker count.

**Cluster scale** (``--cluster-*``): the same strategies for a large model on N of a GPU
preset (8 ... 1024), from the cost model alone (:func:`ptd.cost.estimate.choose` picks the
micro-batch; tp = 8 and pp = 4 where a strategy uses them).

Strategies: ``ddp`` (dp = N), ``zero1``/``zero2``/``zero3``, ``tp`` (tp = N), ``pp`` (pp = N,
1F1B, 2N micro-batches), ``3d`` (every dimension that fits: N = 2: dp 2; N = 4: tp 2 x pp 2;
N = 8: dp 2 x tp 2 x pp 2).
"""

from __future__ import annotations

import csv
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ..cost import metrics as M
from ..errors import PtdError
from ..fmt import duration, gib, pct, table
from ..trainrun import train_subprocess

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "tp", "pp", "3d")


@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int
    pp: int
    zero: int

    @property
    def n(self) -> int:
        return self.dp * self.tp * self.pp


def layout(strategy: str, n: int) -> Layout:
    if n == 1:
        return Layout(1, 1, 1, 0)
    if strategy == "ddp":
        return Layout(n, 1, 1, 0)
    if strategy.startswith("zero"):
        return Layout(n, 1, 1, int(strategy[-1]))
    if strategy == "tp":
        return Layout(1, n, 1, 0)
    if strategy == "pp":
        return Layout(1, 1, n, 0)
    if strategy == "3d":
        return {2: Layout(2, 1, 1, 0), 4: Layout(1, 2, 2, 0), 8: Layout(2, 2, 2, 0)}.get(
            n, Layout(n, 1, 1, 0))
    raise PtdError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")


def micro_batch(lay: Layout, global_batch: int) -> int:
    """A run's micro-batch: the replica's batch whole, or in 2 x pp pieces under a pipeline."""
    m = 2 * lay.pp if lay.pp > 1 else 1
    return max(1, global_batch // lay.dp // m)


def train_flags(lay: Layout, global_batch: int) -> list[str]:
    flags = ["--nproc", str(lay.n), "--dp", str(lay.dp), "--tp", str(lay.tp), "--pp", str(lay.pp),
             "--zero", str(lay.zero), "--micro-batch", str(micro_batch(lay, global_batch))]
    if lay.pp > 1:
        flags += ["--schedule", "1f1b"]
    return flags


def _speedups(t: dict[int, float]) -> dict[int, float]:
    t1 = t.get(1)
    return {n: (t1 / v if t1 and v else float("nan")) for n, v in t.items()}


def amdahl_fit(s: dict[Any, float]) -> tuple[float | None, str | None]:
    """(P, None) when Amdahl's law describes the speedups ``s`` (N -> S), else (None, why):
    a fit needs two points beyond N = 1, and a P outside [0, 1] (superlinear or slower
    with more workers) means the law does not apply, whatever the least squares say."""
    ns = [n for n in sorted(s) if n > 1 and math.isfinite(s[n]) and s[n] > 0]
    if len(ns) < 2:
        return None, f"n/a: {len(ns)} measured point(s) beyond N = 1; the fit needs 2"
    p = M.fit_parallel_fraction(ns, [s[n] for n in ns])
    if not (math.isfinite(p) and 0 <= p <= 1):
        return None, (f"n/a: the fitted P = {p:.2f} is outside [0, 1]; Amdahl's law does "
                      "not describe these speedups")
    return p, None


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of the median measured step time (the lower middle of an even count); a
    failed run stands for the row if any failed (a partial benchmark is not a result)."""
    for r in runs:
        if "error" in r:
            return r
    ranked = sorted(runs, key=lambda r: r["measured"]["step_time_s"])
    return ranked[(len(ranked) - 1) // 2]


def measure(out: Path, *, model: str, seq_len: int, global_batch: int, steps: int,
            workers: list[int], strategies: list[str], hardware: str | None,
            run_timeout: float, rounds: int = 1, log: Any = print) -> dict[str, Any]:
    """Every (strategy, N) run of ``model``, ``rounds`` times over the whole grid (round
    after round, so that a slow spell of a shared machine lands in one round of every row,
    not in every round of one); returns the raw rows, each standing for its median run."""
    common = ["--model", model, "--seq-len", str(seq_len), "--global-batch",
              str(global_batch), "--steps", str(steps), "--warmup", "1",
              "--profile-steps", "1", "--memory-step", "2", "--timeout", "120"]
    if hardware:
        common += ["--hardware", hardware]
    done: dict[tuple, list[dict]] = {}
    # the CPU other processes took during each run (runtime/calibrate/quiet.py): a row that
    # shared the machine with other work reads slow for a reason the cost model cannot see
    from ..runtime.calibrate.quiet import OtherLoad
    watch = OtherLoad()
    for rnd in range(1, rounds + 1):
        for n in workers:
            for strat in strategies:
                lay = layout(strat, n)
                key = (lay.dp, lay.tp, lay.pp, lay.zero)
                if len(done.get(key, [])) == rnd:
                    continue  # the same layout under another strategy's name
                name = f"n{n}-dp{lay.dp}-tp{lay.tp}-pp{lay.pp}-z{lay.zero}"
                if rounds > 1:
                    name += f"-r{rnd}"
                t0 = time.perf_counter()
                watch.mark(name)
                s = train_subprocess(out / "runs" / name,
                                     [*common, *train_flags(lay, global_batch)], run_timeout)
                watch.stop()
                done.setdefault(key, []).append(s)
                msg = s.get("error") or f"{s['measured']['step_time_s'] * 1e3:.0f} ms/step"
                log(f"ptd bench: {name}: {msg} ({time.perf_counter() - t0:.0f} s)")
    rows: list[dict[str, Any]] = []
    for n in workers:
        for strat in strategies:
            lay = layout(strat, n)
            key = (lay.dp, lay.tp, lay.pp, lay.zero)
            runs = done[key]
            row = {"strategy": strat, "n": n, "layout": key, "summary": median_run(runs)}
            if rounds > 1:
                row["rounds"] = [None if "error" in r else
                                 [r["measured"]["step_time_s"], r["predicted"]["step_time_s"]]
                                 for r in runs]
            rows.append(row)
    # each run's own interval (the samples between two runs span only the bench's bookkeeping)
    other = [{"run": st["stage"], "seconds": st["seconds"], "cores": st["cores"]}
             for st in watch.stages() if st["stage"]]
    return {"rows": rows, "other_load": other}


def tables(data: dict[str, Any], strategies: Iterable[str], workers: list[int]) -> dict[str, Any]:
    """Speedup/efficiency/Amdahl and memory tables from the raw rows."""
    res: dict[str, Any] = {"speedup": [], "amdahl": [], "memory": [], "breakdown": []}
    by = {(r["strategy"], r["n"]): r["summary"] for r in data["rows"]}
    rounds = {(r["strategy"], r["n"]): r["rounds"] for r in data["rows"] if "rounds" in r}
    for strat in strategies:
        tm, tp_ = {}, {}
        for n in workers:
            s = by.get((strat, n))
            if not s or "error" in s:
                continue
            tm[n] = s["measured"]["step_time_s"]
            tp_[n] = s["predicted"]["step_time_s"]
        sm, sp = _speedups(tm), _speedups(tp_)
        for n in sorted(tm):
            s = by[(strat, n)]
            mem_m, mem_p = s["measured"].get("memory", {}), s["predicted"].get("memory", {})
            res["speedup"].append({
                "strategy": strat, "n": n, "plan": s.get("plan_desc", ""),
                "step_s": tm[n], "step_s_pred": tp_[n],
                "speedup": sm[n], "speedup_pred": sp[n],
                "efficiency": sm[n] / n, "efficiency_pred": sp[n] / n,
                "tokens_per_s": s["measured"]["tokens_per_s"],
                "tokens_per_s_pred": s["predicted"]["tokens_per_s"],
                "mfu": s["measured"]["mfu"], "mfu_pred": s["predicted"]["mfu"]})
            if (strat, n) in rounds:  # measured / predicted step of every round
                res["speedup"][-1]["ratio_rounds"] = [None if r is None else r[0] / r[1]
                                                      for r in rounds[(strat, n)]]
            res["memory"].append({
                "strategy": strat, "n": n, "plan": s.get("plan_desc", ""),
                **{f"{k}": mem_m.get(k) for k in ("params", "grads", "optimizer", "activations")},
                **{f"{k}_pred": mem_p.get(k) for k in ("params", "grads", "optimizer", "activations")},
                "states_exact": mem_m.get("model_states_equal_per_rank")})
            bm = s["measured"].get("breakdown")
            if bm:
                res["breakdown"].append({"strategy": strat, "n": n, "measured": bm,
                                         "predicted": s["predicted"]["breakdown"],
                                         "step_s": s["measured"].get("profiled_step_time_s")})
        (pm, why), (pp_, why_pred) = amdahl_fit(sm), amdahl_fit(sp)
        res["amdahl"].append({"strategy": strat, "P": pm, "P_pred": pp_, "P_why": why,
                              "P_pred_why": why_pred})
    res["agreement"] = agreement(data["rows"])
    return res


TOLERANCE = 0.15
"""How far a row's measured step may be from its prediction and count as agreeing (the
criterion of the cost model's issue on this machine: every row within 15%)."""


def agreement(rows: list[dict[str, Any]], tol: float = TOLERANCE) -> dict[str, Any] | None:
    """How many of the grid's layouts (each counted once: one worker is every strategy's
    first row) ran within ``tol`` of their predicted step; and, divided by the one-worker
    row's measured / predicted step (the *level*: how fast the machine ran against the
    calibration the prediction used), how many then do (the *shape*: whether the cost model
    orders and spaces the layouts right, whatever the machine's speed at the moment). A row
    divided by the level is its predicted speedup over its measured speedup. ``None``
    without a one-worker row or any other."""
    ratio: dict[tuple, float] = {}
    for r in rows:
        s = r["summary"]
        if "error" not in s:
            ratio[(r["n"], *r["layout"])] = s["measured"]["step_time_s"] / s["predicted"]["step_time_s"]
    level = ratio.get((1, 1, 1, 1, 0))
    if level is None or len(ratio) < 2:
        return None
    shape = {k: v / level for k, v in ratio.items()}
    def within(d: dict) -> int:
        return sum(abs(v - 1) <= tol for v in d.values())
    return {"tolerance": tol, "layouts": len(ratio), "within": within(ratio), "level": level,
            "within_after_level": within(shape),
            "worst": max(ratio.items(), key=lambda kv: abs(kv[1] - 1))[1],
            "worst_after_level": max(shape.items(), key=lambda kv: abs(kv[1] - 1))[1]}


# ------------------------------------------------------------------ cluster
def cluster_tables(model_name: str, hw_name: str, sizes: list[int], seq_len: int,
                   global_batch: int, strategies: Iterable[str]) -> dict[str, Any]:
    """Predicted scaling at cluster scale (cost model only)."""
    from ..cost.estimate import choose
    from ..specs import ClusterSpec, ParallelPlan, load_hardware, load_model
    model, hw = load_model(model_name), load_hardware(hw_name)
    rows, mem = [], []
    base_t: dict[str, float] = {}
    for strat in strategies:
        for n in sizes:
            if strat == "ddp":
                lay = Layout(n, 1, 1, 0)
            elif strat.startswith("zero"):
                lay = Layout(n, 1, 1, int(strat[-1]))
            elif strat == "tp":
                lay = Layout(n // 8, 8, 1, 1)
            elif strat == "pp":
                lay = Layout(n // 4, 1, 4, 1)
            else:  # 3d
                lay = Layout(max(1, n // 32), 8, 4, 1) if n >= 32 else Layout(1, 8, 1, 1)
            if lay.n != n or global_batch % lay.dp:
                continue
            plan = ParallelPlan(dp=lay.dp, tp=lay.tp, pp=lay.pp, zero=lay.zero,
                                global_batch=global_batch, seq_len=seq_len, dtype="bf16",
                                sp=lay.tp > 1, recompute="full")
            try:
                e = choose(model, ClusterSpec(hw, n), plan, ["micro_batch"])
            except PtdError:
                continue
            t = e.step.total
            base_t.setdefault(strat, t * n)  # work at the smallest size, in device-seconds
            s = base_t[strat] / t  # speedup over one device's share at the smallest size
            rows.append({"strategy": strat, "n": n, "plan": e.plan.describe(), "step_s": t,
                         "speedup": s, "efficiency": s / n, "mfu": e.mfu,
                         "tokens_per_s": e.tokens_per_s, "fits": e.memory.fits})
            mem.append({"strategy": strat, "n": n, "params": e.memory.params,
                        "grads": e.memory.grads, "optimizer": e.memory.optimizer,
                        "activations": e.memory.activations, "total": e.memory.total,
                        "fits": e.memory.fits})
    amdahl = []
    for strat in strategies:
        pts = [(r["n"], r["speedup"]) for r in rows if r["strategy"] == strat]
        if len(pts) >= 2:
            n0 = pts[0][0]
            # relative to the smallest size: S'(k) = S(n)/S(n0) over k = n/n0 units
            ks = [n / n0 for n, _ in pts]
            ss = [s / pts[0][1] for _, s in pts]
            p, why = amdahl_fit(dict(zip(ks, ss)))
            amdahl.append({"strategy": strat, "P": p, "P_why": why})
    from .ps_table import ps_crossover  # parameter server vs all-reduce
    from .tp_table import tp_modes_table  # 1D/2D/2.5D/3D tensor parallelism
    node = ClusterSpec(hw, max(sizes)).devices_per_node
    ps = ps_crossover(model, hw, sizes, node)
    return {"model": model_name, "hardware": hw_name, "seq_len": seq_len,
            "global_batch": global_batch, "speedup": rows, "memory": mem, "amdahl": amdahl,
            "ps": ps, "tp_modes": tp_modes_table(model, hw, seq_len, node)}


# ------------------------------------------------------------------ output
def render(res: dict[str, Any], cl: dict[str, Any] | None) -> str:
    def f2(x: Any) -> str:
        return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.2f}"
    lines = ["speedup and efficiency (strong scaling, fixed global batch), measured | predicted"]
    rows = [(r["strategy"], r["n"], r["plan"], duration(r["step_s"]), duration(r["step_s_pred"]),
             f2(r["speedup"]), f2(r["speedup_pred"]), pct(r["efficiency"]), pct(r["efficiency_pred"]),
             pct(r["mfu"]), pct(r["mfu_pred"]))
            for r in res["speedup"]]
    lines.append(table(rows, header=("strategy", "N", "plan", "step", "pred", "speedup", "pred",
                                     "efficiency", "pred", "MFU", "pred"), align="lrlrrrrrrrr"))
    ag = res.get("agreement")
    if ag:
        tol = f"{ag['tolerance']:.0%}"
        lines += ["", f"step time measured / predicted: {ag['within']} of {ag['layouts']} layouts "
                  f"within {tol} (worst {f2(ag['worst'])}); one worker {f2(ag['level'])}, how fast "
                  "the machine ran against its calibration;",
                  f"each row divided by that (its predicted over its measured speedup): "
                  f"{ag['within_after_level']} of {ag['layouts']} within {tol} (worst "
                  f"{f2(ag['worst_after_level'])}), how well the cost model spaces the layouts"]
    per_round = [r for r in res["speedup"] if r.get("ratio_rounds")]
    if per_round:
        k = len(per_round[0]["ratio_rounds"])
        lines += ["", f"step time measured / predicted in each of {k} rounds (the row above is "
                      "its median round)"]
        lines.append(table([(r["strategy"], r["n"], *(f2(x) for x in r["ratio_rounds"]),
                             f2(r["step_s"] / r["step_s_pred"])) for r in per_round],
                           header=("strategy", "N", *(f"round {i}" for i in range(1, k + 1)),
                                   "median"), align="lr" + "r" * (k + 1)))
    lines += ["", "Amdahl's parallel fraction P (fitted over N), measured | predicted"]
    lines.append(table([(a["strategy"], f2(a["P"]), f2(a["P_pred"])) for a in res["amdahl"]],
                       header=("strategy", "P", "pred"), align="lrr"))
    lines += [f"  {a['strategy']}: {'measured' if k == 'P_why' else 'predicted'} P {a[k]}"
              for a in res["amdahl"] for k in ("P_why", "P_pred_why") if a.get(k)]
    lines += ["", "memory per device (max rank), measured | predicted"]
    mrows = []
    for r in res["memory"]:
        mrows.append((r["strategy"], r["n"], *(f"{gib(r[k] or 0)} | {gib(r[k + '_pred'] or 0)}"
                                              for k in ("params", "grads", "optimizer", "activations")),
                      "yes" if r["states_exact"] else "NO"))
    lines.append(table(mrows, header=("strategy", "N", "params", "grads", "optimizer", "activations",
                                      "states exact"), align="lrrrrrl"))
    if cl:
        lines += ["", f"predicted at cluster scale: {cl['model']} on {cl['hardware']}, "
                  f"global batch {cl['global_batch']} x {cl['seq_len']}, bf16, full recompute"]
        lines.append(table([(r["strategy"], r["n"], r["plan"], duration(r["step_s"]), f2(r["speedup"]),
                             pct(r["efficiency"]), pct(r["mfu"]), "yes" if r["fits"] else "NO")
                            for r in cl["speedup"]],
                           header=("strategy", "N", "plan", "step", "speedup", "efficiency", "MFU",
                                   "fits"), align="lrlrrrrl"))
        lines.append("(speedup: over the smallest size, counted as that many devices' worth of "
                     "perfectly shared work)")
        lines += ["", f"memory per device at cluster scale (predicted): {cl['model']}, "
                      "by data-parallel flavour"]
        lines.append(table([(r["strategy"], r["n"], gib(r["params"]), gib(r["grads"]), gib(r["optimizer"]),
                             gib(r["activations"]), gib(r["total"])) for r in cl["memory"]
                            if r["strategy"].startswith(("ddp", "zero"))],
                           header=("strategy", "N", "params", "grads", "optimizer", "activations",
                                   "total"), align="lrrrrrr"))
        lines.append("")
        lines.append(table([(a["strategy"], f2(a["P"])) for a in cl["amdahl"]],
                           header=("strategy", "Amdahl P (cluster, predicted)"), align="lr"))
        if cl.get("ps"):
            from .ps_table import render_ps
            lines += ["", render_ps(cl)]
        if cl.get("tp_modes"):
            from .tp_table import render_tp
            lines += ["", render_tp(cl)]
    return "\n".join(lines)


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    keys = list(rows[0])
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in r.items()})

"""``ptd plan --try K``: run the planner's candidates on this host and rank them by what
they measured -- the check that the cost model's ranking holds on the machine it describes.

Candidates are the top ``K`` plans and, for every other ``dp x tp x pp`` layout with a plan
that fits, that layout's best plan (``per_layout``): the plans within one layout differ by a
few percent in prediction, the layouts by much more, so they are where a wrong ranking would
show. Each candidate is exported with :func:`ptd.planner.export.export` (``fmt="ptd"``) and run
as a real ``ptd train`` (the same launcher, backend and data as any run) for a few steps with
the profiler and the memory tracker off; its measured tokens/s is ``summary.json``'s
``measured.tokens_per_s`` (the mean over the steps after the first).

Noise on a shared machine is handled the usual way for benchmarks: the repeats are
*interleaved* (round ``r`` runs every candidate once before round ``r + 1`` starts, so a slow
minute hurts all of them alike) and each candidate keeps its best repeat (like ``timeit``'s
minimum: interference only ever slows a run down).

The verdict: the planner's top plan's measured throughput over the best measured one, and
whether it is within ``tolerance`` (default 10%); plus Spearman's rank correlation
between predicted and measured throughput over all candidates.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..cost.estimate import CostOptions, Estimate
from ..fmt import pct, si, table
from .export import export
from .search import SearchResult


@dataclass
class Candidate:
    """One plan to try: its place in the planner's ranking and what its runs measured."""

    rank: int
    """1-based position in the planner's ranking (1 = the planner's choice)."""
    estimate: Estimate
    why: str
    """Why it is tried: ``top K`` or ``best dpX tpY ppZ``."""
    measured: list[float] = field(default_factory=list)
    """tokens/s of each successful repeat, in round order."""
    errors: list[str] = field(default_factory=list)
    """The last line of each failed repeat's output."""

    @property
    def best(self) -> float | None:
        return max(self.measured) if self.measured else None

    @property
    def label(self) -> str:
        p = self.estimate.plan
        return p.describe().replace(f" gb{p.global_batch}", "")


def candidates(res: SearchResult, top: int, per_layout: bool = True) -> list[Candidate]:
    """The top ``top`` plans, then the best plan of each other layout, in ranking order."""
    out = [Candidate(i + 1, e, f"top {top}") for i, e in enumerate(res.top(top))]
    if per_layout:
        seen = {(c.estimate.plan.dp, c.estimate.plan.tp, c.estimate.plan.pp) for c in out}
        for i, e in enumerate(res.ranked):
            key = (e.plan.dp, e.plan.tp, e.plan.pp)
            if key not in seen:
                seen.add(key)
                out.append(Candidate(i + 1, e, f"best dp{key[0]} tp{key[1]} pp{key[2]}"))
    return sorted(out, key=lambda c: c.rank)


def run_all(cands: list[Candidate], out: Path, *, hardware: str, steps: int, repeats: int,
            timeout: float, options: CostOptions = CostOptions(),
            log: Callable[[str], Any] = print) -> float:
    """Export and run every candidate ``repeats`` times, interleaved; returns the wall time."""
    from ..trainrun import train_subprocess
    t_start = time.perf_counter()
    (out / "plans").mkdir(parents=True, exist_ok=True)
    paths = []
    for c in cands:
        path = out / "plans" / f"plan{c.rank:04d}.toml"
        path.write_text(export(c.estimate, "ptd", hardware=hardware, steps=steps, options=options))
        paths.append(path)
    # the profiler and the memory tracker would slow some steps down: leave them off
    common = ["--profile-steps", "0", "--memory-step", "0"]
    total, done = len(cands) * repeats, 0
    for r in range(repeats):
        for c, path in zip(cands, paths):
            run_dir = out / "runs" / f"plan{c.rank:04d}-r{r + 1}"
            t0 = time.perf_counter()
            s = train_subprocess(run_dir, ["--config", str(path), *common], timeout)
            done += 1
            if "error" in s:
                c.errors.append(s["error"])
                msg = f"failed: {s['error']}"
            else:
                c.measured.append(float(s["measured"]["tokens_per_s"]))
                msg = f"{si(c.measured[-1])} tokens/s"
            log(f"ptd plan --try: [{done}/{total}] #{c.rank} {c.label}: {msg} "
                f"({time.perf_counter() - t0:.0f} s)")
    return time.perf_counter() - t_start


def spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None for fewer than 3 points."""
    if len(x) < 3:
        return None

    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return r

    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx = sum((a - mx) ** 2 for a in rx) ** 0.5
    vy = sum((b - my) ** 2 for b in ry) ** 0.5
    return cov / (vx * vy) if vx and vy else None


def verdict(cands: list[Candidate], tolerance: float) -> dict[str, Any]:
    """The planner's top plan against the best measured one."""
    ok = [c for c in cands if c.best is not None]
    top = min(cands, key=lambda c: c.rank) if cands else None
    if not ok or top is None or top.best is None:
        return {"top_rank": top.rank if top else None, "top_tokens_per_s": None,
                "best_rank": None, "best_tokens_per_s": None, "top_over_best": None,
                "tolerance": tolerance, "within_tolerance": False, "rounds_overlap": None,
                "spearman": None}
    best = max(ok, key=lambda c: c.best or 0.0)
    ratio = top.best / best.best  # type: ignore[operator]
    rho = spearman([c.estimate.tokens_per_s for c in ok], [c.best for c in ok])  # type: ignore[misc]
    # Whether the gap could be this machine's noise: with two rounds or more each, the top
    # plan's fastest round reaching the best plan's slowest one (None when either ran once,
    # or the top plan is the best)
    overlap = (max(top.measured) >= min(best.measured)
               if best is not top and len(top.measured) > 1 and len(best.measured) > 1 else None)
    return {"top_rank": top.rank, "top_tokens_per_s": top.best, "best_rank": best.rank,
            "best_tokens_per_s": best.best, "top_over_best": ratio, "tolerance": tolerance,
            "within_tolerance": ratio >= 1 - tolerance, "rounds_overlap": overlap,
            "spearman": rho}


def render(cands: list[Candidate], v: dict[str, Any], repeats: int, wall_s: float) -> str:
    ok = sorted((c for c in cands if c.best is not None), key=lambda c: -(c.best or 0.0))
    mrank = {id(c): i + 1 for i, c in enumerate(ok)}
    rows = []
    for c in cands:
        e = c.estimate
        if c.best is None:
            rows.append((c.rank, c.label, si(e.tokens_per_s), "failed: " + c.errors[-1][:50],
                         "", "", "", c.why))
            continue
        spread = (max(c.measured) - min(c.measured)) / max(c.measured)
        rows.append((c.rank, c.label, si(e.tokens_per_s), si(c.best), pct(spread, 0),
                     mrank[id(c)], f"{c.best / e.tokens_per_s:.2f}", c.why))
    lines = [f"tried {len(cands)} plans x {repeats} interleaved repeat{'s' if repeats > 1 else ''} "
             f"on this host in {wall_s:.0f} s (measured: best repeat; spread: (max-min)/max)",
             table(rows, header=("#", "plan", "predicted tok/s", "measured tok/s", "spread",
                                 "measured rank", "measured/predicted", "tried as"),
                   align="rlrrrrrl")]
    if v["top_over_best"] is None:
        lines.append(f"verdict: the planner's plan #{v['top_rank']} has no measurement")
        return "\n".join(lines)
    gap = 1 - v["top_over_best"]
    where = ("it is the best measured" if v["best_rank"] == v["top_rank"] else
             f"the best measured is #{v['best_rank']} at {si(v['best_tokens_per_s'])} tokens/s, "
             f"#{v['top_rank']} {pct(gap)} below it")
    noise = {True: " (their rounds overlap: a gap this machine's noise can make)",
             False: " (every round of the best is faster than every round of the top plan)",
             None: ""}[v.get("rounds_overlap")]
    lines.append(f"verdict: plan #{v['top_rank']} measured {si(v['top_tokens_per_s'])} tokens/s; "
                 f"{where}: {'within' if v['within_tolerance'] else 'NOT within'} "
                 f"{pct(v['tolerance'], 0)}{noise}")
    if v["spearman"] is not None:
        lines.append(f"rank correlation of predicted and measured tokens/s (Spearman): "
                     f"{v['spearman']:.2f}")
    return "\n".join(lines)


def to_json(cands: list[Candidate], v: dict[str, Any], repeats: int, wall_s: float) -> dict:
    return {"repeats": repeats, "wall_s": wall_s, "verdict": v,
            "candidates": [{"rank": c.rank, "plan": c.estimate.plan.to_dict(),
                            "describe": c.estimate.plan.describe(), "why": c.why,
                            "predicted_tokens_per_s": c.estimate.tokens_per_s,
                            "measured_tokens_per_s": c.measured, "best_tokens_per_s": c.best,
                            "errors": c.errors} for c in cands]}

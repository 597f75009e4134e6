"""Tensor-parallel modes in the planner (``ptd plan --tp-modes``): the ranked plans (1D, as
ptd trains them) re-priced with their tensor parallelism as 2D, 2.5D or 3D
(:func:`ptd.bench.tp_table.mode_delta`), the best plan of each mode, and why the fastest
wins. Priced only: the runtime trains 1D, so these never enter the ranking itself."""

from __future__ import annotations

from typing import Any

from ..bench.tp_table import mode_delta
from ..errors import PtdError


def best_by_mode(model: Any, ranked: list[Any], modes: list[str], depth: int = 2,
                 limit: int = 2000) -> dict[str, dict[str, Any]]:
    """For each of ``modes``, the plan among the first ``limit`` of ``ranked`` (1D plans, as
    the planner ranks what ptd trains) whose step time is least when its tensor parallelism
    is priced as that mode (:func:`mode_delta`; 1d: the plan as ranked). Modes whose shapes
    no ranked plan's tp allows are absent."""
    best: dict[str, dict[str, Any]] = {}
    for e in ranked[:limit]:
        for mode in modes:
            if mode == "1d":
                cand = {"mode": "1d", "step_time_s": e.step.total, "estimate": e}
            elif e.plan.tp < 2:
                continue
            else:
                try:
                    cand = mode_delta(model, e, mode, depth if mode == "2.5d" else 1) | {"estimate": e}
                except PtdError:
                    continue  # tp is not a square / q^2 d / cube
            cur = best.get(mode)
            if cur is None or cand["step_time_s"] < cur["step_time_s"]:
                best[mode] = cand
    return best


def explain_modes(best: dict[str, dict[str, Any]]) -> list[str]:
    """Why the fastest mode wins, in a line per other mode."""
    from ..fmt import duration
    if not best:
        return []
    win = min(best, key=lambda k: best[k]["step_time_s"])
    w = best[win]
    lines = [f"{win} wins: {duration(w['step_time_s'])} per step with "
             f"{w['estimate'].plan.describe()}"]
    for mode, d in sorted(best.items(), key=lambda kv: kv[1]["step_time_s"]):
        if mode == win:
            continue
        why = ""
        if mode != "1d" and "tp_comm_s" in d:
            why = (f": its tensor-parallel communication {duration(d['tp_comm_s'])} against "
                   f"{duration(d['tp_comm_1d_s'])} in 1d for the same plan")
        lines.append(f"  {mode}: {duration(d['step_time_s'])} "
                     f"(+{d['step_time_s'] / w['step_time_s'] - 1:.0%}) with "
                     f"{d['estimate'].plan.describe()}{why}")
    return lines

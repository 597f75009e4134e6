"""Why the winner has each of its values: what the alternatives would cost.

For every dimension (dp, tp, pp, ZeRO stage, sequence parallelism, pipeline schedule with its
virtual stages, micro-batch, recomputation) and every other value the search met:

* ``best``: the best plan that fits with that value, everything else chosen again -- what
  choosing that value really costs;
* ``alone``: the winner with only that value changed (for tp and pp, dp absorbs the change
  so that dp*tp*pp stays the device count; none for dp itself) -- the local sensitivity;
* ``reason``: when no plan with that value fits, why (the most common rejection, or the
  least memory any such plan needs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..cost.estimate import Estimate, estimate
from ..errors import PtdError
from .search import DIMENSIONS, NO_FIT, SearchResult, dimension_values, objective_key


@dataclass
class Alternative:
    value: Any
    best: Estimate | None = None
    reason: str | None = None
    """Why no plan with this value is ranked (None when ``best`` is set)."""
    least_memory: float | None = None
    """Least memory per device of any priced plan with this value."""
    alone: Estimate | None = None
    alone_reason: str | None = None


@dataclass
class Dimension:
    name: str
    value: Any
    alternatives: list[Alternative] = field(default_factory=list)


def explain(result: SearchResult) -> list[Dimension]:
    """One :class:`Dimension` per entry of :data:`DIMENSIONS`, alternatives best first."""
    win = result.best
    values = dimension_values(win.plan)
    out = []
    for dim in DIMENSIONS:
        seen = {v for (d, v) in list(result.best_by) + list(result.reasons_by) if d == dim}
        seen.discard(values[dim])
        alts = []
        for v in seen:
            a = Alternative(v, best=result.best_by.get((dim, v)),
                            least_memory=result.least_memory_by.get((dim, v)))
            if a.best is None:
                reasons = result.reasons_by.get((dim, v))
                a.reason = reasons.most_common(1)[0][0] if reasons else "not in the search space"
            a.alone, a.alone_reason = _alone(result, dim, v)
            alts.append(a)
        alts.sort(key=lambda a: (0, objective_key(result.objective, a.best)) if a.best
                  else (1, a.least_memory if a.least_memory is not None else float("inf"), str(a.value)))
        out.append(Dimension(dim, values[dim], alts))
    return out


def _alone(result: SearchResult, dim: str, value: Any) -> tuple[Estimate | None, str | None]:
    """The winner with only ``dim`` set to ``value``, priced, or why it cannot run."""
    win = result.best
    p = win.plan
    n = result.cluster.n_devices
    if dim == "dp":
        return None, None
    if dim in ("tp", "pp"):
        other = p.pp if dim == "tp" else p.tp
        if n % (value * other):
            return None, f"{n} devices are not divisible by tp*pp"
        changes: dict[str, Any] = {dim: value, "dp": n // (value * other)}
        if dim == "pp" and value == 1:
            changes.update(vpp=1, schedule="1f1b")
        elif dim == "pp" and p.pp == 1:
            changes.update(schedule="1f1b")
        if dim == "tp" and value == 1:
            changes["sp"] = False
    elif dim == "schedule":
        if p.pp == 1:
            return None, "no pipeline (pp 1)"
        changes = _schedule_fields(value)
        if changes is None:
            return None, None
    else:
        changes = {dim: value}
    try:
        plan = p.replace(**changes)
        stages = plan.n_stages
        plan = plan.replace(uneven_stages=result.model.n_layers % stages != 0
                            and result.fixed.get("uneven_stages", True))
        e = estimate(result.model, result.cluster, plan, result.tokens, result.options)
    except PtdError as err:
        return None, str(err)
    if not e.memory.fits:
        return e, NO_FIT
    return e, None


def _schedule_fields(label: str) -> dict[str, Any] | None:
    if label == "none":
        return None
    if label.startswith("interleaved-1f1b vpp"):
        return {"schedule": "interleaved-1f1b", "vpp": int(label.rsplit("vpp", 1)[1])}
    if label == "zero-bubble ZB-V":
        return {"schedule": "zero-bubble", "vpp": 1}
    if label.startswith("zero-bubble vpp"):
        return {"schedule": "zero-bubble", "vpp": int(label.rsplit("vpp", 1)[1])}
    return {"schedule": label, "vpp": 1}


def delta(e: Estimate, win: Estimate) -> dict[str, float]:
    """Relative step time and absolute memory of ``e`` against the winner."""
    return {"step_time": e.step.total / win.step.total - 1.0,
            "memory_bytes": e.memory.total - win.memory.total}


def to_json(dims: list[Dimension], win: Estimate) -> list[dict[str, Any]]:
    def one(e: Estimate | None) -> dict[str, Any] | None:
        if e is None:
            return None
        return {"plan": e.plan.describe(), "step_time_s": e.step.total,
                "memory_bytes": e.memory.total, "fits": e.memory.fits, **{f"delta_{k}": v for k, v in delta(e, win).items()}}

    return [{"dimension": d.name, "value": d.value,
             "alternatives": [{"value": a.value, "best": one(a.best), "reason": a.reason,
                               "least_memory_bytes": a.least_memory, "alone": one(a.alone),
                               "alone_reason": a.alone_reason} for a in d.alternatives]}
            for d in dims]


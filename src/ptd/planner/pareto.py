"""The memory-versus-time Pareto front: plans no other plan beats on both."""

from __future__ import annotations

from typing import Iterable, Sequence

from ..cost.estimate import Estimate


def pareto_front(estimates: Iterable[Estimate]) -> list[Estimate]:
    """Plans not dominated in (memory per device, step time), by increasing memory (and so
    decreasing step time). Of plans with equal memory and time only the first is kept."""
    front: list[Estimate] = []
    best = float("inf")
    for e in sorted(estimates, key=lambda e: (e.memory.total, e.step.total)):
        if e.step.total < best:
            front.append(e)
            best = e.step.total
    return front


def thin(front: Sequence[Estimate], k: int) -> list[Estimate]:
    """At most ``k`` points of ``front``, evenly spread, both ends kept."""
    if k <= 0:
        return []
    if len(front) <= k:
        return list(front)
    if k == 1:
        return [front[-1]]
    idx = sorted({round(i * (len(front) - 1) / (k - 1)) for i in range(k)})
    return [front[i] for i in idx]

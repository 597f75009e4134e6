"""The schema of a run's ``summary.json``, typed: what ``ptd train`` writes and what
``ptd report``, ``ptd bench`` and the planner's trials read.

Rates are per step time (``measured`` from the run's clean steps, ``predicted`` from the cost
model for the same plan and hardware); ``ratio`` is measured over predicted (null where either
is missing or zero). A run stopped before it measured anything has no ``measured``,
``predicted`` or ``ratio``. :func:`problems` lists what a summary lacks or has of the wrong
type, so a reader can say so in one line instead of failing on a missing key.
"""

from __future__ import annotations

from typing import Any, TypedDict


class Rates(TypedDict):
    """One step time and what follows from it, for the whole job and per device."""

    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_device: float
    samples_per_s: float
    samples_per_s_per_device: float
    tflops_per_device: float
    """Model FLOP/s per device (PaLM's convention, :mod:`ptd.cost.flops`), in 10^12."""
    hardware_tflops_per_device: float
    """Hardware FLOP/s per device (recomputation counted), in 10^12."""
    mfu: float
    hfu: float


class Memory(TypedDict, total=False):
    """Bytes on the most loaded device (model states exact; activations as measured)."""

    params: int
    grads: int
    optimizer: int
    model_states: int
    activations: float
    optimizer_step_counters: int
    model_states_equal_per_rank: bool
    """Measured only: every rank's parameters, gradients and optimizer states equal their
    prediction to the byte."""


class Summary(TypedDict, total=False):
    """``summary.json``. Always present: ``status``, ``steps``, ``plan``, ``world_size``."""

    status: str
    """``ok``, ``interrupted at step N``, ``stopped: ...``."""
    steps: int
    plan: dict[str, Any]
    plan_desc: str
    model: str
    param_count: int
    world_size: int
    device: str
    dtype: str
    first_loss: float
    last_loss: float
    loss_curve: list[Any]
    tokens: int
    tokens_per_s: float
    step_time_s_mean: float
    measured: Rates
    predicted: Rates
    ratio: dict[str, Any]
    per_rank: list[dict[str, Any]]
    prediction: dict[str, Any]
    moe: dict[str, Any]
    vocab_padding: str
    """How the vocabulary was padded for tensor parallelism (absent without padding)."""


REQUIRED: dict[str, type | tuple[type, ...]] = {
    "status": str, "steps": int, "plan": dict, "world_size": int}
NUMBER = (int, float)


def problems(summary: Any) -> list[str]:
    """What ``summary`` lacks or has of the wrong type (empty when it follows the schema)."""
    if not isinstance(summary, dict):
        return ["not a JSON object"]
    out = [f"{k} is missing" if k not in summary else f"{k} is not {_name(t)}"
           for k, t in REQUIRED.items()
           if k not in summary or not _is(summary[k], t)]
    for side in ("measured", "predicted"):
        rates = summary.get(side)
        if rates is None:
            continue
        if not isinstance(rates, dict):
            out.append(f"{side} is not an object")
            continue
        for k in Rates.__annotations__:
            v = rates.get(k, "missing")
            if v is not None and not _is(v, NUMBER):
                out.append(f"{side}.{k} is {'missing' if v == 'missing' else 'not a number'}")
    if ("measured" in summary) != ("predicted" in summary):
        out.append("measured and predicted come together")
    return out


def _is(v: Any, t: type | tuple[type, ...]) -> bool:
    if isinstance(v, bool) and t in (int, NUMBER):  # JSON true is not a count
        return False
    return isinstance(v, t)


def _name(t: type | tuple[type, ...]) -> str:
    return "a number" if t == NUMBER else {str: "a string", int: "an integer",
                                           dict: "an object"}.get(t, str(t))  # type: ignore[arg-type]

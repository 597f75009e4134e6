"""What this runtime cannot run, decided from the specs alone (no torch import).

The launcher asks before any worker starts, so a plan the workers would refuse is one line
and exit code 2 within a second, not after torchrun has started and every worker has
imported torch (several seconds per worker on a small CPU). Divisibility and micro-batch
counts are ``ParallelPlan.validate``'s; these are the runtime's own limits.
"""

from __future__ import annotations

from ...specs.stages import is_v_shape
from ...specs import ModelSpec, ParallelPlan


def schedule_name(plan: ParallelPlan) -> str:
    """The ``torch.distributed.pipelining`` schedule class that runs ``plan.schedule``."""
    if plan.schedule == "gpipe":
        return "ScheduleGPipe"
    if plan.schedule == "1f1b":
        return "Schedule1F1B"
    if plan.schedule == "interleaved-1f1b":
        return "ScheduleInterleaved1F1B"
    return "ScheduleZBVZeroBubble" if plan.stages_per_rank == 2 else "ScheduleInterleavedZeroBubble"


ZERO_BUBBLE = ("ScheduleZBVZeroBubble", "ScheduleInterleavedZeroBubble")


def pp_problem(model: ModelSpec, plan: ParallelPlan, *, compile: bool = False) -> str | None:
    """Why this runtime cannot run ``plan``'s pipeline, or None (see
    :mod:`ptd.runtime.parallel.pp`; layer counts and ``m >= pp`` are ``ParallelPlan.validate``'s)."""
    if plan.pp == 1:
        return None
    m = plan.n_microbatches
    name = schedule_name(plan)
    if name in ("ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble"):
        rounds = max(1, m // plan.pp)
        if m % rounds:
            return (f"{plan.schedule} ({name}) needs the micro-batches per step "
                    f"({m} = global_batch/(micro_batch*dp)) to be a multiple of "
                    f"max(1, {m} // pp) = {rounds}; try {rounds * plan.pp} micro-batches")
    if plan.zero == 3 and name in ZERO_BUBBLE:
        return ("zero-bubble schedules with zero 3 lose weight gradients in torch 2.13 (FSDP "
                "reshards between the input and the weight backward; measured): use zero 2 or "
                "another schedule")
    if model.tied_embeddings and plan.zero >= 1 and is_v_shape(plan):
        # the V puts the first and the last stage on rank 0, as two FSDP roots: the one
        # tied matrix would belong to both
        return (f"{model.name}: tied embeddings with the zero-bubble V schedule and zero "
                f"{plan.zero} (rank 0's two stage roots would share the embedding under FSDP); "
                f"use zero 0, another schedule, or untie them")
    if compile and name in ZERO_BUBBLE:
        return "zero-bubble schedules cannot run torch.compile'd blocks (torch 2.13); drop --compile"
    return None


def tp_problem(model: ModelSpec, plan: ParallelPlan) -> str | None:
    """Why this runtime cannot run ``plan``'s tensor/sequence parallelism, or None.
    (Divisibility of heads, kv heads and ffn is ``ParallelPlan.validate``'s.)"""
    if plan.tp == 1:
        return None
    if plan.sp and model.is_moe:
        return (f"{model.name}: sequence parallel is not wired into the mixture-of-experts layer "
                f"(its experts are replicated over tp); drop --sp")
    return None


def dp_problem(model: ModelSpec, plan: ParallelPlan) -> str | None:
    """Why this runtime cannot run ``plan``'s data parallelism as asked, or None."""
    if plan.grad_compression != "none" and (plan.tp > 1 or plan.pp > 1):
        return ("gradient compression hooks need DDP, which tp > 1 or pp > 1 do not use "
                "(their gradients are averaged over dp by the runner); use none")
    return None


def plan_problem(model: ModelSpec, plan: ParallelPlan, *, compile: bool = False) -> str | None:
    """The one validator: why ``ptd train`` would refuse ``plan`` for ``model`` whatever the
    host (the runtime's limits beyond ``ParallelPlan.validate``), or None. ``ptd plan``
    rejects such plans in its search, ``ptd estimate`` refuses them, every export refuses
    them, and ``ptd train`` refuses them before starting -- so a plan ptd prints or exports
    is one it trains. (What depends on the host -- the GPU count, MoE training -- is
    ``ptd.runtime.launch.launcher.check_runtime``'s.)"""
    return (tp2d_problem(model, plan, compile=compile) or tp_problem(model, plan)
            or pp_problem(model, plan, compile=compile) or dp_problem(model, plan)
            or cp_problem(model, plan))


def tp2d_problem(model: ModelSpec, plan: ParallelPlan, *, compile: bool = False) -> str | None:
    """Why this runtime cannot run ``plan``'s 2-D tensor parallelism, or None (``tp = q^2``
    and the divisibility by ``q`` are ``ParallelPlan.validate``'s). What runs (tested): 2-D
    tp alone and with plain data parallelism (zero 0), with recompute; see
    :mod:`ptd.runtime.parallel.tp2d` and docs/parallelism-cp.md."""
    if plan.tp_mode != "2d":
        return None
    why = None
    if plan.sp:
        why = "sequence parallel (2d already splits every activation over the q x q mesh); drop --sp"
    elif plan.cp > 1:
        why = "context parallel; use cp 1"
    elif model.is_moe or plan.ep > 1:
        why = f"{model.name}: mixture-of-experts layers (their experts are not split in 2-D)"
    elif plan.zero > 0:
        why = "ZeRO/FSDP (gradients are averaged over dp by the runner); use zero 0"
    elif plan.pp > 1:
        why = "pipeline parallel (stages would exchange 2-D activation blocks); use pp 1"
    elif model.tied_embeddings:
        why = (f"{model.name}: tied embeddings (the embedding and the output layer split the "
               f"vocabulary along different mesh axes); untie them")
    elif compile:
        why = "--compile (its explicit collectives are untested under torch.compile)"
    return None if why is None else f"--tp-mode 2d does not run with {why}"


def cp_problem(model: ModelSpec, plan: ParallelPlan) -> str | None:
    """Why this runtime cannot run ``plan``'s context parallelism, or None (divisibility of
    the sequence is ``ParallelPlan.validate``'s)."""
    if plan.cp == 1:
        return None
    if model.position == "learned":
        return (f"{model.name}: context parallel needs RoPE positions (each rank rotates its "
                f"tokens by their global positions); learned position embeddings are not wired")
    if plan.ep > 1:
        return "context parallel with expert parallel is not supported yet; use one of them"
    if model.dropout > 0:
        return "context parallel needs dropout 0 (attention is computed blockwise, without dropout)"
    return None

"""Parallel dimensions, one file each, composed by :func:`parallelize`.

Each ``apply_*`` takes the model, its mesh (or group) and the plan, torchtitan style:

* :mod:`.tp`: tensor/sequence parallelism on the ``tp`` sub-mesh;
* :mod:`.tp2d`: 2-D tensor parallelism (``tp_mode = "2d"``) on the ``q x q`` tp mesh;
* :mod:`.recompute`: activation checkpointing and ``torch.compile`` per block;
* :mod:`.fsdp`: ZeRO-1, -2 and -3 (FSDP2) on the ``dp`` sub-mesh;
* :mod:`.ddp`: DDP (ZeRO-0) on the ``dp`` group, gradient compression hooks, and the
  explicit gradient average of model-parallel layouts (DDP cannot wrap DTensors);
* :mod:`.pp`: prunes the model to this rank's pipeline stages *before* :func:`parallelize`
  runs on it, and builds the schedule.

Order matters: tensor parallelism first (it turns parameters into DTensors that FSDP then
shards along another mesh axis), then checkpointing and compile (they act on the blocks'
forward), then FSDP (which must see the final blocks), then materialisation -- FSDP can
shard a meta model, DDP cannot -- and DDP last (only for pure data parallelism with zero
0: with tp > 1, pp > 1, ep > 1 or cp > 1 the runner reduces gradients over dp itself, see
``GradAllReduce``).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel as DDP

from ...specs import ParallelPlan
from ..model.init import materialize
from .mesh import ParallelDims
from .ddp import apply_ddp
from .fsdp import apply_fsdp
from .tp import apply_tp
from .recompute import apply_compile, apply_recompute


def parallelize(model: nn.Module, plan: ParallelPlan, dims: ParallelDims, *, seed: int,
                compile: bool = False, roots: Sequence[nn.Module] = ()) -> nn.Module:
    """Apply every dimension of ``plan`` to a meta-device model; return the module to
    train (materialised, initialised from ``seed``, possibly wrapped).

    ``roots``: the pipeline stage modules of this rank when they are not ``model`` itself
    (:class:`~.pp.StageChunk` views sharing its modules); they become the FSDP roots."""
    if plan.tp > 1 and plan.tp_mode == "2d":
        from .tp2d import apply_tp2d
        apply_tp2d(model, dims.tp2d_mesh, plan)
    elif plan.tp > 1:
        apply_tp(model, dims.submesh("tp"), plan)
    if plan.ep > 1:
        from .ep import apply_ep
        apply_ep(model, dims.ep_mesh)
    if plan.cp > 1:
        from .cp import apply_cp
        apply_cp(model, dims.group("cp"), dims.coords["cp"], plan.cp)
    if plan.recompute != "none":
        apply_recompute(model, plan.recompute)
    if compile:
        apply_compile(model)
    if plan.zero >= 1:
        apply_fsdp(model, dims.submesh("dp"), plan, dims.device, roots=roots,
                   ep_mesh=dims.ep_mesh if plan.ep > 1 else None)
        init_device = torch.device("cpu") if plan.offload else dims.device
        return materialize(model, init_device, seed, roots=roots)
    materialize(model, dims.device, seed)
    if plan.tp > 1 or plan.pp > 1 or plan.ep > 1 or plan.cp > 1:
        return model  # gradients reduced over dp (dp x cp) by the runner (GradAllReduce)
    return apply_ddp(model, dims.group("dp"), plan, dims.device)


def unwrap(model: nn.Module) -> nn.Module:
    """The :class:`~ptd.runtime.model.transformer.Transformer` inside a DDP wrapper (FSDP2 wraps in
    place, so an FSDP model is its own inner model)."""
    return model.module if isinstance(model, DDP) else model


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Forward+backward inside this context reduce gradients across replicas only if
    ``enabled`` (the last micro-step of an optimizer step); otherwise they accumulate locally.
    Under FSDP the stage decides (:mod:`.fsdp`): ZeRO-2 reduce-scatters at every micro-step
    all the same (its gradients stay sharded), ZeRO-1 and -3 defer it; ZeRO-1 and -2 also
    keep the gathered parameters for the next micro-step instead of gathering them again."""
    if enabled:
        yield
    elif isinstance(model, DDP):
        with model.no_sync():
            yield
    elif isinstance(model, FSDPModule):
        zero = getattr(model, "ptd_zero", 3)
        if zero != 2:
            model.set_requires_gradient_sync(False)
        if zero < 3:
            model.set_reshard_after_backward(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
            model.set_reshard_after_backward(True)
    else:
        yield


__all__ = ["apply_compile", "apply_ddp", "apply_fsdp", "apply_recompute", "apply_tp", "gradient_sync",
           "parallelize", "unwrap"]

"""AdamW, the learning-rate schedule, and gradient clipping by the global norm.

Clipping must see the norm of the *whole* gradient, however it is spread over ranks:

* plain tensors (DDP) are already all-reduced, identical on every replica: their
  squared norm is summed locally;
* ``DTensor`` gradients (FSDP shards, later tensor-parallel shards) contribute the squared
  norm of their local shard, summed over the mesh axes along which they are sharded (not
  over axes along which they are replicated -- that would count them twice);
* ranks that hold *different* parameters that are not DTensors -- pipeline stages -- add
  their totals over :meth:`ParallelDims.grad_norm_groups` (the pp group).

On a GPU, per-tensor loops are launch-bound (a few microseconds per kernel, several kernels
per tensor): plain CUDA parameters take the fused AdamW kernel, and their gradients' norm
comes from one ``_foreach_norm``. Measured on an H100 with a 1.9 G-parameter model: AdamW
58.8 ms (foreach) -> 22.6 ms (fused, at the memory bandwidth); for gpt2-355m the norm went
23.4 -> 7.2 ms (docs/benchmarks.md). CPU keeps the per-tensor arithmetic its calibrated
profile measured.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from ..specs import OptimConfig
from .model.init import canonical_name
from .model.transformer import tied_copy


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay matrices; not norms, biases or embeddings (nor the output layer tied to one,
    also where it is a copy held apart: :func:`tied_copy`)."""
    decay, no_decay = [], []
    copy = tied_copy(model)
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim >= 2 and "embeddings" not in canonical_name(name) and p is not copy:
            decay.append(p)
        else:
            no_decay.append(p)
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    """AdamW with fp32 states. Under ZeRO-1/2/3 (FSDP) the parameters are already shards,
    so plain AdamW keeps 1/dp of the states."""
    groups = param_groups(model, cfg.weight_decay)
    kw = dict(lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
    if _fused_ok([p for g in groups for p in g["params"]]):
        kw["fused"] = True
    return torch.optim.AdamW(groups, **kw)


def _fused_ok(params: list[torch.Tensor]) -> bool:
    """Fused AdamW for plain CUDA parameters (DTensor parameters keep the default
    implementation, whose sharding rules every torch release supports)."""
    return bool(params) and all(p.is_cuda and not isinstance(p, DTensor) for p in params)


def lr_at(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """Learning rate of optimizer step ``step`` (1-based): linear warm-up from 0 over
    ``warmup_steps``, then cosine decay to ``min_lr_ratio * lr`` at ``total_steps``."""
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    span = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def norm_params(model: nn.Module) -> list[torch.Tensor]:
    """The parameters whose gradients make up the global norm: each distinct tensor of the
    whole model once (a tied embedding's copy on a pipeline's last stage is not)."""
    copy = tied_copy(model)
    return [p for p in model.parameters() if p.requires_grad and p is not copy]


def _sharded_axes(t: DTensor) -> tuple[int, ...]:
    # Gradients come out of FSDP / tensor parallelism reduced: Shard or Replicate, never
    # Partial (a Partial gradient would need reducing before its norm means anything).
    assert not any(p.is_partial() for p in t.placements), "unreduced (Partial) gradient"
    # Not ``is_shard()``: FSDP over a tensor-parallel dim-0 shard places ``_StridedShard``
    # on the dp axis, for which ``is_shard()`` is False.
    return tuple(i for i, p in enumerate(t.placements) if not p.is_replicate())


@torch.no_grad()
def global_grad_norm(params: Iterable[torch.Tensor], device: torch.device,
                     extra_groups: Iterable[dist.ProcessGroup] = ()) -> torch.Tensor:
    """The L2 norm of all gradients of the model, over every shard and stage (fp32)."""
    plain: list[torch.Tensor] = []  # identical on every rank that holds them
    # keyed by the mesh's value, not its identity: FSDP and tensor parallelism hand out
    # equal meshes as distinct objects (7 of them for dp 2 x tp 2 under ZeRO-3, 13 scalar
    # all-reduces where 3 do)
    sharded: dict[tuple[Any, tuple[int, ...]], list[torch.Tensor]] = {}
    for p in params:
        g = p.grad
        if g is None:
            continue
        if not isinstance(g, DTensor):
            plain.append(g)
            continue
        axes = _sharded_axes(g)
        if not axes:
            plain.append(g.to_local())
            continue
        sharded.setdefault((g.device_mesh, axes), []).append(g.to_local())
    foreach = device.type == "cuda"
    local = squared_norm(plain, device, foreach)
    for (mesh, axes), shards in sharded.items():
        acc = squared_norm(shards, device, foreach)
        for axis in axes:
            dist.all_reduce(acc, group=mesh.get_group(axis))
        local += acc
    for group in extra_groups:
        dist.all_reduce(local, group=group)
    return local.sqrt()


def squared_norm(grads: list[torch.Tensor], device: torch.device, foreach: bool) -> torch.Tensor:
    """Sum of squares of ``grads`` in fp32: one ``_foreach_norm`` per dtype (``foreach``), or
    a per-tensor loop (the arithmetic CPU runs use)."""
    total = torch.zeros((), dtype=torch.float32, device=device)
    if not foreach:
        for g in grads:
            total += g.float().pow(2).sum().to(device)
        return total
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for group in by_dtype.values():
        # accumulate in fp32 whatever the gradients' dtype (a bf16 norm keeps 3 digits)
        norms = torch._foreach_norm(group, 2.0, dtype=torch.float32)
        total += torch.stack(norms).pow(2).sum().to(device)
    return total


@torch.no_grad()
def clip_grads_(params: list[torch.Tensor], max_norm: float, total_norm: torch.Tensor) -> None:
    """Scale every gradient by ``min(1, max_norm / total_norm)``."""
    coef = min(1.0, max_norm / (float(total_norm) + 1e-6))
    if coef < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)

"""Plain data parallelism (DDP, ZeRO-0), with optional gradient compression.

DDP keeps a full replica per rank and all-reduces gradients in buckets (25 MB) while the
backward pass is still running, so communication overlaps computation. It averages over
the data-parallel group, which with the loss normalised per replica gives the mean over
the global batch. Buffers are not broadcast each step (RoPE tables are identical
everywhere by construction).

ZeRO-1, -2 and -3 are FSDP2's (:mod:`.fsdp`).

Gradient compression (``grad_compression``; DDP only, a plan check):

* ``fp16``: ``fp16_compress_hook`` -- gradients are cast to fp16 for the all-reduce (half
  the bytes) and back. Lossy: losses no longer match an uncompressed run bit for bit, and
  fp16's range can overflow on very large gradients. (``bf16_compress_hook`` needs CUDA +
  NCCL, so it is not offered.)
* ``powersgd``: PowerSGD rank-1 low-rank compression with error feedback, after 10
  uncompressed warm-up iterations. Strongly lossy; on gloo it worked on 2 ranks but hung
  at its first compressed step on 4 ranks (torch 2.13, measured), so use it on NCCL.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn
from torch.distributed import ProcessGroup
from torch.nn.parallel import DistributedDataParallel as DDP

from ...specs import ParallelPlan


def _no_buffer_sync() -> dict[str, bool]:
    """DDP's switch for not broadcasting buffers at every forward (the model's buffers are
    derived tables, equal on every rank). torch 2.13 names it ``forward_sync_buffers`` and
    deprecates ``broadcast_buffers``; earlier releases (which GPU images often ship) only
    know ``broadcast_buffers``."""
    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def apply_ddp(model: nn.Module, group: ProcessGroup, plan: ParallelPlan, device: torch.device) -> DDP:
    """Wrap a materialised, initialised model; DDP broadcasts rank 0's weights (which
    equal everyone's anyway: the initialisation is seeded by parameter name)."""
    # gradient_as_bucket_view: gradients live inside DDP's communication buckets instead of
    # beside them, which saves one gradient-sized copy (the cost model assumes this).
    ddp = DDP(model, process_group=group, gradient_as_bucket_view=True,
              device_ids=[device.index] if device.type == "cuda" else None, **_no_buffer_sync())
    if plan.grad_compression == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(group, default_hooks.fp16_compress_hook)
    elif plan.grad_compression == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
        state = ps.PowerSGDState(process_group=group, matrix_approximation_rank=1,
                                 start_powerSGD_iter=10)
        ddp.register_comm_hook(state, ps.powerSGD_hook)
    return ddp


class GradAllReduce:
    """Data parallelism without DDP, for tensor-, pipeline-, expert- and context-parallel
    models with zero 0 (and the cp part of the average under ZeRO-1, whose FSDP reduces over dp).

    DDP cannot wrap DTensor (tensor-parallel) parameters, and a pipeline stage's backward is
    driven by the schedule, not by one ``loss.backward()``. So the runner calls this once
    per optimizer step, after the last micro-batch's backward: every gradient (the local
    shard of a DTensor one) is packed into one flat buffer per dtype, summed over the
    dp group and divided by dp -- DDP's average, without its overlap with the backward.
    """

    def __init__(self, params: list[torch.Tensor], group: ProcessGroup, size: int) -> None:
        self.params = params
        self.group = group
        self.size = size

    @torch.no_grad()
    def __call__(self) -> None:
        import torch.distributed as dist
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
        from torch.distributed.tensor import DTensor
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in self.params:
            g = p.grad
            if g is None:
                continue
            g = g._local_tensor if isinstance(g, DTensor) else g
            by_dtype.setdefault(g.dtype, []).append(g)
        for grads in by_dtype.values():
            flat = _flatten_dense_tensors(grads)
            dist.all_reduce(flat, group=self.group)
            flat.div_(self.size)
            for g, reduced in zip(grads, _unflatten_dense_tensors(flat, grads)):
                g.copy_(reduced)


def dp_grad_sync(model: nn.Module, plan: ParallelPlan, group: ProcessGroup) -> Any:
    """The explicit gradient reduction the runner must do, or None when DDP/FSDP do it (or
    there is one replica)."""
    if plan.dp == 1 or plan.zero >= 1:
        return None
    if plan.tp == 1 and plan.pp == 1:
        return None
    return GradAllReduce([p for p in model.parameters() if p.requires_grad], group, plan.dp)

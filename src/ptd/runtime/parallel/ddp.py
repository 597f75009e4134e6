"""Plain data parallelism (DDP) and ZeRO-1, with optional gradient compression.

DDP keeps a full replica per rank and all-reduces gradients in buckets (25 MB) while the
backward pass is still running, so communication overlaps computation. It averages over
the data-parallel group, which with the loss normalised per replica gives the mean over
the global batch. Buffers are not broadcast each step (RoPE tables are identical
everywhere by construction).

ZeRO-1 is DDP plus ``ZeroRedundancyOptimizer``: each rank keeps the AdamW states of 1/dp of
the parameters, steps only those, and broadcasts the updated parameters.

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

from typing import Any

import torch
from torch import nn
from torch.distributed import ProcessGroup
from torch.nn.parallel import DistributedDataParallel as DDP

from ...specs import ParallelPlan


def apply_ddp(model: nn.Module, group: ProcessGroup, plan: ParallelPlan, device: torch.device) -> DDP:
    """Wrap a materialised, initialised model; DDP broadcasts rank 0's weights (which
    equal everyone's anyway: the initialisation is seeded by parameter name)."""
    # gradient_as_bucket_view: gradients live inside DDP's communication buckets instead of
    # beside them, which saves one gradient-sized copy (the cost model assumes this).
    ddp = DDP(model, process_group=group, forward_sync_buffers=False, gradient_as_bucket_view=True,
              device_ids=[device.index] if device.type == "cuda" else None)
    if plan.grad_compression == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(group, default_hooks.fp16_compress_hook)
    elif plan.grad_compression == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
        state = ps.PowerSGDState(process_group=group, matrix_approximation_rank=1,
                                 start_powerSGD_iter=10)
        ddp.register_comm_hook(state, ps.powerSGD_hook)
    return ddp


def zero1_optimizer(param_groups: list[dict[str, Any]], group: ProcessGroup, **adamw: Any
                    ) -> torch.optim.Optimizer:
    """AdamW whose states are sharded over ``group`` (ZeRO stage 1)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    return ZeroRedundancyOptimizer(param_groups, optimizer_class=torch.optim.AdamW,
                                   process_group=group, **adamw)

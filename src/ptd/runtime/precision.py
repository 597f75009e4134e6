"""Mixed precision: what runs in low precision and how gradients stay representable.

Master weights and optimizer states are fp32 in every mode.

* ``fp32``: nothing to do.
* ``bf16``: with DDP (ZeRO-0) the forward runs under ``torch.autocast`` (matmuls in
  bf16, reductions and the loss in fp32); with FSDP (ZeRO-1/2/3) the parameters are all-gathered
  in bf16 by ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` instead (see
  :mod:`ptd.runtime.parallel.fsdp`), which also halves the all-gather bytes. bf16 has
  fp32's exponent range, so no loss scaling.
* ``fp16``: same casting as bf16 plus dynamic loss scaling. With more than one rank the
  scaler is ``ShardedGradScaler`` over the whole world: ranks hold different gradients
  (FSDP shards, tensor-parallel shards, pipeline stages), and an overflow on any of them
  must skip the step on all, or the replicas and stages drift apart. On a CPU it runs too
  (torch's CPU autocast and scaler; fp16 matmuls are emulated on AVX2 CPUs, ~26x slower
  than fp32 here), which is how the pipeline's loss scaling is tested without a GPU.

The trainer calls ``backward``/``unscale_``/``step`` unconditionally; in fp32 and bf16
they are the plain operations.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    def __init__(self, dtype: str, device: torch.device, *, fsdp: bool,
                 distributed: bool = False) -> None:
        """``fsdp``: parameters cast by FSDP (ZeRO-1/2/3); ``distributed``: more than one
        rank, whose fp16 loss scaling must agree on overflows (over the default group)."""
        self.dtype = dtype
        self.device = device
        # FSDP casts parameters itself; autocast on top would only add casts.
        self.use_autocast = dtype != "fp32" and not fsdp
        self.scaler = None
        if dtype == "fp16":
            if distributed:
                from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
                self.scaler = ShardedGradScaler(device.type)  # (process group: the world)
            else:
                self.scaler = torch.amp.GradScaler(device.type)
            # The scale is created by the first scale() call; a pipeline's inner stages never
            # scale a loss (their gradients arrive scaled from the next stage) but unscale
            # and step all the same, so create it now.
            self.scaler.scale(torch.zeros((), device=device))

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def autocast(self) -> ContextManager:
        if not self.use_autocast:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.torch_dtype)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to back-propagate: times the loss scale in fp16 (a pipeline schedule
        back-propagates what its loss function returns, so it returns this)."""
        return self.scaler.scale(loss) if self.scaler else loss

    def unscaled(self, value: torch.Tensor) -> torch.Tensor:
        """A scaled loss's value at its true scale (for reporting)."""
        return value / self.scaler.get_scale() if self.scaler else value

    def backward(self, loss: torch.Tensor) -> None:
        self.scale(loss).backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients back to their true scale (before clipping measures them)."""
        if self.scaler:
            # tensor-parallel gradients are DTensors and the scaler's overflow flag a plain
            # tensor: let DTensor treat the flag as replicated (it checks each local shard;
            # the scaler then agrees on the flag over the world)
            from torch.distributed.tensor.experimental import implicit_replication
            with implicit_replication():
                self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()``, skipped by the scaler when fp16 gradients overflowed."""
        if self.scaler:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()

"""Mixed precision: what runs in low precision and how gradients stay representable.

Master weights and optimizer states are fp32 in every mode.

* ``fp32``: nothing to do.
* ``bf16``: with DDP (ZeRO-0) the forward runs under ``torch.autocast`` (matmuls in
  bf16, reductions and the loss in fp32); with FSDP (ZeRO-1/2/3) the parameters are all-gathered
  in bf16 by ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` instead (see
  :mod:`ptd.runtime.parallel.fsdp`), which also halves the all-gather bytes. bf16 has
  fp32's exponent range, so no loss scaling.
* ``fp16``: CUDA only (refused on CPU before any worker starts); same casting as bf16 plus
  dynamic loss scaling (``GradScaler``; ``ShardedGradScaler`` where ranks hold different
  gradients -- FSDP, ZeRO-1/2/3 -- so that all agree on an overflow). Not exercised on this
  project's CPU test machines.

The trainer calls ``backward``/``unscale_``/``step`` unconditionally; in fp32 and bf16
they are the plain operations.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

from ..errors import PtdError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    def __init__(self, dtype: str, device: torch.device, *, fsdp: bool,
                 group: torch.distributed.ProcessGroup | None = None) -> None:
        """``fsdp``: parameters cast by FSDP (ZeRO-1/2/3), whose ranks hold different
        gradient shards (so fp16 loss scaling agrees on overflows over ``group``)."""
        if dtype == "fp16" and device.type != "cuda":
            raise PtdError("fp16 needs a CUDA GPU (loss scaling); use --dtype bf16 on CPU")
        self.dtype = dtype
        self.device = device
        # FSDP casts parameters itself; autocast on top would only add casts.
        self.use_autocast = dtype != "fp32" and not fsdp
        self.scaler = None
        if dtype == "fp16":
            if fsdp:
                from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
                self.scaler = ShardedGradScaler(device.type, process_group=group)
            else:
                self.scaler = torch.amp.GradScaler(device.type)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def autocast(self) -> ContextManager:
        if not self.use_autocast:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.torch_dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients back to their true scale (before clipping measures them)."""
        if self.scaler:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()``, skipped by the scaler when fp16 gradients overflowed."""
        if self.scaler:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()

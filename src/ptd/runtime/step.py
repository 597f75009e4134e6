"""The seam between the trainer and the parallel dimensions: one step's forward+backward.

The trainer hands a :class:`StepRunner` this rank's micro-batches for one optimizer step
and gets back this rank's share of the loss; how the micro-batches flow through the
model (accumulation, a pipeline schedule) is the runner's business, and the trainer does
not look at the plan.

Loss convention (all runners): the loss a rank returns and back-propagates is the *sum* of
token losses of its micro-batches divided by the number of tokens its replica sees in the
step. Data-parallel gradient averaging then makes the gradient that of the mean over all
tokens of the global batch, and the trainer's average of the returned values over the
reporting ranks is that mean.

* :class:`AccumulationRunner` (here): micro-batches one after another, gradients
  accumulated, reduced across replicas only during the last micro-step.
* A pipeline runner (next issue) calls ``schedule.step(inputs, target=targets,
  losses=...)`` on stage modules; its loss function is the same ``lm_loss_sum / tokens``;
  only the last stage ``reports_loss``.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import torch
from torch import nn

from .data import MicroBatch
from .model import lm_loss_sum
from .parallel import gradient_sync
from .precision import Precision


class StepRunner(Protocol):
    reports_loss: bool
    """Whether this rank computes the loss (not so on a pipeline's inner stages)."""

    def forward_backward(self, micro_batches: Sequence[MicroBatch]) -> torch.Tensor:
        """Run forward and backward over this rank's micro-batches of one optimizer step,
        leaving the step's (synchronised) gradients in ``.grad``; return the detached loss
        share (see the module docstring)."""
        ...

    def evaluate(self, micro_batches: Sequence[MicroBatch]) -> torch.Tensor:
        """Mean token loss over ``micro_batches`` without gradients (same convention)."""
        ...


def replica_tokens(micro_batches: Sequence[MicroBatch]) -> int:
    return sum(mb.n_tokens for mb in micro_batches)


class AccumulationRunner:
    """Gradient accumulation over micro-batches for DDP / ZeRO / single process.

    Gradient synchronisation (DDP's bucketed all-reduce, FSDP's reduce-scatter) happens only
    in the backward of the last micro-batch: ``no_sync`` / ``set_requires_gradient_sync``."""

    reports_loss = True

    def __init__(self, model: nn.Module, precision: Precision) -> None:
        self.model = model
        self.precision = precision

    def forward(self, mb: MicroBatch, step_tokens: int) -> torch.Tensor:
        with self.precision.autocast():
            logits = self.model(mb.inputs)
        return lm_loss_sum(logits, mb.targets) / step_tokens

    def backward(self, loss: torch.Tensor) -> None:
        self.precision.backward(loss)

    def forward_backward(self, micro_batches: Sequence[MicroBatch]) -> torch.Tensor:
        step_tokens = replica_tokens(micro_batches)
        total = torch.zeros((), dtype=torch.float32, device=micro_batches[0].inputs.device)
        last = len(micro_batches) - 1
        for i, mb in enumerate(micro_batches):
            with gradient_sync(self.model, enabled=i == last):
                loss = self.forward(mb, step_tokens)
                self.backward(loss)
            total += loss.detach()
        return total

    @torch.no_grad()
    def evaluate(self, micro_batches: Sequence[MicroBatch]) -> torch.Tensor:
        self.model.eval()
        try:
            step_tokens = replica_tokens(micro_batches)
            return sum(self.forward(mb, step_tokens) for mb in micro_batches)  # type: ignore[return-value]
        finally:
            self.model.train()

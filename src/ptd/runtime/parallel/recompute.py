"""Activation checkpointing and ``torch.compile``: applied per block, names unchanged.

Both are switches on the existing blocks rather than wrapper modules, so parameter names
(and with them checkpoints and the seeded initialisation) are the same with or without
them.

Checkpointing (non-reentrant ``torch.utils.checkpoint``), per block:

* ``full``: the block keeps only its input; its whole forward is recomputed during the
  backward pass (about one extra forward of every block: ~33% more compute).
* ``selective``: only the attention core is recomputed -- RoPE on q and k, then
  ``softmax(QK^T/sqrt(d))V`` (with attention dropout) -- from the q/k/v projections, which
  are kept. That is the part whose activations grow with the square of the sequence
  length in an unfused implementation (Korthikanti et al. 2022); the projections, norms
  and MLP keep their activations. With fused attention kernels (flash, or the CPU's
  flash kernel) the saving is the rotated q/k copies plus the attention output and
  log-sum-exp, and the cost is one more attention forward per block.
"""

from __future__ import annotations

from torch import nn


def apply_recompute(model: nn.Module, mode: str) -> None:
    for block in model.layers.values():
        block.set_recompute(mode)


def apply_compile(model: nn.Module) -> None:
    """Compile each block in place (``nn.Module.compile``: no ``_orig_mod`` wrapper).
    Blocks are identical, so one compiled graph serves all of them."""
    for block in model.layers.values():
        block.compile()

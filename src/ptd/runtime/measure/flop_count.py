"""Count the FLOPs the runtime model really executes, with ``FlopCounterMode``.

This is the other side of the cost model's FLOP convention (:mod:`ptd.cost.flops`): the
tests check that the two agree exactly, for the tiny model on real CPU tensors and for
Llama 3 8B and GPT-3 175B shapes on the meta device (shapes only, no memory).

``FlopCounterMode`` has no formula for PyTorch's CPU fused attention kernel
(``_scaled_dot_product_flash_attention_for_cpu`` and its backward), so on a CPU it would
silently count attention as zero -- about 7.5% of Llama 2 7B's FLOPs at 4096 tokens. We
register formulas for them: the forward's two ``s x s`` products at query-head width (as
PyTorch's GPU formula), and the backward's **four** products that the gradient needs (dV,
dP, dQ, dK -- what the math path executes). PyTorch's own GPU backward formula counts a
fifth, the fused kernel's recomputation of ``Q K^T``: a hardware FLOP, not a model FLOP,
so an MFU taken from it runs high by ``2 L s H d`` per token. On the meta device attention
takes the math path, whose batched products are counted directly.
"""

from __future__ import annotations

import torch
from torch.utils import flop_counter as fc

from ...specs import ModelSpec

_registered = False


def register_cpu_attention_flops() -> None:
    """Teach ``FlopCounterMode`` the CPU fused-attention kernels (idempotent)."""
    global _registered
    if _registered:
        return
    aten = torch.ops.aten

    @fc.register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu)
    def _fwd(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return fc.sdpa_flop_count(query_shape, key_shape, value_shape)

    @fc.register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu_backward)
    def _bwd(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
             **kwargs) -> int:
        # the gradient's four products: twice the forward (no recomputation of Q K^T)
        return 2 * fc.sdpa_flop_count(query_shape, key_shape, value_shape)

    _registered = True


def training_flops(spec: ModelSpec, batch: int, seq_len: int, device: str = "meta",
                   recompute: str = "none") -> tuple[float, float]:
    """(forward, forward+backward) FLOPs of one training step of ``batch`` sequences, as
    ``FlopCounterMode`` counts them on the runtime model. ``recompute`` adds what
    activation checkpointing executes again (hardware FLOPs)."""
    from ..model.init import materialize
    from ..model.transformer import build_model, lm_loss_sum

    register_cpu_attention_flops()
    model = build_model(spec, device)
    if device != "meta":
        materialize(model, torch.device(device), seed=0)
    for block in model.layers.values():
        block.set_recompute(recompute)
    tokens = torch.randint(0, spec.vocab_size, (batch, seq_len + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    with fc.FlopCounterMode(display=False) as counter:
        loss = lm_loss_sum(model(inputs), targets)
        forward = counter.get_total_flops()
        loss.backward()
    return float(forward), float(counter.get_total_flops())

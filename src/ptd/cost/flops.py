"""FLOPs per token: the one convention ptd uses everywhere (cost model, MFU, HFU, tests).

**Convention (PaLM, Chowdhery et al. 2022, arXiv 2204.02311, Appendix B).** A
multiply-add is 2 FLOPs, and only matrix multiplications count::

    model FLOPs / token = 6 N + 12 L s (H d)

* ``N`` = :meth:`ModelSpec.matmul_params`: every weight a token is multiplied by -- the
  Q/K/V/output projections and MLP matrices of every block (for mixture-of-experts only the
  ``top_k`` experts a token visits, plus the router) **and the output layer** (``V h``,
  whether or not it is tied to the embedding; ``V`` the model's vocabulary, not the padded
  one the runtime allocates: padding columns are work the hardware does and the model does
  not need, priced in time by :func:`ptd.cost.compute.output_time` and left out of model
  FLOPs, so padding never raises MFU). The embedding lookup is a gather and costs
  nothing; norms, biases, activations and softmax are not counted. Forward is ``2N``,
  backward twice that (input and weight gradients), hence ``6N``.
* ``12 L s (H d)``: attention's two ``s x s`` products (Q K^T and scores x V), ``4 s H d``
  per token per layer forward, times 3 for forward + backward. **Causal attention is counted
  in full** (the whole ``s x s`` matrix), as PaLM does, although a causal kernel skips
  about half of it; ``H d`` is the query width, so grouped-query attention does not change
  this term.

**Hardware FLOPs** add what recomputation executes again: full recompute repeats each
block's forward (``2 N_blocks + 4 L s H d`` per token), selective recompute repeats only the
attention core (``4 L s H d``). MFU divides model FLOPs, HFU hardware FLOPs, by peak.
PyTorch's non-reentrant checkpoint (ptd's runtime) *stops early*: it recomputes a block only
until every tensor the backward needs is back, so it never re-runs the block's last product,
the MLP down projection, whose output only feeds the residual add (``early_stop``, default
True). Megatron-LM's full recompute re-runs the whole forward (``early_stop=False``).

For GPT-shaped models (``F = 4h``, multi-head attention, learned positions) this is exactly
the count of Narayanan et al. 2021 (arXiv 2104.04473, eq. 3) -- see
:func:`megatron_flops_per_iteration` -- because both count the same matrix products.
``torch.utils.flop_counter.FlopCounterMode`` counts the same operations (plus the padding
columns' ``6 h`` per padding row and token), which a test checks.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..specs.model import ModelSpec


@dataclass(frozen=True)
class FlopsPerToken:
    """FLOPs per trained token (forward + backward, and recompute for ``hardware``)."""

    model: float
    """Model FLOPs: what the architecture needs, whatever the implementation (MFU)."""
    hardware: float
    """FLOPs executed, recomputation included (HFU)."""
    forward: float
    """Forward pass alone (model FLOPs / 3)."""
    recompute: float
    """Extra forward work repeated by activation checkpointing."""


def attention_flops_per_token_layer(model: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs of Q K^T and scores x V for one token in one layer: ``4 s H d``."""
    return 4.0 * seq_len * model.q_dim


def forward_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """``2 N + 4 L s H d``."""
    return (2.0 * model.matmul_params(active=True)
            + model.n_layers * attention_flops_per_token_layer(model, seq_len))


def last_matmul_params(model: ModelSpec) -> int:
    """Weights of a block's last product per token: the MLP down projection(s) visited."""
    return model.hidden * model.ffn_hidden * (model.top_k if model.is_moe else 1)


def op_policy_params(model: ModelSpec) -> int:
    """Weights per token of the products torchtitan's ``op`` policy runs again (see
    :data:`ptd.cost.compute.SELECTIVE`): of q, k, v, the attention output, the MLP's input
    product(s) and its down projection in forward order, the second, fourth, ...; all of them
    with biases. A MoE block's MLP counts as its ``top_k`` experts' (and shared experts')
    products in that place."""
    h, q, kv, f = model.hidden, model.q_dim, model.kv_dim, model.ffn_hidden
    experts = (model.top_k + model.n_shared_experts) if model.is_moe else 1
    ups = [h * f * experts] * (2 if model.mlp == "swiglu" else 1)
    products = [h * q, h * kv, h * kv, q * h, *ups, f * h * experts]
    return sum(products if model.bias else products[1::2])


def recompute_flops_per_token(model: ModelSpec, seq_len: int, recompute: str,
                              early_stop: bool = True, selective: str = "attention") -> float:
    """Forward work repeated in backward by activation checkpointing; ``selective``: what
    selective recompute repeats (:data:`ptd.cost.compute.SELECTIVE`)."""
    attn = model.n_layers * attention_flops_per_token_layer(model, seq_len)
    if recompute == "full":
        per_layer = model.matmul_params_per_layer(active=True)
        if early_stop:
            per_layer -= last_matmul_params(model)
        return 2.0 * model.n_layers * per_layer + attn
    if recompute == "selective":
        if selective == "layer":
            return 0.5 * recompute_flops_per_token(model, seq_len, "full", early_stop)
        if selective == "op":
            return 2.0 * model.n_layers * op_policy_params(model)
        return attn
    return 0.0


def flops_per_token(model: ModelSpec, seq_len: int, recompute: str = "none",
                    early_stop: bool = True, selective: str = "attention") -> FlopsPerToken:
    """Model and hardware FLOPs per token (see the module docstring for the convention)."""
    fwd = forward_flops_per_token(model, seq_len)
    rc = recompute_flops_per_token(model, seq_len, recompute, early_stop, selective)
    return FlopsPerToken(model=3.0 * fwd, hardware=3.0 * fwd + rc, forward=fwd, recompute=rc)


def megatron_flops_per_iteration(model: ModelSpec, batch: int, seq_len: int,
                                 recompute: bool = True) -> float:
    """Narayanan et al. 2021 (arXiv 2104.04473) eq. 3, FLOPs of one iteration of a GPT model::

        96 B s l h^2 (1 + s / 6h + V / 16 l h)      (with full recompute)
        72 B s l h^2 (1 + s / 6h + V / 12 l h)      (without)

    It assumes ``F = 4h`` and multi-head attention; it is here to compare conventions, and the
    tests check that :func:`flops_per_token` agrees with it on GPT shapes.
    """
    b, s, l, h, v = batch, seq_len, model.n_layers, model.hidden, model.vocab_size
    if recompute:
        return 96.0 * b * s * l * h * h * (1 + s / (6.0 * h) + v / (16.0 * l * h))
    return 72.0 * b * s * l * h * h * (1 + s / (6.0 * h) + v / (12.0 * l * h))

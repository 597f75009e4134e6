"""The pieces of a transformer block: norms, rotary positions, attention, MLP, experts.

Written for the parallel dimensions that wrap them later, not for cleverness:

* every weight is a plain ``nn.Linear``/``nn.Embedding`` parameter with a stable name, so
  FSDP shards it, DTensor tensor parallelism splits it and checkpoints address it;
* attention reshapes with ``-1`` heads (``view(b, s, -1, head_dim)``): with tensor
  parallelism a rank holds ``n_heads / tp`` heads and the same code runs unchanged;
* attention itself is ``F.scaled_dot_product_attention(is_causal=True)`` (fused kernels on
  CPU and GPU); grouped-query attention uses ``enable_gqa`` (no K/V copies).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from ..measure.spans import block_span
from torch.utils.checkpoint import checkpoint

from ...specs import ModelSpec


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale (Llama); ``F.rms_norm`` does the work."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def make_norm(spec: ModelSpec) -> nn.Module:
    if spec.norm == "rmsnorm":
        return RMSNorm(spec.hidden, spec.norm_eps)
    return nn.LayerNorm(spec.hidden, eps=spec.norm_eps)


def rope_tables(head_dim: int, max_len: int, theta: float, device: torch.device | str | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables ``(max_len, head_dim)`` in the "rotate half" layout of Hugging Face
    Llama checkpoints (so their weights load without permuting q/k rows)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    t = torch.arange(max_len, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape ``(b, s, heads, d)`` by position; tables are ``(>= s, d)`` and
    sliced here, where the sequence is whole (under sequence parallelism a stage's input
    is only a shard of it)."""
    s = x.shape[1]
    cos = cos[None, :s, None, :].to(x.dtype)
    sin = sin[None, :s, None, :].to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


Rope = tuple[torch.Tensor, torch.Tensor] | None


class Attention(nn.Module):
    """Multi-head / grouped-query causal self-attention.

    ``recompute_core`` (set by selective activation checkpointing) recomputes the attention
    core -- RoPE, ``softmax(QK^T)V`` -- in the backward pass instead of keeping its
    activations: the part whose memory grows with the square of the sequence in the
    unfused formulation (Korthikanti et al. 2022). The q/k/v and output projections keep
    their activations.
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.head_dim = spec.head_dim
        self.grouped = spec.n_kv_heads != spec.n_heads
        self.dropout = spec.dropout
        self.wq = nn.Linear(spec.hidden, spec.q_dim, bias=spec.bias)
        self.wk = nn.Linear(spec.hidden, spec.kv_dim, bias=spec.bias)
        self.wv = nn.Linear(spec.hidden, spec.kv_dim, bias=spec.bias)
        self.wo = nn.Linear(spec.q_dim, spec.hidden, bias=spec.bias)
        self.recompute_core = False
        self.span = False
        """Run the core in the profiler span ``ptd:block`` (set by the measurement probe)."""
        self.cp = None
        """Context parallelism's core (:class:`ptd.runtime.parallel.cp.CPAttention`) or None."""

    def forward(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        if self.recompute_core and torch.is_grad_enabled():
            y = checkpoint(self._core_in_span, q, k, v, rope, use_reentrant=False)
        else:
            y = self._core_in_span(q, k, v, rope)
        return F.dropout(self.wo(y.reshape(b, s, -1)), self.dropout, self.training)

    def _core_in_span(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      rope: Rope) -> torch.Tensor:
        if not self.span:
            return self._core(q, k, v, rope)
        with block_span("ptd:block"):  # recomputed (selective) inside it too
            return self._core(q, k, v, rope)

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: Rope) -> torch.Tensor:
        if self.cp is not None:  # a zig-zag slice of the sequence: global positions, gathered K/V
            return self.cp(q, k, v, rope)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
            dropout_p=self.dropout if self.training else 0.0, enable_gqa=self.grouped)
        return y.transpose(1, 2)


class MLP(nn.Module):
    """GPT-2 ``w2(gelu(w1 x))`` or Llama SwiGLU ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.swiglu = spec.mlp == "swiglu"
        self.w1 = nn.Linear(spec.hidden, spec.ffn_hidden, bias=spec.bias)
        self.w2 = nn.Linear(spec.ffn_hidden, spec.hidden, bias=spec.bias)
        self.w3 = nn.Linear(spec.hidden, spec.ffn_hidden, bias=spec.bias) if self.swiglu else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


def make_ffn(spec: ModelSpec) -> nn.Module:
    if spec.is_moe:
        from .moe import MoE  # router, grouped experts, auxiliary losses
        return MoE(spec)
    return MLP(spec)

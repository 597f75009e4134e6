"""A decoder-only transformer built from a :class:`~ptd.specs.ModelSpec`.

nanoGPT-plain on purpose; the structure is what the parallel dimensions rely on:

* blocks live in an ``nn.ModuleDict`` keyed by layer index (``layers["0"]`` ...). A pipeline
  stage deletes the blocks it does not own and sets ``tok_embeddings``/``norm``/``output``
  to ``None``; parameter names stay those of the whole model (checkpoints and the
  layout-independent initialisation address parameters by these names), and ``forward``
  skips whatever is ``None`` -- a middle stage maps hidden states to hidden states;
* the model is built on the ``meta`` device (no memory, any size), parallelised there, and
  only then materialised and initialised (:mod:`ptd.runtime.model.init`);
* activation checkpointing is a per-block switch (``Block.recompute``), not a wrapper
  module, so it does not change parameter names either.

Its parameter count equals ``ModelSpec.param_count()`` exactly (tested for every preset), plus
the vocabulary's padding rows (:meth:`ModelSpec.padded_vocab`), which are masked out of the
logits (:func:`mask_vocab_padding`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from ..measure.spans import block_span
from torch.utils.checkpoint import checkpoint

from ...specs import ModelSpec
from .layers import Attention, Rope, make_ffn, make_norm, rope_tables


class Block(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))`` then ``x + ffn(norm(x))``.

    ``recompute``: ``"none"``; ``"full"`` recomputes the whole block in backward (keeps only
    its input); ``"selective"`` recomputes only the attention core (see :class:`Attention`).
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.attention_norm = make_norm(spec)
        self.attention = Attention(spec)
        self.ffn_norm = make_norm(spec)
        self.feed_forward = make_ffn(spec)
        self.dropout = spec.dropout
        self.recompute = "none"
        self.span = False
        """Run in the profiler span ``ptd:block`` (set by the measurement probe)."""

    def set_recompute(self, mode: str) -> None:
        self.recompute = mode
        self.attention.recompute_core = mode == "selective"

    def forward(self, x: torch.Tensor, rope: Rope = None) -> torch.Tensor:
        if self.recompute == "full" and torch.is_grad_enabled():
            return checkpoint(self._forward_in_span, x, rope, use_reentrant=False)
        return self._forward_in_span(x, rope)

    def _forward_in_span(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:
        # Inside the checkpoint, so that a recomputation in the backward runs in the span
        # too: that is how the measured timeline tells recompute from backward.
        if not self.span:
            return self._forward(x, rope)
        with block_span("ptd:block"):
            return self._forward(x, rope)

    def _forward(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rope)
        ffn = self.feed_forward(self.ffn_norm(x))
        return x + F.dropout(ffn, self.dropout, self.training)


def _embedding(n: int, dim: int) -> nn.Embedding:
    # Left uninitialised, as every weight here is until ptd.runtime.model.init fills it: on the meta
    # device nn.Embedding's own normal_ imports torch._dynamo, ~2 s of CPU per worker (measured).
    return nn.Embedding(n, dim, _weight=torch.empty(n, dim))


class Transformer(nn.Module):
    """Token ids ``(b, s)`` -> logits ``(b, s, vocab)`` (or hidden states on a pipeline
    stage without the output layer)."""

    def __init__(self, spec: ModelSpec, vocab_rows: int | None = None) -> None:
        """``vocab_rows``: rows of the embedding and output matrices, the vocabulary padded
        for tensor parallelism (``spec.padded_vocab(tp)``); by default ``padded_vocab(1)``."""
        super().__init__()
        self.spec = spec
        rows = vocab_rows or spec.padded_vocab(1)
        if rows < spec.vocab_size:
            raise ValueError(f"vocab_rows {rows} < vocab_size {spec.vocab_size}")
        self.tok_embeddings: nn.Embedding | None = _embedding(rows, spec.hidden)
        self.pos_embeddings: nn.Embedding | None = (
            _embedding(spec.max_seq_len, spec.hidden) if spec.position == "learned" else None)
        self.layers = nn.ModuleDict({str(i): Block(spec) for i in range(spec.n_layers)})
        self.norm: nn.Module | None = make_norm(spec)
        self.output: nn.Linear | None = nn.Linear(spec.hidden, rows, bias=False)
        if spec.position == "rope":
            # Not parameters: recomputed by init_buffers() after materialisation, never saved.
            # Not computed on the meta device: arange there imports torch._dynamo (~2 s).
            shape = (spec.max_seq_len, spec.head_dim)
            self.register_buffer("rope_cos", torch.empty(shape), persistent=False)
            self.register_buffer("rope_sin", torch.empty(shape), persistent=False)
            if self.rope_cos.device.type != "meta":
                self.init_buffers()
        else:
            self.rope_cos = self.rope_sin = None
        self.tie_weights()

    def tie_weights(self) -> None:
        """GPT-2 style: the output layer is the embedding matrix. Tying is lost when
        parameters are replaced (``to_empty``), so materialisation calls this again."""
        if self.spec.tied_embeddings and self.output is not None and self.tok_embeddings is not None:
            self.output.weight = self.tok_embeddings.weight

    @torch.no_grad()
    def init_buffers(self) -> None:
        """Fill the non-parameter buffers (RoPE tables) on whatever device they now live."""
        if self.rope_cos is not None:
            cos, sin = rope_tables(self.spec.head_dim, self.spec.max_seq_len, self.spec.rope_theta,
                                   self.rope_cos.device)
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = tokens
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(tokens)
            if self.pos_embeddings is not None:
                h = h + self.pos_embeddings(torch.arange(tokens.shape[1], device=tokens.device))
            h = F.dropout(h, self.spec.dropout, self.training)
        # Whole tables: attention slices them to its (whole) sequence length.
        rope = (self.rope_cos, self.rope_sin) if self.rope_cos is not None else None
        for layer in self.layers.values():
            h = layer(h, rope)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
            # (2-D tensor parallelism's output layer masks its own vocabulary block)
            if (self.output.out_features > self.spec.vocab_size
                    and not getattr(self.output, "masks_vocab_padding", False)):
                h = mask_vocab_padding(h, self.spec.vocab_size)
        return h


def tied_copy(model: nn.Module) -> nn.Parameter | None:
    """The output layer's weight when it is a *copy* of a tied embedding: a pipeline's last
    stage on another rank than the first holds the output layer without the embedding
    (Megatron-LM keeps such a copy too). Both copies start equal (seeded by the embedding's
    name), their gradients are summed (:class:`ptd.runtime.parallel.pp.TiedEmbeddingGrads`),
    so they stay equal; the copy is counted once -- left out of the gradient norm, the
    parameter count and weight decay, as the single tensor it stands for."""
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module  # (DDP)
    spec = getattr(model, "spec", None)
    if (spec is None or not spec.tied_embeddings or getattr(model, "output", None) is None
            or getattr(model, "tok_embeddings", "absent") is not None):
        return None
    return model.output.weight


VOCAB_PARAMS = ("tok_embeddings.weight", "output.weight")
"""The tensors with a row per vocabulary entry (and the padding rows)."""


def is_vocab_tensor(name: str) -> bool:
    """Does a parameter (or optimizer-state) name address a vocabulary tensor?"""
    return any(f".{p}." in f".{name}." for p in VOCAB_PARAMS)


def fit_vocab_rows(t: torch.Tensor, rows: int, vocab: int) -> torch.Tensor:
    """``t``'s first ``vocab`` rows (the real vocabulary) padded with zero rows, or cut, to
    ``rows``: a vocabulary tensor moved between paddings (another tp, an export, an import)."""
    if t.shape[0] == rows:
        return t
    out = t.new_zeros((rows, *t.shape[1:]))
    out[:vocab] = t[:vocab]
    return out


def mask_vocab_padding(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Logits with the padding columns (global index ``>= vocab``) set to -inf, so that the
    softmax gives them probability 0 and the backward gives their output rows gradient 0.

    Under tensor parallelism the logits are a ``DTensor`` sharded evenly on the vocabulary
    (the padded size divides by tp): each rank masks the padding inside its own slice, a
    suffix of it or all of it (the last ranks when the padding exceeds a shard)."""
    from torch.distributed.tensor import DTensor
    if isinstance(logits, DTensor):
        local = logits.to_local()
        offset = logits.device_mesh.get_local_rank() * local.shape[-1]
        masked = _mask_from(local, vocab - offset)
        return DTensor.from_local(masked, logits.device_mesh, logits.placements, run_check=False,
                                  shape=logits.shape, stride=logits.stride())
    return _mask_from(logits, vocab)


def _mask_from(x: torch.Tensor, first: int) -> torch.Tensor:
    """``x`` with its last-dimension columns from ``first`` on set to -inf (out of place)."""
    n = x.shape[-1]
    if first >= n:
        return x
    keep = torch.arange(n, device=x.device) < max(first, 0)
    return x.masked_fill(~keep, float("-inf"))


def build_model(spec: ModelSpec, device: torch.device | str = "meta", tp: int = 1) -> Transformer:
    """The whole model on ``device`` (``meta`` by default: shapes only, no memory), its
    vocabulary padded for tensor parallelism ``tp`` (:meth:`ModelSpec.padded_vocab`).

    On a real device the weights are *not* initialised; call
    :func:`ptd.runtime.model.init.materialize` (which also handles the meta case)."""
    with torch.device(device):
        return Transformer(spec, spec.padded_vocab(tp))


def lm_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum (not mean) of next-token cross-entropy, in fp32 whatever the compute dtype: the
    caller divides by the tokens of the whole step, so that losses of micro-batches,
    replicas and pipeline stages add up to the mean over the global batch."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum")

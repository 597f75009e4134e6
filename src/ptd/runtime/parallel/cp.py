"""Context parallelism: every sequence split over the ``cp`` ranks of a group.

Placement (:mod:`ptd.specs.layout`): cp peers are ``tp`` ranks apart, between the
data-parallel and tensor-parallel axes. The data loader and the loss see whole sequences;
:class:`SplitSequences` cuts each micro-batch after loading into ``2*cp`` chunks of
``seq_len / (2*cp)`` tokens and gives cp rank ``i`` chunks ``i`` and ``2*cp-1-i`` (the
load-balanced split of Llama 3, Dubey et al. 2024, section 3.3.2, and Megatron-Core):
under the causal mask every rank then does the same attention work.

Attention (:class:`CPAttention`, hooked into :class:`ptd.runtime.model.layers.Attention`):

* RoPE rotates each token by its *global* position;
* ring attention: K and V (stacked, one message) pass around the cp group in ``cp - 1``
  steps (:class:`_RingShift`, send to the next rank, receive from the previous; in backward
  the K/V gradients travel the other way, accumulating every rank's contribution on the
  way home), so at step ``j`` a rank holds the K/V of rank ``rank - j``;
* each local query chunk ``a`` attends to the global K/V chunks ``b <= a`` one block pair
  at a time -- ``b < a`` unmasked, ``b == a`` with the causal triangle, ``b > a`` skipped
  (with the zig-zag split every ring step brings each rank some work) -- in fp32 with an
  explicit softmax that also returns its log-sum-exp; the partial outputs are merged by
  log-sum-exp weights
  (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax"; Liu et al. 2023,
  "Ring Attention", section 3).

Loss and gradients: each rank's loss is the token sum over its slice divided by its slice's
token count, and gradients are averaged over the ``dp x cp`` ranks (cp joins dp for
gradient reduction, as in Megatron-Core and torchtitan); since all slices hold the same
number of tokens this is the mean over all tokens of the global batch.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
import torch.distributed as dist

from ..data.loader import MicroBatch


def zigzag_positions(local_len: int, cp: int, rank: int, device: Any = None) -> torch.Tensor:
    """Global positions of the ``local_len`` tokens cp rank ``rank`` holds (chunks ``rank``
    and ``2*cp-1-rank`` of a sequence of ``local_len * cp`` tokens)."""
    c = local_len // 2
    first = torch.arange(rank * c, (rank + 1) * c, device=device)
    last = torch.arange((2 * cp - 1 - rank) * c, (2 * cp - rank) * c, device=device)
    return torch.cat([first, last])


def split_sequence(x: torch.Tensor, cp: int, rank: int) -> torch.Tensor:
    """This rank's zig-zag slice of ``x`` along dimension 1 (the sequence)."""
    chunks = x.chunk(2 * cp, dim=1)
    return torch.cat([chunks[rank], chunks[2 * cp - 1 - rank]], dim=1).contiguous()


class _RingShift(torch.autograd.Function):
    """One step of the ring: send ``x`` to the next rank of the cp group and return what the
    previous rank sent (``batch_isend_irecv``: both posted at once, so no rank waits on
    another's send). Backward: the gradient travels the other way round."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup, nxt: int, prev: int) -> torch.Tensor:
        ctx.group, ctx.nxt, ctx.prev = group, nxt, prev
        return _exchange(x, group, to=nxt, frm=prev)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return _exchange(grad, ctx.group, to=ctx.prev, frm=ctx.nxt), None, None, None


def _exchange(x: torch.Tensor, group: dist.ProcessGroup, to: int, frm: int) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    ops = [dist.P2POp(dist.isend, x, to, group), dist.P2POp(dist.irecv, out, frm, group)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return out


def _block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of one block pair in fp32: output and log-sum-exp per query."""
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    return torch.exp(s - lse) @ v, lse


def merge(parts: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Combine partial attention outputs over disjoint key sets by their log-sum-exps."""
    lse = torch.logsumexp(torch.stack([p[1] for p in parts]), dim=0)
    return sum(torch.exp(l - lse) * o for o, l in parts)  # type: ignore[return-value]


class CPAttention:
    """The attention core of one rank of a cp group (see the module docstring)."""

    def __init__(self, group: dist.ProcessGroup, rank: int, size: int) -> None:
        self.group, self.rank, self.size = group, rank, size
        # global ranks of the group's members (point-to-point ops name global ranks)
        self.ranks = [dist.get_global_rank(group, i) for i in range(size)] if size > 1 else [0]

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """``q, k, v``: ``(b, s_local, heads, d)`` of this rank's zig-zag slice; returns the
        attention output in the same layout and dtype as ``q``."""
        from ..model.layers import apply_rope
        n, cp = q.shape[1], self.size
        if rope is not None:
            pos = zigzag_positions(n, cp, self.rank, q.device)
            cos, sin = rope[0][pos], rope[1][pos]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        held = {self.rank: torch.stack([k, v])}  # K/V by the cp rank they came from
        cur = held[self.rank]
        for j in range(1, cp):
            cur = _RingShift.apply(cur, self.group, self.ranks[(self.rank + 1) % cp],
                                   self.ranks[(self.rank - 1) % cp])
            held[(self.rank - j) % cp] = cur
        rep = q.shape[2] // k.shape[2]  # grouped-query attention: kv head i // rep
        c, acc = n // 2, torch.promote_types(q.dtype, torch.float32)  # at least fp32 softmax
        # global chunk g sits on rank min(g, 2cp-1-g), in its first half if g < cp
        kc, vc = [], []
        for g in range(2 * cp):
            r, half = (g, 0) if g < cp else (2 * cp - 1 - g, 1)
            kv = held[r][:, :, half * c:(half + 1) * c]
            kv = kv.repeat_interleave(rep, dim=3) if rep > 1 else kv
            kc.append(kv[0].transpose(1, 2).to(acc))
            vc.append(kv[1].transpose(1, 2).to(acc))
        out = []
        for half, g in enumerate((self.rank, 2 * cp - 1 - self.rank)):
            qa = q[:, half * c:(half + 1) * c].transpose(1, 2).to(acc)
            out.append(merge([_block(qa, kc[b], vc[b], causal=b == g) for b in range(g + 1)]))
        return torch.cat(out, dim=2).transpose(1, 2).to(q.dtype)


def apply_cp(model: torch.nn.Module, group: dist.ProcessGroup, rank: int, size: int) -> None:
    """Route every attention core of ``model`` through :class:`CPAttention`."""
    from ..model.layers import Attention
    core = CPAttention(group, rank, size)
    for m in model.modules():
        if isinstance(m, Attention):
            m.cp = core


def dp_cp_group(plan: Any) -> dist.ProcessGroup:
    """The group of ranks that share this rank's pp and tp index (its dp x cp replicas),
    over which gradients are averaged. Every rank creates every such group (new_group is
    collective), in the same order."""
    from ...specs.layout import coords, rank_of
    mine = None
    me = dist.get_rank()
    for pp in range(plan.pp):
        for tp in range(plan.tp):
            ranks = [rank_of(pp, d, tp, plan, c) for d in range(plan.dp) for c in range(plan.cp)]
            g = dist.new_group(ranks)
            if me in ranks:
                mine = g
    assert mine is not None and coords(me, plan)  # every rank is in exactly one group
    return mine


class SplitSequences:
    """A :class:`~ptd.runtime.runner.StepRunner` that hands the inner runner this rank's
    zig-zag slice of every micro-batch (inputs and targets alike)."""

    def __init__(self, inner: Any, cp: int, rank: int) -> None:
        self.inner, self.cp, self.rank = inner, cp, rank
        self.reports_loss = inner.reports_loss

    def _split(self, mbs: Sequence[MicroBatch]) -> list[MicroBatch]:
        return [MicroBatch(split_sequence(mb.inputs, self.cp, self.rank),
                           split_sequence(mb.targets, self.cp, self.rank)) for mb in mbs]

    def forward_backward(self, micro_batches: Sequence[MicroBatch]) -> torch.Tensor:
        return self.inner.forward_backward(self._split(micro_batches))

    def evaluate(self, micro_batches: Sequence[MicroBatch]) -> torch.Tensor:
        return self.inner.evaluate(self._split(micro_batches))

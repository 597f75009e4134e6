"""2-D tensor parallelism (``--tp-mode 2d``): Optimus (Xu et al. 2021, arXiv 2104.05343) on a
``q x q`` mesh, ``tp = q^2``, with explicit collectives on the mesh's row and column groups.

Layout. Tensor-parallel rank ``t = r*q + c`` sits in mesh row ``r`` and column ``c``
(:attr:`ParallelDims.tp2d_mesh`, axes ``("tpr", "tpc")``). Every activation of the residual
stream ``(batch, seq, hidden)`` is split batch over rows and hidden over columns: rank
``(r, c)`` holds ``[b/q, s, h/q]``. Every matrix ``W (in, out)`` is split in ``q x q``
blocks, block ``(r, c)`` = input rows ``r``, output columns ``c`` (``nn.Linear`` stores
``(out, in)``, so its placements are ``[Shard(1), Shard(0)]`` on ``("tpr", "tpc")``); the
embedding ``(V, h)`` is split vocabulary over rows and hidden over columns. Norm weights and
biases are split over columns only (replicated over rows). Parameters are ``DTensor``
objects on the 2-D mesh, so initialisation by name, full state dicts, the global gradient
norm and DCP checkpoints see whole tensors (checkpoints reshard to and from 1-D layouts).

One linear ``Y = X W`` on rank ``(r, c)``, ``X`` block ``[b/q, in/q]``, ``W`` block ``[in/q, out/q]``:

* forward: all-gather ``X`` over the row (the ``q`` ranks ``(r, *)``) to ``[b/q, in]``,
  all-gather ``W`` over the column (``(*, c)``) to ``[in, out/q]``, one local product to
  ``Y`` block ``[b/q, out/q]`` -- the same layout as ``X``, so linears chain;
* backward: ``dX = dY W^T`` is partial over the row (a sum over ``out``): reduce-scatter
  over the row; ``dW = X^T dY`` is partial over the column (a sum over the batch rows):
  reduce-scatter over the column.

SUMMA (Optimus) broadcasts ``X``'s blocks along rows and ``W``'s along columns in ``q``
steps; those ``q`` broadcasts move what one all-gather moves, so these are SUMMA's bytes in
two collectives (its backward's reduces: the reduce-scatters), holding a gathered operand.

q/k/v column blocks hold whole heads (``n_heads``, ``n_kv_heads`` divisible by ``q``):
attention runs locally on ``[b/q, heads/q]``. Norms all-reduce their partial sums (of
squares) over the row. Logits come as ``[b/q, s, V/q]``; the cross-entropy all-reduces the
max, the sum of exponentials and the target logit over the row (:func:`loss_sum_2d`).

Gradients of row-replicated parameters (norms, biases, learned positions) are partial over
the rows (each row saw its own batch slice): their ``to_local`` declares the gradient
``Partial`` on ``tpr``, and the runner's :class:`~.tp.AlignTPGrads` all-reduces them to the
parameter's placement before the dp average and the global norm. Limits:
:func:`ptd.runtime.launch.limits.tp2d_problem`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

from ...specs import ParallelPlan
from ..model.layers import RMSNorm
from ..model.transformer import _mask_from


@dataclass
class Grid:
    """This rank's place on the ``q x q`` mesh and its two groups."""

    mesh: DeviceMesh
    q: int
    r: int
    c: int
    row: dist.ProcessGroup  # the q ranks (r, *), mesh axis tpc: they share a batch slice
    col: dist.ProcessGroup  # the q ranks (*, c), mesh axis tpr: they share a hidden slice

    @classmethod
    def of(cls, mesh: DeviceMesh) -> "Grid":
        q = mesh.size(0)
        return cls(mesh, q, mesh.get_local_rank("tpr"), mesh.get_local_rank("tpc"),
                   mesh.get_group("tpc"), mesh.get_group("tpr"))

    def rows_of(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's batch slice (dim 0) of a whole micro-batch tensor."""
        n = t.shape[0] // self.q
        return t[self.r * n:(self.r + 1) * n]


# ------------------------------------------------------------------ collectives with autograd
def _gather(x: torch.Tensor, dim: int, group: dist.ProcessGroup, q: int) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(q)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim)


def _reduce_scatter(x: torch.Tensor, dim: int, group: dist.ProcessGroup, q: int) -> torch.Tensor:
    chunks = [t.contiguous() for t in x.chunk(q, dim)]
    out = torch.empty_like(chunks[0])
    dist.reduce_scatter(out, chunks, group=group)
    return out


class _AllGather(torch.autograd.Function):
    """All-gather along ``dim`` whose result each rank uses differently (its own blocks):
    the gradient is the sum of every rank's, scattered back (reduce-scatter)."""

    @staticmethod
    def forward(ctx, x, dim, group, q):  # type: ignore[no-untyped-def,override]
        ctx.dim, ctx.group, ctx.q = dim, group, q
        return _gather(x, dim, group, q)

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def,override]
        return _reduce_scatter(g, ctx.dim, ctx.group, ctx.q), None, None, None


class _AllReduce(torch.autograd.Function):
    """Sum of partial sums whose result each rank uses on its own block (norms): the
    gradient of every partial is the sum of the ranks' gradients (all-reduce again)."""

    @staticmethod
    def forward(ctx, x, group):  # type: ignore[no-untyped-def,override]
        ctx.group, x = group, x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def,override]
        dist.all_reduce(g := g.contiguous().clone(), group=ctx.group)
        return g, None


class _SumReplicated(torch.autograd.Function):
    """Sum over a group of values every rank then uses *identically* (the rows' losses):
    each rank back-propagates the same gradient, already each part's -- identity backward."""

    @staticmethod
    def forward(ctx, x, group):  # type: ignore[no-untyped-def,override]
        return _AllReduce.forward(ctx, x, group)

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def,override]
        return g, None


# ------------------------------------------------------------------ modules (swapped in place)
def _local(p: torch.Tensor, row_partial: bool = False) -> torch.Tensor:
    """This rank's block of ``p``; ``row_partial``: ``p`` is replicated over the rows, whose
    gradients are partial sums (each row saw its own batch slice)."""
    if not isinstance(p, DTensor):
        return p
    if row_partial:
        return p.to_local(grad_placements=(Partial(), *p.placements[1:]))
    return p.to_local()


class Linear2D(nn.Linear):
    """``nn.Linear`` on 2-D blocks (see the module docstring); names and shapes unchanged."""

    grid: Grid

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.grid
        x_row = _AllGather.apply(x, -1, g.row, g.q)                      # [b/q, s, in]
        w_col = _AllGather.apply(_local(self.weight), 1, g.col, g.q)     # (out/q, in)
        b = _local(self.bias, row_partial=True) if self.bias is not None else None
        return F.linear(x_row, w_col, b)


class Output2D(Linear2D):
    """The output layer: logits ``[b/q, s, V/q]`` with the vocabulary's padding columns
    (global index ``>= vocab``) at -inf, as :func:`~ptd.runtime.model.transformer.mask_vocab_padding`
    does for 1-D."""

    masks_vocab_padding = True
    vocab: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return _mask_from(y, self.vocab - self.grid.c * y.shape[-1])


class TokenEmbedding2D(nn.Embedding):
    """Table ``(V, h)`` in blocks (vocabulary over rows, hidden over columns): gathered over
    the column to ``[V, h/q]``, looked up for this row's batch slice -> ``[b/q, s, h/q]``."""

    grid: Grid

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        g = self.grid
        table = _AllGather.apply(_local(self.weight), 0, g.col, g.q)
        return F.embedding(g.rows_of(tokens), table)


class PositionEmbedding2D(nn.Embedding):
    """Learned positions ``(S, h)``: hidden over columns, replicated over rows."""

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return F.embedding(positions, _local(self.weight, row_partial=True))


class RMSNorm2D(RMSNorm):
    grid: Grid

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, h = self.grid, self.weight.shape[0]
        xf = x.float()
        ss = _AllReduce.apply(xf.pow(2).sum(-1, keepdim=True), g.row)
        y = xf * torch.rsqrt(ss / h + self.eps)
        return (y * _local(self.weight, row_partial=True)).to(x.dtype)


class LayerNorm2D(nn.LayerNorm):
    grid: Grid

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, h = self.grid, self.normalized_shape[0]
        xf = x.float()
        mean = _AllReduce.apply(xf.sum(-1, keepdim=True), g.row) / h
        xc = xf - mean
        var = _AllReduce.apply(xc.pow(2).sum(-1, keepdim=True), g.row) / h
        y = xc * torch.rsqrt(var + self.eps) * _local(self.weight, row_partial=True)
        if self.bias is not None:
            y = y + _local(self.bias, row_partial=True)
        return y.to(x.dtype)


def _shard(module: nn.Module, name: str, grid: Grid, placements: tuple) -> None:
    if (p := getattr(module, name)) is None:
        return
    d = distribute_tensor(p.data, grid.mesh, placements, src_data_rank=None)  # meta: local slices
    setattr(module, name, nn.Parameter(d, requires_grad=p.requires_grad))


def apply_tp2d(model: nn.Module, mesh: DeviceMesh, plan: ParallelPlan) -> Grid:
    """Split ``model``'s parameters over the 2-D ``mesh`` (``("tpr", "tpc")``, ``q x q``) in
    place, on the meta device, and swap its linears, embeddings and norms for their 2-D
    forms (same parameter names). Returns the grid the loss needs (:func:`loss_sum_2d`)."""
    grid = Grid.of(mesh)
    assert grid.q * grid.q == plan.tp, (grid.q, plan.tp)
    blocks = (Shard(1), Shard(0))          # nn.Linear (out, in): in over rows, out over columns
    cols = (Replicate(), Shard(0))         # vectors over the output/hidden features
    for mod in list(model.modules()):
        if isinstance(mod, nn.Linear):
            _shard(mod, "weight", grid, blocks)
            _shard(mod, "bias", grid, cols)
            mod.__class__ = Output2D if mod is model.output else Linear2D
            mod.vocab = model.spec.vocab_size  # (read by Output2D only)
        elif isinstance(mod, nn.Embedding):
            if mod is model.tok_embeddings:
                _shard(mod, "weight", grid, (Shard(0), Shard(1)))
                mod.__class__ = TokenEmbedding2D
            else:  # learned positions
                _shard(mod, "weight", grid, (Replicate(), Shard(1)))
                mod.__class__ = PositionEmbedding2D
        elif isinstance(mod, RMSNorm):
            _shard(mod, "weight", grid, cols)
            mod.__class__ = RMSNorm2D
        elif isinstance(mod, nn.LayerNorm):
            for name in ("weight", "bias"):
                _shard(mod, name, grid, cols)
            mod.__class__ = LayerNorm2D
        else:
            continue
        mod.grid = grid
    return grid


def loss_sum_2d(grid: Grid, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum of next-token cross-entropy over the whole micro-batch, in fp32, from this rank's
    logits block ``[b/q, s, V/q]`` (``targets``: the whole micro-batch's ``(b, s)``): the
    same value on every rank of the tp group, like ``lm_loss_sum`` of the whole logits."""
    local = logits.float().flatten(0, 1)
    t = grid.rows_of(targets).flatten()
    per_token = _VocabParallelCE.apply(local, t, grid.c * local.shape[-1], grid.row)
    return _SumReplicated.apply(per_token.sum(), grid.col)  # rows hold different sequences


class _VocabParallelCE(torch.autograd.Function):
    """Cross-entropy per token, logits ``[N, V/q]`` split over the row's ``q`` ranks (vocabulary
    columns ``offset .. offset + V/q``). The result is the same on the whole row, and so is
    its incoming gradient: each rank's logits gradient is ``(softmax - onehot) * g`` on its
    own columns, no communication."""

    @staticmethod
    def forward(ctx, logits, target, offset, group):  # type: ignore[no-untyped-def,override]
        n = logits.shape[-1]
        m = logits.max(-1).values
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        e = (logits - m[:, None]).exp()  # -inf (padding) -> 0
        se = e.sum(-1)
        dist.all_reduce(se, group=group)
        idx = target - offset
        inside = (idx >= 0) & (idx < n)
        idx = idx.clamp(0, n - 1)
        # where, not multiply: a padding column's -inf times 0 would be nan
        tl = torch.where(inside, logits.gather(1, idx[:, None]).squeeze(1), torch.zeros_like(m))
        dist.all_reduce(tl, group=group)
        ctx.save_for_backward(e / se[:, None], idx, inside)
        return se.log() + m - tl

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def,override]
        p, idx, inside = ctx.saved_tensors
        grad = p.clone()
        rows = torch.arange(grad.shape[0], device=grad.device)
        grad[rows, idx] -= inside.to(grad.dtype)
        return grad * g[:, None], None, None, None


"""Expert parallelism: the routed experts of every MoE layer split over ``ep`` ranks.

Placement (the rule :mod:`ptd.cost.moe` prices): ``ep`` is carved out of data parallelism.
A rank's data-parallel index ``d`` splits as ``d = r * ep + e``: the ``ep`` consecutive
data-parallel ranks ``r*ep .. r*ep+ep-1`` (same pipeline stage and tensor-parallel index,
``tp`` apart in global rank) form an ep group and hold the ``n_experts`` experts between
them, ``n_experts / ep`` each (rank ``e`` of the group holds experts
``e*E/ep .. (e+1)*E/ep - 1``); ranks with the same ``e`` in the ``dp / ep`` groups hold the
same experts (the "edp" group). The mesh is :attr:`ParallelDims.ep_mesh`, shape
``(pp, dp/ep, ep, tp)``.

Forward of a layer (after the local router sorted this rank's assignments by expert):

1. ``all_to_all_single`` of the per-expert counts (no gradient) so each rank learns how many
   rows it receives from each peer for each of its experts;
2. ``all_to_all_single`` of the token rows with variable splits (:class:`EPAllToAll`, which
   makes it differentiable): rows for rank ``j``'s experts go to rank ``j``;
3. received rows (ordered by source rank, then expert) are regrouped by local expert, the
   grouped product runs, and the rows go back the same way (step 2 reversed).
The backward of each all-to-all is the all-to-all with the splits exchanged.

Experts are not tensor-sharded: under tp > 1 every tp rank of an ep group computes the same
experts on the same (replicated) tokens. Expert weights are ``DTensor`` ``Shard(0)`` on the
``ep`` axis, so initialisation by name, consolidated state dicts and DCP checkpoints see the
whole ``(E, in, out)`` tensor and reshard across ep degrees.

Gradients (:class:`EPGradSync`; no DDP, which cannot hold DTensors): non-expert parameters
are averaged over all ``dp`` replicas as usual. An expert's gradient on one rank already sums
the contributions of the tokens of its whole ep group (they were sent to it), so it is summed
over the ``dp/ep`` ranks holding the same experts and divided by ``dp`` -- the mean over the
global batch, as for every other parameter. Under ZeRO-1/2/3 FSDP does the same instead:
each layer's experts are an FSDP unit over the edp axis with the divide factor ``dp``
(:func:`ptd.runtime.parallel.fsdp.shard_experts`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor

from ..model.moe import GroupedExperts
from .ddp import GradAllReduce


def apply_ep(model: nn.Module, ep_mesh: DeviceMesh) -> None:
    """Shard every ``GroupedExperts``' weights over ``ep_mesh["ep"]`` (dim 0, the experts) in
    place, on the meta device (initialised later by name, like tensor-parallel shards)."""
    mesh = ep_mesh["ep"]
    for mod in model.modules():
        if isinstance(mod, GroupedExperts):
            for name, p in list(mod.named_parameters(recurse=False)):
                d = distribute_tensor(p.data, mesh, [Shard(0)], src_data_rank=None)
                setattr(mod, name, nn.Parameter(d, requires_grad=p.requires_grad))
            mod.ep_group = mesh.get_group()


def is_expert_param(name: str) -> bool:
    return ".experts." in name


def _regroup_index(recv: torch.Tensor) -> torch.Tensor:
    """Rows arrive ordered (source, expert); the index that reorders them (expert, source).
    ``recv``: ``(ep, local experts)`` row counts."""
    flat = recv.flatten()
    start = (torch.cumsum(flat, 0) - flat).view_as(recv).t().flatten()
    lens = recv.t().flatten()
    total = int(flat.sum())
    out_start = torch.cumsum(lens, 0) - lens
    return (torch.repeat_interleave(start - out_start, lens, output_size=total)
            + torch.arange(total, device=recv.device))


def expert_parallel_forward(experts: GroupedExperts, x: torch.Tensor, counts: torch.Tensor,
                            group: dist.ProcessGroup) -> torch.Tensor:
    """``x``: this rank's rows sorted by global expert, ``counts`` per global expert; returns
    the expert outputs in the same order (see the module docstring)."""
    ep = group.size()
    send = counts.view(ep, -1).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    in_splits, out_splits = send.sum(1).tolist(), recv.sum(1).tolist()
    xr = EPAllToAll.apply(x, out_splits, in_splits, group)
    idx = _regroup_index(recv).to(x.device)
    y = experts.compute(xr[idx], recv.sum(0))
    back = torch.zeros_like(y).index_copy(0, idx, y)  # (expert, source) -> (source, expert)
    return EPAllToAll.apply(back, in_splits, out_splits, group)


class EPAllToAll(torch.autograd.Function):
    """``dist.all_to_all_single`` with variable splits, differentiable: the backward sends
    the gradients back the way the rows came (splits exchanged).

    Not ``_functional_collectives.all_to_all_single_autograd``: on gloo its call took
    0.83-0.89 ms where ``dist.all_to_all_single`` of the same rows took 0.30 (2 ranks,
    1,024 x 64 fp32 rows, this CPU, 2026-11-27; ``docs/moe.md``), four times per MoE layer
    and micro-batch. Megatron-Core's token dispatcher is built the same way (an autograd
    function around ``all_to_all_single``)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int],  # type: ignore[override]
                group: dist.ProcessGroup) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return _all_to_all(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        out_splits, in_splits = ctx.splits
        return _all_to_all(grad, in_splits, out_splits, ctx.group), None, None, None


def _all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int],
                group: dist.ProcessGroup) -> torch.Tensor:
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


class EPGradSync:
    """Gradient averaging with expert parallelism (see the module docstring)."""

    def __init__(self, model: nn.Module, dp_group: dist.ProcessGroup, edp_group: dist.ProcessGroup,
                 dp: int) -> None:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.dense = GradAllReduce([p for n, p in named if not is_expert_param(n)], dp_group, dp)
        self.experts = GradAllReduce([p for n, p in named if is_expert_param(n)], edp_group, dp)

    def __call__(self) -> None:
        self.dense()
        self.experts()

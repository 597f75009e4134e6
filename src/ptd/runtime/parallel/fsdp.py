"""ZeRO-1, ZeRO-2 and ZeRO-3, all with FSDP2 (``fully_shard``) on the data-parallel mesh.

Under ZeRO-3 each transformer block is one FSDP unit (its parameters all-gathered together
just before use), then the root takes what is left (embeddings, final norm, output layer).
Under ZeRO-1/2 consecutive blocks are grouped into units of at least 25 MiB of fp32
parameters (:func:`bucket_blocks`, DDP's bucket size; a block of a billion-parameter model
is a unit on its own) and the root takes the remainder: fewer, larger collectives, each of
them a point where every rank waits for the others. On 4 gloo workers of a loaded 2-core CPU
(``small``, 4 blocks of 3 MB: one unit) the median step of per-block units was ~21% longer
than the former ZeroRedundancyOptimizer path's and one unit's level with it (a development
measurement, not a recorded benchmark: see docs/benchmarks.md, "Against other frameworks").
Parameters become ``DTensor`` shards (``Shard(0)`` of every tensor: even, flat sharding to
one row, like DeepSpeed's and Megatron's distributed optimizer); gradients are
reduce-scattered, and plain AdamW over the sharded parameters keeps 1/dp of the optimizer
states on every rank. The stages differ in what is held unsharded, and when:

* ZeRO-3 (``reshard_after_forward=True``): blocks are freed after the forward and gathered
  again for the backward (one extra all-gather per block, least memory).
* ZeRO-2 (``reshard_after_forward=False``): every block's parameters stay gathered from its
  forward until its backward -- the whole model's parameters at the peak, as the ZeRO
  paper's ``P_os+g`` holds them -- and gradients are reduce-scattered at every micro-step,
  so a rank keeps only its shard of them.
* ZeRO-1 (``reshard_after_forward=False`` too): gradient synchronisation is deferred to the
  last micro-step (:func:`ptd.runtime.parallel.gradient_sync`), so the unsharded gradients
  accumulate locally over the micro-steps before it, as ZeRO-1 keeps full gradients
  (``P_os``). With one micro-batch per step ZeRO-1 and ZeRO-2 run the same.

Under 1 and 2 the parameters also stay gathered between the micro-steps of one optimizer
step (``set_reshard_after_backward(False)`` before the last): one all-gather per block
per step, as ZeRO-1/2 gather the updated parameters once per step. Under ZeRO-3,
gradient accumulation turns gradient synchronisation off for all but the last micro-step
as ZeRO-1 does (fewer reduce-scatters, unsharded gradients held meanwhile). A pipeline
schedule defers FSDP's gradient sync to its last backward whatever the stage (torch's
``backward_maybe_with_nosync``), so under pp > 1 ZeRO-2 holds the full gradients of its
stages until then, as ZeRO-1 does.

bf16/fp16 use ``MixedPrecisionPolicy(param_dtype=..., reduce_dtype=fp32)``: compute and
all-gather in low precision, gradients reduced and stored in fp32. ``offload`` keeps the
sharded parameters, gradients and optimizer states in host memory (``CPUOffloadPolicy``):
the optimizer step runs on the CPU (ZeRO-3 only, a plan check).

On gloo, ``set_gradient_divide_factor`` must not be used (PREMUL_SUM is NCCL-only); the
default averaging over dp is what the loss normalisation expects anyway. Also on gloo, the
gradient reduce-scatter runs as an all-reduce of FSDP's flat buffer followed by taking this
rank's chunk (:class:`AllReduceScatter`, installed with FSDP2's ``set_custom_reduce_scatter``):
gloo's ``reduce_scatter_tensor`` took 48 ms for 12 MB on 4 workers of this 2-core machine
where its ``all_reduce`` of the same buffer took 25 ms (and the list ``reduce_scatter`` 37 ms).
NCCL keeps FSDP's own reduce-scatter.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
import torch.distributed as dist
from torch.distributed.fsdp import (CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy,
                                    fully_shard)
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
from torch.distributed.tensor import DTensor, Shard

from ...specs import ParallelPlan
from ..precision import DTYPES


def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh, plan: ParallelPlan, device: torch.device,
               roots: Sequence[nn.Module] = (), ep_mesh: DeviceMesh | None = None) -> nn.Module:
    """Shard ``model`` (on meta or real parameters) in place over ``dp_mesh`` for ZeRO stage
    ``plan.zero`` (1, 2 or 3; see the module docstring).

    ``roots``: a pipeline rank's stage modules when it runs several (views sharing
    ``model``'s modules): each becomes an FSDP root -- the module the schedule calls --
    over the embeddings/norm/output it holds, instead of ``model``.

    ``ep_mesh``: with expert parallelism (``ParallelDims.ep_mesh``), every MoE layer's
    routed experts become an FSDP unit of their own over its ``edp`` axis first (see
    :func:`shard_experts`)."""
    if plan.dtype == "fp32":
        mp = MixedPrecisionPolicy()
    else:
        mp = MixedPrecisionPolicy(param_dtype=DTYPES[plan.dtype], reduce_dtype=torch.float32)
    offload: OffloadPolicy = (CPUOffloadPolicy(pin_memory=device.type == "cuda") if plan.offload
                              else OffloadPolicy())
    gloo = dist.get_backend(dp_mesh.get_group()) == "gloo"
    if ep_mesh is not None:
        shard_experts(model, ep_mesh, plan, mp, offload, gloo)
    units: list[nn.Module | list[nn.Module]] = []
    for root in roots or [model]:
        blocks = list(root.layers.values())  # (a pipeline chunk: its own blocks)
        units += [[b] for b in blocks] if plan.zero >= 3 else bucket_blocks(blocks)
    units += list(roots or [model])  # each takes what is left: embeddings, norm, output
    for unit in units:
        fully_shard(unit, mesh=dp_mesh, reshard_after_forward=plan.zero >= 3, mp_policy=mp,
                    offload_policy=offload)
    if gloo:
        for unit in units:
            state = unit[0] if isinstance(unit, list) else unit  # a group's first module holds its state
            state.set_custom_reduce_scatter(AllReduceScatter())  # type: ignore[operator]
    for root in roots or [model]:
        root.ptd_zero = plan.zero  # read by gradient_sync (what a micro-step before the last keeps)
    return model


def shard_experts(model: nn.Module, ep_mesh: DeviceMesh, plan: ParallelPlan,
                  mp: MixedPrecisionPolicy, offload: OffloadPolicy, gloo: bool) -> None:
    """ZeRO with expert parallelism: each MoE layer's ``GroupedExperts`` (weights already
    ``DTensor`` ``Shard(0)`` over ``ep_mesh["ep"]``, :func:`~.ep.apply_ep`) becomes its own
    FSDP unit over ``ep_mesh["edp"]`` -- the ``dp / ep`` ranks that hold the same experts --
    before the blocks are sharded over dp (they then skip the experts' parameters). FSDP
    treats the ep axis like a tensor-parallel one (both are slices of ``ep_mesh``): the
    parameters become 2-D DTensors over ``(edp, ep)``, ``_StridedShard(0)`` over edp (this
    rank's experts split again by rows, like every FSDP shard) and ``Shard(0)`` over ep.

    Which dimension (:func:`expert_shard_dim`): the experts' (dim 0) when this rank's
    ``E / ep`` divide evenly over edp, else dim 1 when it does (even shards instead of whole
    experts on some ranks and none on others: 4 experts over edp 8 would leave half the
    ranks empty and the others a whole expert each), else dim 0 as ``torch.chunk`` splits it.

    Gradients: an expert's gradient on one rank already sums the tokens its ep group sent
    it, so the global-batch mean is the *sum* over edp divided by dp (not the mean over
    edp FSDP takes by default; :class:`~.ep.EPGradSync` at zero 0): the divide factor is
    set to dp. On gloo the reduce-scatter is :class:`AllReduceScatter` dividing by dp."""
    from ..model.moe import GroupedExperts
    edp = ep_mesh["edp"]

    def placement(p: nn.Parameter) -> Shard:
        return Shard(expert_shard_dim(tuple(p.shape), plan.ep, edp.size()))
    for mod in model.modules():
        if not isinstance(mod, GroupedExperts):
            continue
        fully_shard(mod, mesh=edp, reshard_after_forward=plan.zero >= 3, mp_policy=mp,
                    offload_policy=offload, shard_placement_fn=placement)
        mod.set_gradient_divide_factor(float(plan.dp))  # type: ignore[operator]
        if gloo:
            mod.set_custom_reduce_scatter(AllReduceScatter(divide_by=plan.dp))  # type: ignore[operator]


def expert_shard_dim(shape: tuple[int, ...], ep: int, edp: int) -> int:
    """The dimension FSDP shards a stacked expert tensor of global ``shape`` ``(E, ...)`` on
    over ``edp`` ranks (see :func:`shard_experts`); ``ptd.cost.params.expert_shard_dim``
    is the same rule."""
    if (shape[0] // ep) % edp and len(shape) > 1 and shape[1] % edp == 0:
        return 1
    return 0


UNIT_BYTES = 25 * 1024 * 1024  # DDP's bucket size; ptd.cost.params.ZERO12_UNIT_BYTES


def bucket_blocks(blocks: list[nn.Module], unit_bytes: int | None = None) -> list[list[nn.Module]]:
    """ZeRO-1/2's FSDP units: consecutive blocks grouped until a group holds ``unit_bytes``
    (:data:`UNIT_BYTES`; the environment's ``PTD_FSDP_UNIT_BYTES`` if set, which the tests
    use to run small models one block per unit) of fp32 parameters; the last group, if
    smaller, is left to the root. One gather and one reduce-scatter per unit and step: a
    model of a few megabytes is one unit, a billion-parameter one a unit per block (see the
    module docstring)."""
    if unit_bytes is None:
        unit_bytes = int(os.environ.get("PTD_FSDP_UNIT_BYTES", UNIT_BYTES))
    groups: list[list[nn.Module]] = []
    current: list[nn.Module] = []
    size = 0
    for b in blocks:
        current.append(b)
        size += 4 * sum((p.to_local() if isinstance(p, DTensor) else p).numel()
                        for p in _unit_params(b))
        if size >= unit_bytes:
            groups.append(current)
            current, size = [], 0
    return groups  # (``current``: fewer bytes than a unit, the root's)


def _unit_params(block: nn.Module) -> list[nn.Parameter]:
    """``block``'s parameters not already in an FSDP unit of a submodule (the experts under
    ep, :func:`shard_experts`): those its own unit would take."""
    inner = {id(p) for m in block.modules() if m is not block and isinstance(m, FSDPModule)
             for p in m.parameters()}
    return [p for p in block.parameters() if id(p) not in inner]


class AllReduceScatter(ReduceScatter):
    """FSDP2's gradient reduce-scatter done as an all-reduce of its flat input (rank ``r``'s
    shard is the ``r``-th of ``world`` equal chunks) and a copy of this rank's chunk: the
    same result, in less time on gloo (see the module docstring). In place on the input
    buffer, which FSDP frees right after, so it costs no memory.

    ``divide_by``: for units with a gradient divide factor (:func:`shard_experts`), which
    FSDP asks of the collective as ``PREMUL_SUM`` (NCCL only): the sum divided by it."""

    def __init__(self, divide_by: int | None = None) -> None:
        self.divide_by = divide_by

    def allocate(self, size, *, dtype, device):  # type: ignore[no-untyped-def]
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op, async_op: bool = False) -> None:  # type: ignore[no-untyped-def]
        # gloo sums; the mean (or FSDP's divide factor) is taken on the chunk
        if op == dist.ReduceOp.SUM or op == dist.ReduceOp.MAX or op == dist.ReduceOp.MIN:
            divisor = None
        elif op == dist.ReduceOp.AVG:
            divisor = group.size()
        elif self.divide_by is not None:  # PREMUL_SUM(1 / divide_by)
            divisor = self.divide_by
        else:
            raise ValueError(f"AllReduceScatter: reduce op {op} on gloo needs divide_by")
        dist.all_reduce(input_tensor, op=op if divisor is None else dist.ReduceOp.SUM, group=group)
        mine = input_tensor.view(group.size(), -1)[group.rank()]
        if divisor is not None:
            torch.div(mine, divisor, out=output_tensor)
        else:
            output_tensor.copy_(mine)

"""The process group and the one ``DeviceMesh`` of a run.

The mesh has shape :func:`ptd.specs.layout.mesh_shape` and axis names ``("pp", "dp",
"cp", "tp")``: the same row-major placement the cost model prices (tensor-parallel peers are
consecutive ranks). Every parallel dimension takes its sub-mesh or process group from
:class:`ParallelDims`; nothing else in the runtime computes rank arithmetic.

Backend and device are chosen automatically: NCCL on ``cuda:LOCAL_RANK`` when CUDA is
available, else gloo on the CPU. Under torchrun the rank and world come from its
environment; a plain single process (``ptd train --nproc 1``) gets a one-rank gloo group on
an in-memory store, so it runs exactly the code path of a distributed run.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ...errors import PtdError
from ...specs import ParallelPlan
from ...specs.layout import AXES, Axis, coords, mesh_shape


def rng_stream(rank: int, tp: int) -> int:
    """:attr:`ParallelDims.rng_stream` of global ``rank`` (tp peers are consecutive ranks)."""
    return rank // tp


def stream_seed(seed: int, stream: int, step: int = 0) -> int:
    """The seed of random ``stream`` at ``step``: at the start of a run (step 0) and after a
    resume onto another layout, where saved RNG states no longer belong to anyone."""
    return ((seed * 100_003 + stream) * 1_000_003 + step) & ((1 << 63) - 1)


@dataclass
class ParallelDims:
    """Who this rank is, where it sits in the grid, and the mesh to build groups from."""

    plan: ParallelPlan
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    mesh: DeviceMesh
    ep_mesh: DeviceMesh | None = None
    """With expert parallelism: the same ranks as ``(pp, edp, ep, tp)``, dp split as
    ``dp = edp * ep`` with ep innermost (see :mod:`ptd.runtime.parallel.ep`)."""
    tp2d_mesh: DeviceMesh | None = None
    """With ``tp_mode = "2d"``: this rank's tensor-parallel ranks as a ``q x q`` mesh, axes
    ``("tpr", "tpc")``, row-major (tp rank ``r*q + c`` in row ``r``, column ``c``); see
    :mod:`ptd.runtime.parallel.tp2d`."""

    @property
    def coords(self) -> dict[Axis, int]:
        return coords(self.rank, self.plan)

    @property
    def dp_rank(self) -> int:
        return self.coords["dp"]

    @property
    def dp_size(self) -> int:
        return self.plan.dp

    @property
    def rng_stream(self) -> int:
        """Which random stream (dropout masks) this rank draws from: one per pipeline rank,
        data-parallel replica and context-parallel slice, the same for tensor-parallel peers,
        whose replicated activations (the residual stream, the embedding) need the same
        masks (Megatron-LM seeds its default generator so too). Under 2-D tensor parallelism
        no activation is replicated over the tp group (each rank holds its own block), so
        every rank draws its own stream: shared masks would repeat one pattern in every block."""
        if self.plan.tp_mode == "2d":
            return self.rank
        return rng_stream(self.rank, self.plan.tp)

    def seed_rng(self, seed: int, step: int = 0) -> None:
        """Seed this rank's generator for its :attr:`rng_stream` at ``step`` (the start of a
        run, or a resume onto another layout)."""
        torch.manual_seed(stream_seed(seed, self.rng_stream, step))

    @property
    def is_main(self) -> bool:
        """Rank 0 writes files and draws the progress bar."""
        return self.rank == 0

    def submesh(self, *axes: Axis) -> DeviceMesh:
        return self.mesh[axes[0]] if len(axes) == 1 else self.mesh[axes]

    def group(self, axis: Axis) -> dist.ProcessGroup:
        return self.mesh.get_group(axis)

    def tied_group(self) -> dist.ProcessGroup | None:
        """The two ranks holding the first and the last pipeline stage with this rank's dp,
        cp and tp coordinates, when they differ: a tied embedding's two copies sum their
        gradients over it (:class:`~.pp.TiedEmbeddingGrads`). A collective: every rank
        creates every pair's group, in the same order; None where this rank is in no pair
        or one rank holds both stages (the V placement of zero-bubble schedules)."""
        from ...specs.stages import stage_to_rank
        last = stage_to_rank(self.plan.n_stages - 1, self.plan)
        if self.plan.pp == 1 or last == 0:
            return None
        grid = self.mesh.mesh.reshape(self.plan.pp, -1)  # (pp, dp * cp * tp) global ranks
        pairs = [[int(grid[0, j]), int(grid[last, j])] for j in range(grid.shape[1])]
        mine, _ = dist.new_subgroups_by_enumeration(pairs)
        return mine

    def grad_norm_groups(self) -> list[dist.ProcessGroup]:
        """Groups over which ranks hold *different* plain (non-DTensor) parameters, whose
        squared gradient norms must be summed for the global norm. DTensor shards (FSDP,
        tensor parallel) carry their own mesh and are summed by the clipping code itself;
        pipeline stages hold disjoint layers, so the pp group is summed here (ZeRO's shards
        are DTensors)."""
        return [self.group("pp")] if self.plan.pp > 1 else []


def _backend_and_device(local_rank: int) -> tuple[str, torch.device]:
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return "nccl", torch.device("cuda", local_rank)
    return "gloo", torch.device("cpu")


def init_distributed(plan: ParallelPlan, timeout_s: float) -> ParallelDims:
    """Join (or create) the process group and build the ``pp x dp x tp`` mesh.

    ``timeout_s`` bounds every collective: a peer that died or hangs becomes an error on
    the survivors instead of a hang."""
    if "RANK" in os.environ:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
    else:
        rank, world, local_rank = 0, 1, 0
    if world != plan.world_size:
        raise PtdError(f"dp*cp*tp*pp = {plan.world_size} does not equal the world size {world}")
    backend, device = _backend_and_device(local_rank)
    timeout = timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        if "RANK" in os.environ:
            dist.init_process_group(backend, timeout=timeout)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                    timeout=timeout)
    mesh = init_device_mesh(device.type, mesh_shape(plan), mesh_dim_names=AXES)
    ep_mesh = None
    if plan.ep > 1:
        ranks = torch.arange(world).view(plan.pp, plan.dp // plan.ep, plan.ep, plan.tp)
        ep_mesh = DeviceMesh(device.type, ranks, mesh_dim_names=("pp", "edp", "ep", "tp"))
    tp2d_mesh = None
    if plan.tp_mode == "2d":  # the tp axis unflattened into q x q (tp rank t = r*q + c)
        q = math.isqrt(plan.tp)
        ranks = torch.arange(world).view(plan.pp, plan.dp, plan.cp, q, q)
        full = DeviceMesh(device.type, ranks, mesh_dim_names=("pp", "dp", "cp", "tpr", "tpc"))
        tp2d_mesh = full["tpr", "tpc"]
    return ParallelDims(plan, rank, world, local_rank, device, mesh, ep_mesh, tp2d_mesh)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()

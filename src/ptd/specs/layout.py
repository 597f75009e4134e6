"""Where each rank sits in the ``pp x dp x cp x tp`` grid: the one placement rule of ptd.

Ranks are laid out row-major over ``(pp, dp, cp, tp)``: tensor-parallel peers are
consecutive ranks (so they share a node and its fast links), context-parallel peers are
``tp`` apart, data-parallel peers ``cp*tp`` apart, and pipeline stages ``dp*cp*tp`` apart
(the slowest links carry the least traffic). This is Megatron-LM's order (and
torchtitan's: cp between the data-parallel and the tensor-parallel axes). With ``cp = 1``
it is the ``(pp, dp, tp)`` order of before. The cost model prices every collective with this placement and the
runtime builds its ``DeviceMesh`` with the same shape and axis names, so prediction and
measurement talk about the same groups.
"""

from __future__ import annotations

from typing import Literal

from .plan import ParallelPlan

Axis = Literal["pp", "dp", "cp", "tp"]
AXES: tuple[Axis, ...] = ("pp", "dp", "cp", "tp")  # outermost first


def mesh_shape(plan: ParallelPlan) -> tuple[int, int, int, int]:
    """``(pp, dp, cp, tp)``: the DeviceMesh shape, in ``AXES`` order."""
    return (plan.pp, plan.dp, plan.cp, plan.tp)


def coords(rank: int, plan: ParallelPlan) -> dict[Axis, int]:
    """The ``{pp, dp, cp, tp}`` index of ``rank``."""
    tp_i = rank % plan.tp
    cp_i = (rank // plan.tp) % plan.cp
    dp_i = (rank // (plan.tp * plan.cp)) % plan.dp
    pp_i = rank // (plan.tp * plan.cp * plan.dp)
    return {"pp": pp_i, "dp": dp_i, "cp": cp_i, "tp": tp_i}


def rank_of(pp: int, dp: int, tp: int, plan: ParallelPlan, cp: int = 0) -> int:
    return ((pp * plan.dp + dp) * plan.cp + cp) * plan.tp + tp


def stride(axis: Axis, plan: ParallelPlan) -> int:
    """Rank distance between neighbours along ``axis``."""
    return {"tp": 1, "cp": plan.tp, "dp": plan.tp * plan.cp, "pp": plan.tp * plan.cp * plan.dp}[axis]


def size(axis: Axis, plan: ParallelPlan) -> int:
    return {"tp": plan.tp, "cp": plan.cp, "dp": plan.dp, "pp": plan.pp}[axis]


def group_of(rank: int, axis: Axis, plan: ParallelPlan) -> list[int]:
    """The ranks that share every index with ``rank`` except along ``axis``."""
    c = coords(rank, plan)
    out = []
    for i in range(size(axis, plan)):
        c2 = dict(c)
        c2[axis] = i
        out.append(rank_of(c2["pp"], c2["dp"], c2["tp"], plan, c2["cp"]))
    return out


def groups(axis: Axis, plan: ParallelPlan) -> list[list[int]]:
    """Every group along ``axis`` (each rank in exactly one)."""
    seen: set[int] = set()
    out = []
    for r in range(plan.world_size):
        if r not in seen:
            g = group_of(r, axis, plan)
            seen.update(g)
            out.append(g)
    return out


def node_split(ranks: list[int], devices_per_node: int) -> tuple[int, int]:
    """``(nodes, members per node)`` of a group: how many nodes it spans and the largest
    number of its members on one node. Hierarchical collectives are priced from this."""
    per_node: dict[int, int] = {}
    for r in ranks:
        per_node[r // devices_per_node] = per_node.get(r // devices_per_node, 0) + 1
    return len(per_node), max(per_node.values())


def axis_node_split(axis: Axis, plan: ParallelPlan, devices_per_node: int) -> tuple[int, int]:
    """:func:`node_split` of the group along ``axis`` that contains rank 0 (all such groups
    are alike when ``devices_per_node`` is a multiple or divisor of the strides)."""
    return node_split(group_of(0, axis, plan), devices_per_node)


def node_span(ranks: list[int], devices_per_node: int) -> int:
    """Consecutive nodes from a group's first member to its last (nodes are numbered as the
    ranks are laid out, so consecutive nodes sit under the same leaf switches first)."""
    return max(ranks) // devices_per_node - min(ranks) // devices_per_node + 1


def axis_span(axis: str, plan: ParallelPlan, devices_per_node: int) -> int:
    """:func:`node_span` of the rank-0 group along ``axis`` (every such group spans as many
    nodes); ``grad``: data and context parallel together (gradient averaging), ``pp_pair``:
    two neighbouring pipeline stages (a point-to-point transfer)."""
    if axis == "grad":
        return node_span([0, (plan.dp * plan.cp - 1) * plan.tp], devices_per_node)
    if axis == "pp_pair":
        return node_span([0, stride("pp", plan) if plan.pp > 1 else 0], devices_per_node)
    return node_span(group_of(0, axis, plan), devices_per_node)  # type: ignore[arg-type]

"""Mixture-of-experts terms of the cost model (no torch): expert parameters per rank under
expert parallelism, and the all-to-all that dispatches and combines tokens.

Placement (the runtime's, :mod:`ptd.runtime.parallel.ep`): ``ep`` consecutive data-parallel
ranks share the ``E`` routed experts, ``E / ep`` each; everything else is replicated over
dp as without ep. Experts are not tensor-sharded (replicated over tp). So a rank holds, per
MoE block, ``(1 - 1/ep)`` fewer routed-expert elements than a dense copy would.

Traffic (Lepikhin et al. 2020, GShard sec. 2.2; Rajbhandari et al. 2022, DeepSpeed-MoE
sec. 5): per MoE block and micro-batch, a rank's ``T * k`` token assignments (``h`` values
each, activation dtype) are sent to the experts' ranks (dispatch) and their outputs sent
back (combine); the backward does both again with the gradients: four all-to-alls of
``T * k * h`` elements, of which ``(ep - 1) / ep`` leave the rank when routing is balanced.
``imbalance`` (the busiest rank's load over the mean, >= 1; ``ptd train`` measures it per
step as ``moe_imbalance``) scales the bytes of the busiest rank and its expert work.
"""

from __future__ import annotations

from typing import Any, Callable

from ..specs.model import ModelSpec
from ..specs.plan import ParallelPlan

# bytes per element of the compute dtype (activations that travel)
_ACT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def routed_expert_numel(model: ModelSpec) -> int:
    """Elements of all routed experts of one block (weights and biases; not the router,
    not the shared experts)."""
    return model.n_experts * model.expert_params() if model.is_moe else 0


def ep_missing_numel(model: ModelSpec, ep: int) -> int:
    """Routed-expert elements of one block that a rank does *not* hold under ``ep``."""
    e = routed_expert_numel(model)
    return e - e // ep if ep > 1 else 0


def all_to_all_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """Buffer of one dispatch (or combine) all-to-all, one block, one micro-batch, per rank:
    ``T * k * h`` activation elements."""
    tokens = plan.micro_batch * plan.seq_len
    return tokens * model.top_k * model.hidden * _ACT_BYTES[plan.dtype]


def counts_bytes(model: ModelSpec) -> float:
    """The counts exchange: one int64 per routed expert leaves each rank (``ep`` rows of
    ``E / ep``)."""
    return 8.0 * model.n_experts


def ep_comm_time(model: ModelSpec, plan: ParallelPlan, moe_layers: int,
                 coll: Callable[[str, float, int], float], imbalance: float = 1.0) -> float:
    """Seconds per step of expert-parallel all-to-alls on a rank with ``moe_layers`` MoE
    blocks, per block per micro-batch: ``4`` of the tokens (dispatch, combine; forward,
    backward) and the forward's counts exchange. ``coll(kind, bytes, n)`` prices one
    collective over the ep group (``comm.collective_time``)."""
    if plan.ep <= 1 or not model.is_moe:
        return 0.0
    one = coll("all_to_all", all_to_all_bytes(model, plan) * imbalance, plan.ep)
    counts = coll("all_to_all", counts_bytes(model), plan.ep)
    return moe_layers * plan.n_microbatches * (4.0 * one + counts)


def expert_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of the routed experts per token: ``2 * k * (matmul weights of one
    expert)`` (Kaplan et al. 2020's 2N per token, ``top_k`` experts active)."""
    mult = 2 if model.mlp == "gelu" else 3
    return 2.0 * model.top_k * mult * model.hidden * model.ffn_hidden


def imbalance_compute_time(model: ModelSpec, plan: ParallelPlan, moe_layers: int, rate: float,
                           imbalance: float = 1.0) -> float:
    """Extra seconds per step the busiest rank spends on expert work when its load is
    ``imbalance`` times the mean (forward + backward = 3x the forward FLOPs)."""
    if imbalance <= 1.0 or not model.is_moe or plan.ep <= 1:  # (ep 1: every rank runs all experts)
        return 0.0
    tokens = plan.micro_batch * plan.seq_len * plan.n_microbatches
    return (imbalance - 1.0) * 3.0 * expert_flops_per_token(model) * tokens * moe_layers / rate


def ep_chunks(blk: Any) -> tuple[float, float, float, float]:
    """A MoE block's computation around its ep collectives in one micro-batch (``blk``: a
    :class:`ptd.cost.compute.BlockTime`): the forward before the routed experts, their
    products, the backward outside them, and theirs (twice the forward's)."""
    ef, eb = blk.routed_forward, 2.0 * blk.routed_forward
    return max(0.0, blk.forward - ef), ef, max(0.0, blk.backward - eb), eb


def moe_layer_key(model: ModelSpec, dtype: str) -> str:
    """The name a calibrated profile gives one MoE layer's timings
    (``HardwareSpec.moe_layer_measured``): everything that shapes the layer's work -- hidden
    size, expert width, experts, top-k, MLP kind, biases, shared experts, capacity -- and
    the dtype it ran in, so a measurement only ever prices the layer it timed."""
    cap = f"{model.capacity_factor:g}".replace(".", "p")
    return (f"h{model.hidden}-f{model.ffn_hidden}-e{model.n_experts}-k{model.top_k}-"
            f"{model.mlp}-b{int(model.bias)}-s{model.n_shared_experts}-c{cap}-{dtype}")


def ep_group_ranks(plan: ParallelPlan) -> list[int]:
    """Global ranks of the ep group of rank 0: ``ep`` consecutive data-parallel ranks, which
    sit ``tp`` apart (:mod:`ptd.specs.layout`'s row-major ``(pp, dp, tp)`` order)."""
    return [i * plan.tp for i in range(plan.ep)]


def ep_node_split(plan: ParallelPlan, devices_per_node: int) -> tuple[int, int]:
    """``(nodes, members per node)`` of an ep group (``specs.layout.node_split``)."""
    from ..specs.layout import node_split
    return node_split(ep_group_ranks(plan), devices_per_node)


def edp_node_split(plan: ParallelPlan, devices_per_node: int) -> tuple[int, int]:
    """``(nodes, members per node)`` of the group of ranks that hold the same experts (the
    ``dp / ep`` of them, global ranks ``ep * tp`` apart)."""
    from ..specs.layout import node_split
    return node_split([i * plan.ep * plan.tp for i in range(plan.dp // plan.ep)],
                      devices_per_node)

"""Mixture-of-experts terms of the cost model (no torch): expert parameters per rank under
expert parallelism, and the all-to-all that dispatches and combines tokens.

Placement (the runtime's, :mod:`ptd.runtime.parallel.ep`): ``ep`` consecutive data-parallel
ranks share the ``E`` routed experts, ``E / ep`` each; everything else is replicated over
dp as without ep. Experts are not tensor-sharded (replicated over tp). So a rank holds, per
MoE block, ``(1 - 1/ep)`` fewer routed-expert elements than a dense copy would.

Expert tensor parallelism (``expert_tp``, the ``megatron-core`` stack): Megatron-Core splits
every routed expert over the tensor-parallel group as it splits a dense MLP (its
``expert_tensor_parallel_size`` defaults to ``tensor_model_parallel_size``,
megatron/core/model_parallel_config.py; before 0.10 the same unless ``moe_extended_tp``).
Its all-to-all dispatcher (megatron/core/transformer/moe/token_dispatcher.py,
``MoEAlltoAllTokenDispatcher``) sends each tp rank's sequence-parallel share of the tokens
over ep, then all-gathers the received tokens over tp (``dispatch_postprocess``), runs the
local experts on all of them with ``F / tp`` of each expert's width, reduce-scatters their
output over tp and sends it back over ep (``combine_preprocess``, ``token_combine``). So
with ``expert_tp`` a rank holds ``1 / (ep tp)`` of the routed experts, does ``1 / tp`` of
their products, keeps ``F / tp`` of their intermediates per assignment, sends ``1 / tp`` of
the all-to-all bytes, and adds an all-gather and a reduce-scatter of the ``T k h``
dispatched tokens over tp per block and micro-batch, forward and backward.

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


def ep_missing_numel(model: ModelSpec, ep: int, split: int = 1) -> int:
    """Routed-expert elements of one block that a rank does *not* hold under ``ep`` (and,
    with expert tensor parallelism, each expert split ``split`` ways over tp)."""
    e = routed_expert_numel(model)
    return e - e // (ep * split) if ep * split > 1 else 0


def expert_split(tp: int, expert_tp: bool) -> int:
    """How many ways each routed expert is split: ``tp`` under expert tensor parallelism
    (module docstring), else 1 (whole on every tp rank)."""
    return tp if expert_tp else 1


def dispatched_tokens(plan: ParallelPlan) -> int:
    """Tokens a rank routes per micro-batch: its share of each sequence under context
    parallelism (``seq_len / cp``) times the micro-batch."""
    return plan.micro_batch * (plan.seq_len // plan.cp)


def all_to_all_bytes(model: ModelSpec, plan: ParallelPlan, expert_tp: bool = False) -> float:
    """Buffer of one dispatch (or combine) all-to-all, one block, one micro-batch, per rank:
    ``T * k * h`` activation elements; under expert tensor parallelism each tp rank sends
    its sequence-parallel ``1 / tp`` of them."""
    tokens = dispatched_tokens(plan) / expert_split(plan.tp, expert_tp)
    return tokens * model.top_k * model.hidden * _ACT_BYTES[plan.dtype]


def tp_gather_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """The gathered buffer of expert tensor parallelism's all-gather (and reduce-scatter) over
    tp, one block, one micro-batch: all ``T * k * h`` dispatched activation elements."""
    return dispatched_tokens(plan) * model.top_k * model.hidden * _ACT_BYTES[plan.dtype]


def counts_bytes(model: ModelSpec) -> float:
    """The counts exchange: one int64 per routed expert leaves each rank (``ep`` rows of
    ``E / ep``)."""
    return 8.0 * model.n_experts


def ep_comm_time(model: ModelSpec, plan: ParallelPlan, moe_layers: int,
                 coll: Callable[[str, float, int], float], imbalance: float = 1.0,
                 expert_tp: bool = False,
                 tp_coll: Callable[[str, float], float] | None = None) -> float:
    """Seconds per step of expert-parallel all-to-alls on a rank with ``moe_layers`` MoE
    blocks, per block per micro-batch: ``4`` of the tokens (dispatch, combine; forward,
    backward) and the forward's counts exchange. ``coll(kind, bytes, n)`` prices one
    collective over the ep group (``comm.collective_time``). With ``expert_tp`` and tp > 1,
    also the dispatched tokens' all-gather and reduce-scatter over tp, forward and
    backward (the gradient of each is the other): ``tp_coll(kind, bytes)`` prices one over
    the tp group."""
    if not model.is_moe:
        return 0.0
    t = 0.0
    if plan.ep > 1:
        one = coll("all_to_all", all_to_all_bytes(model, plan, expert_tp) * imbalance, plan.ep)
        t += 4.0 * one + coll("all_to_all", counts_bytes(model), plan.ep)
    if expert_tp and plan.tp > 1 and tp_coll is not None:
        g = tp_gather_bytes(model, plan) * imbalance
        t += 2.0 * (tp_coll("all_gather", g) + tp_coll("reduce_scatter", g))
    return moe_layers * plan.n_microbatches * t


def expert_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of the routed experts per token: ``2 * k * (matmul weights of one
    expert)`` (Kaplan et al. 2020's 2N per token, ``top_k`` experts active)."""
    mult = 2 if model.mlp == "gelu" else 3
    return 2.0 * model.top_k * mult * model.hidden * model.ffn_hidden


def imbalance_compute_time(model: ModelSpec, plan: ParallelPlan, moe_layers: int, rate: float,
                           imbalance: float = 1.0, expert_tp: bool = False) -> float:
    """Extra seconds per step the busiest rank spends on expert work when its load is
    ``imbalance`` times the mean (forward + backward = 3x the forward FLOPs; ``1 / tp`` of
    them under expert tensor parallelism)."""
    if imbalance <= 1.0 or not model.is_moe or plan.ep <= 1:  # (ep 1: every rank runs all experts)
        return 0.0
    tokens = dispatched_tokens(plan) * plan.n_microbatches / expert_split(plan.tp, expert_tp)
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

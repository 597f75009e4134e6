"""Context parallelism in the cost model: what ``cp > 1`` changes per rank.

Placement is :mod:`ptd.specs.layout`'s ``(pp, dp, cp, tp)`` row-major rule, the runtime's:
cp peers are ``tp`` ranks apart. A sequence of ``s`` tokens is cut into ``2 cp`` chunks,
rank ``i`` holds chunks ``i`` and ``2cp-1-i`` (Llama 3, Dubey et al. 2024, section 3.3.2),
so every rank has ``s / cp`` tokens and, under the causal mask, ``1/cp`` of the attention
work:

* linear layers, norms, the output layer and the tp/pp traffic scale with the local
  tokens: :func:`local_seq` is what the step model passes as the sequence length;
* causal attention per rank is ``1/cp`` of the whole sequence's (each local query sees on
  average half of the whole sequence's keys), not the ``1/cp^2`` the local length alone
  would give: :func:`cp_terms` adds the difference;
* K and V pass around the cp ring once per layer forward (``runtime/parallel/cp.py``:
  ``cp - 1`` neighbour steps, what a ring all-gather of the whole sequence's K and V --
  ``2 b s d_kv / tp`` elements -- does, so priced as one) and their gradients once backward
  (the reverse ring: a reduce-scatter's bytes). In a ring each of the ``cp - 1`` transfers
  runs while the current block pair computes (Liu et al. 2023, "Ring Attention", section
  3), so per layer the exposed time is ``(cp-1) max(0, t_comm/(cp-1) - t_attn/cp)``;
* activations per rank are those of ``s / cp`` tokens (flash attention keeps no ``s x s``
  scores), plus the gathered K/V of one layer while it computes: :func:`kv_buffer_bytes`;
* gradients are averaged over ``dp x cp`` ranks (cp joins dp, as in Megatron-Core and
  torchtitan): :func:`grad_group`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..specs.hardware import DTYPE_BYTES, ClusterSpec
from ..specs.layout import axis_span, group_of, node_split, rank_of
from ..specs.model import ModelSpec
from ..specs.plan import ParallelPlan
from .comm import collective_time


def local_seq(plan: ParallelPlan) -> int:
    """Tokens of one sequence on one rank of the cp group."""
    return plan.seq_len // plan.cp


@dataclass(frozen=True)
class CPTerms:
    """Seconds per micro-batch on the slowest pipeline rank (all its layers)."""

    attn_forward: float = 0.0
    """Attention work beyond what the local sequence length prices, forward."""
    attn_backward: float = 0.0
    comm_total: float = 0.0
    """K/V all-gather forward plus gradient reduce-scatter backward, all of it."""
    comm_exposed: float = 0.0
    """The part no block computation hides."""


def attention_core_time(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec) -> float:
    """Forward time of one layer's causal attention core on one rank of the cp group:
    ``1/cp`` of the whole sequence's ``0.5 * 4 s^2 d`` FLOPs per head (flash: causal tiles
    skipped), at the hardware's attention efficiency (as :func:`ptd.cost.compute.block_time`)."""
    heads = plan.micro_batch * model.n_heads / plan.tp
    flops = 0.5 * 4 * plan.seq_len ** 2 * model.head_dim * heads / plan.cp
    from .compute import attention_fraction
    eff = attention_fraction(cluster.hardware, plan.dtype, model.head_dim, plan.seq_len)
    return flops / (cluster.gemm_rate(plan.dtype) * eff)


def kv_exchange_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """Bytes of one layer's gathered K and V (the whole sequence, this rank's kv heads)."""
    return 2 * DTYPE_BYTES[plan.dtype] * plan.micro_batch * plan.seq_len * model.kv_dim / plan.tp


def cp_group_split(plan: ParallelPlan, devices_per_node: int) -> tuple[int, int]:
    return node_split(group_of(0, "cp", plan), devices_per_node)


def cp_terms(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, layers: int) -> CPTerms:
    """The cp terms of one micro-batch over ``layers`` blocks (zero when ``cp == 1``)."""
    cp = plan.cp
    if cp <= 1:
        return CPTerms()
    t_attn = attention_core_time(model, plan, cluster)
    # what the step model already priced for the local length: (s/cp)^2 instead of s^2/cp
    extra_f = t_attn * (1.0 - 1.0 / cp)
    nodes, per_node = cp_group_split(plan, cluster.devices_per_node)
    nbytes = kv_exchange_bytes(model, plan)
    hw = cluster.hardware.across_spine(axis_span("cp", plan, cluster.devices_per_node))
    ag = collective_time("all_gather", nbytes, cp, hw, nodes, per_node)
    rs = collective_time("reduce_scatter", nbytes, cp, hw, nodes, per_node)
    exp_f = (cp - 1) * max(0.0, ag / (cp - 1) - t_attn / cp)
    exp_b = (cp - 1) * max(0.0, rs / (cp - 1) - 2.5 * t_attn / cp)  # backward: 2.5x (compute.py)
    return CPTerms(attn_forward=layers * extra_f, attn_backward=layers * 2.5 * extra_f,
                   comm_total=layers * (ag + rs), comm_exposed=layers * (exp_f + exp_b))


def grad_group(plan: ParallelPlan, devices_per_node: int) -> tuple[int, int, int]:
    """``(n, nodes, per_node)`` of the gradient-averaging group: the ``dp x cp`` ranks that
    share rank 0's pipeline and tensor-parallel index."""
    ranks = [rank_of(0, d, 0, plan, c) for d in range(plan.dp) for c in range(plan.cp)]
    nodes, per_node = node_split(ranks, devices_per_node)
    return len(ranks), nodes, per_node


def kv_buffer_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """The gathered K/V of one layer held while it computes (0 without cp)."""
    return kv_exchange_bytes(model, plan) if plan.cp > 1 else 0.0

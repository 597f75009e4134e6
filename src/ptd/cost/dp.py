"""Data-parallel communication of one step: gradient reduction, ZeRO's gathers, and what of
it the backward pass hides (the step's docstring, :mod:`ptd.cost.step`, states the rules).

DDP reduces buckets as gradients become ready; FSDP (ZeRO-1/2/3) reduce-scatters each
block's gradients while the previous block computes and prefetches each block's parameters
one block ahead. Exposed is what does not fit behind the last micro-batch's backward, and
never less than the last bucket or block; with ``dp_overlap=False`` (frameworks that reduce
after backward) all of it is exposed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..specs.hardware import DTYPE_BYTES, ClusterSpec
from ..specs.model import ModelSpec
from ..specs.plan import ParallelPlan
from . import params as P
from .ps import dp_ps_time

DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb


@dataclass(frozen=True)
class DpTerms:
    """Seconds per step: all data-parallel communication, the part not hidden, and a
    post-step parameter exchange priced with the optimizer (none of ptd's stages has one
    any more: FSDP gathers the updated shards in the next forward)."""

    total: float = 0.0
    exposed: float = 0.0
    opt_comm: float = 0.0


def dp_terms(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, mbt: Any,
             group: tuple[int, int, int], coll: Callable[..., float], dp_overlap: bool,
             recompute_early_stop: bool, ps_servers: int = 0,
             zero3_gather: str = "unit") -> DpTerms:
    """``mbt``: the slowest rank's micro-batch (:class:`ptd.cost.step.MicroBatch`);
    ``group``: (size, nodes, per node) of the gradient group; ``coll``: the collective
    pricing (``collective_time``'s arguments); ``zero3_gather``: see
    :class:`ptd.cost.estimate.CostOptions`."""
    dp_n, dp_nodes, dp_per = group
    if dp_n <= 1:
        return DpTerms()
    hw = cluster.hardware
    local = P.max_local_numel(model, plan)
    grad_bytes = local * (2 if plan.grad_compression == "fp16" else 4)
    # the last micro-batch's backward, which gradient reduction can hide behind
    window = (mbt.b + mbt.rc + mbt.tb) if dp_overlap else 0.0
    if plan.zero == 0:
        t_ar = (coll("all_reduce", grad_bytes, dp_n, hw, dp_nodes, dp_per) if not ps_servers
                else dp_ps_time(grad_bytes, dp_n, ps_servers, hw))  # cost/ps.py
        last_bucket = t_ar * min(1.0, DDP_BUCKET_BYTES / grad_bytes)
        return DpTerms(t_ar, max(last_bucket, t_ar - window), 0.0)
    return _fsdp(model, plan, cluster, mbt, group, coll, dp_overlap, recompute_early_stop,
                 zero3_gather)


def _fsdp(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, mbt: Any,
          group: tuple[int, int, int], coll: Callable[..., float], dp_overlap: bool,
          recompute_early_stop: bool, zero3_gather: str = "unit") -> DpTerms:
    """FSDP's per-block gathers and reduce-scatters (runtime/parallel/fsdp.py).

    ZeRO-3 gathers every block in the forward and again for the backward of every
    micro-batch, and reduce-scatters in the last micro-batch's backward. ZeRO-1/2 gather each
    block once per step (kept until the last backward) and reduce-scatter in the last
    micro-batch's backward (ZeRO-1) or in every micro-batch's (ZeRO-2); under a pipeline
    schedule torch defers every reduce-scatter to the end of the schedule, where it is all
    exposed.

    With expert parallelism a block's routed experts (``E / ep`` of them on a rank) are
    gathered and reduce-scattered over the ``dp / ep`` ranks holding the same experts (FSDP
    units of their own, ``runtime/parallel/fsdp.py``, ``shard_experts``); they are priced
    with the block's collectives over the dp group, as zero 0 prices their all-reduce --
    an overestimate by at most the ring's ``(dp - 1)/dp`` over ``(dp/ep - 1)/(dp/ep)`` of
    the experts' bytes, and one collective per block where the runtime runs two."""
    dp_n, dp_nodes, dp_per = group
    hw, m, nl, blk = cluster.hardware, plan.n_microbatches, mbt.nl, mbt.blk
    block_params = P.local_block_numel(model, plan.tp, plan.ep)
    ag_block = coll("all_gather", block_params * DTYPE_BYTES[plan.dtype], dp_n, hw, dp_nodes, dp_per)
    # on a CPU (gloo) ptd reduces FSDP's gradients with an all-reduce, which gloo runs faster
    # than its reduce-scatter (runtime/parallel/fsdp.py, AllReduceScatter)
    rs_kind = "all_reduce" if hw.kind == "cpu" else "reduce_scatter"
    rs_block = coll(rs_kind, block_params * 4, dp_n, hw, dp_nodes, dp_per)
    if dp_overlap:
        blk_f = blk.forward + 2 * (mbt.ar + mbt.wait)
        blk_b = (blk.backward + blk.recompute(plan.recompute, recompute_early_stop)
                 + 2 * (mbt.ar + mbt.wait))
    else:
        blk_f = blk_b = 0.0
    if plan.zero < 3:
        return _zero12(model, plan, hw, nl, blk_f, blk_b, rs_kind, group, coll)
    if zero3_gather == "param-sync":
        return _zero3_per_param(model, plan, hw, nl, blk_b, rs_block, group, coll)
    hidden_ag = max(0.0, ag_block - blk_f)  # prefetch one block ahead
    total = 2 * m * nl * ag_block + nl * rs_block  # ZeRO-3 gathers again for the backward
    exposed = m * (ag_block + (nl - 1) * hidden_ag)
    # Backward: while a block computes, the next block's gather and (on the last
    # micro-batch) this block's reduce-scatter both cross the same links, so they hide
    # behind its compute together, not each on its own.
    exposed += (m - 1) * nl * max(0.0, ag_block - blk_b)
    exposed += nl * max(0.0, ag_block + rs_block - blk_b) + rs_block
    return DpTerms(total, exposed, 0.0)


def _zero12(model: ModelSpec, plan: ParallelPlan, hw: Any, nl: int, blk_f: float, blk_b: float,
            rs_kind: str, group: tuple[int, int, int], coll: Callable[..., float]) -> DpTerms:
    """ZeRO-1/2 (runtime/parallel/fsdp.py): ``nl // k`` FSDP units of ``k`` blocks
    (:func:`ptd.cost.params.zero12_unit_blocks`) and the root's unit (the ``nl % k`` blocks
    left and the rank's other parameters). Each is gathered once per step -- the root's
    first, at the start of the forward, then each unit's behind the previous unit's forward
    -- and kept until the last backward; each is reduce-scattered in the last micro-batch's
    backward (ZeRO-1) or in every one (ZeRO-2), a unit's behind the next unit's backward, the
    first unit's and the root's (at the very end) exposed. Under a pipeline torch defers every
    reduce-scatter to the end of the schedule."""
    dp_n, dp_nodes, dp_per = group
    block = P.local_block_numel(model, plan.tp, plan.ep)  # (experts with it: see _fsdp)
    k = P.zero12_unit_blocks(model, plan.tp, plan.ep)
    n_units = nl // k
    root = (nl % k) * block + max(0, P.max_local_numel(model, plan) - nl * block)

    def ag(n: float) -> float:
        return coll("all_gather", n * DTYPE_BYTES[plan.dtype], dp_n, hw, dp_nodes, dp_per)

    def rs(n: float) -> float:
        return coll(rs_kind, n * 4, dp_n, hw, dp_nodes, dp_per)
    ag_u, rs_u = ag(k * block), rs(k * block)
    n_rs = plan.n_microbatches if (plan.zero == 2 and plan.pp == 1) else 1
    total = ag(root) + n_units * ag_u + n_rs * (rs(root) + n_units * rs_u)
    exposed = ag(root) + (ag_u + (n_units - 1) * max(0.0, ag_u - k * blk_f) if n_units else 0.0)
    if plan.pp > 1:
        return DpTerms(total, exposed + rs(root) + n_units * rs_u, 0.0)
    backward = rs(root) + (rs_u + (n_units - 1) * max(0.0, rs_u - k * blk_b) if n_units else 0.0)
    return DpTerms(total, exposed + n_rs * backward, 0.0)


def _zero3_per_param(model: ModelSpec, plan: ParallelPlan, hw: Any, nl: int, blk_b: float,
                     rs_block: float, group: tuple[int, int, int],
                     coll: Callable[..., float]) -> DpTerms:
    """DeepSpeed's ZeRO-3 as of 2021: one all-gather per parameter tensor, each waited for
    before the next is issued and before the module runs (DeepSpeed#1069: "all_gathers for
    one parameter", a synchronisation before the next; PR#1188, June 2021: "the async
    version is not async at all"), so no gather hides behind compute. Parameters are
    released after each module's forward and fetched again for its backward and, under full
    recompute, for the forward that recompute re-runs (the forward hooks fire again,
    DeepSpeed#4784). Gradients are reduce-scattered during the last micro-batch's backward
    (``overlap_comm``), as FSDP does.

    ``t`` tensors of a block gathered one by one cost ``t`` collectives on ``1/t`` of the
    block's bytes each: ``t`` latencies, the bandwidth term unchanged."""
    dp_n, dp_nodes, dp_per = group
    t = len(P.layer_params(model))
    block_bytes = P.local_block_numel(model, plan.tp, plan.ep) * DTYPE_BYTES[plan.dtype]
    ag_block = t * coll("all_gather", block_bytes / t, dp_n, hw, dp_nodes, dp_per)
    gathers = 3 if plan.recompute == "full" else 2
    gather_total = gathers * plan.n_microbatches * nl * ag_block
    total = gather_total + nl * rs_block
    exposed = gather_total + (nl - 1) * max(0.0, rs_block - blk_b) + rs_block
    return DpTerms(total, exposed, 0.0)

"""Time of one optimizer step, split into the parts people reason about.

With ``m`` micro-batches per replica, ``f`` and ``b`` the forward and backward time of one
micro-batch on the slowest pipeline rank (compute plus its tensor-parallel collectives,
recompute included in ``b``), ``p`` pipeline ranks and ``v`` chunks per rank::

    no pipeline:   T = m (f + b)                                + DP exposed + optimizer
    pipelined:     T = (m + (p - 1) / v) (f + b) + p2p          + DP exposed + optimizer

The pipeline bubble is ``(p - 1)/v (f + b)`` (Narayanan et al. 2021, arXiv 2104.04473,
section 2.2: fraction ``(p-1)/m`` for GPipe and 1F1B, divided by ``v`` when interleaved).
Zero-bubble schedules (Qi et al. 2023, arXiv 2401.10241) split backward into input and
weight gradients and fill the bubble with the latter; ZB-V reaches a bubble of about zero
when ``m >= 2p``, which is what is assumed here (and ``(p-1)/(2v)`` of a micro-batch below).

Tensor-parallel collectives are on the critical path (PyTorch's DTensor tensor parallelism
does not overlap them): two all-reduces of the block's activations forward and two
backward (with sequence parallelism each becomes an all-gather plus a reduce-scatter, the
same bytes), repeated by full recomputation.

Data-parallel gradient reduction overlaps backward: DDP reduces buckets as gradients become
ready (ZeRO-2 likewise, reducing each bucket to its owner), FSDP reduce-scatters each block's
gradients while the previous block computes, and prefetches each block's parameters (ZeRO-3)
one block ahead. Exposed is what does not fit behind the last micro-batch's backward, and
never less than the last bucket or block.
With ``dp_overlap=False`` (frameworks that reduce after backward) all of it is exposed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache

from ..specs.hardware import DTYPE_BYTES, ClusterSpec
from ..specs.layout import axis_node_split
from ..specs.model import ModelSpec
from ..specs.plan import ParallelPlan
from . import compute as C
from . import moe as MOE
from . import context as CX
from . import params as P
from .memory import ZERO2_BUCKET_BYTES
from .comm import collective_time
from .memo import memo
from .ps import dp_ps_time

DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb


@dataclass(frozen=True)
class StepBreakdown:
    """Seconds per optimizer step; ``total`` is the sum of the parts after it."""

    total: float
    compute: float
    """Forward, backward and recompute of every micro-batch (slowest pipeline rank)."""
    tp_comm: float
    """Tensor-parallel collectives on the critical path."""
    pp_comm: float
    """Pipeline point-to-point transfers on the critical path."""
    dp_comm_exposed: float
    """Data-parallel communication not hidden behind compute."""
    bubble: float
    """Pipeline fill and drain."""
    optimizer: float
    """Optimizer step, gradient-norm pass, ZeRO-1 parameter broadcast."""
    forward: float = 0.0
    backward: float = 0.0
    recompute: float = 0.0
    dp_comm_total: float = 0.0
    """All data-parallel communication, hidden or not."""
    ep_comm: float = 0.0
    """Expert-parallel all-to-alls (dispatch, combine; forward, backward) and the busiest
    rank's extra expert work under routing imbalance (:mod:`ptd.cost.moe`)."""
    cp_comm: float = 0.0
    """Context-parallel K/V exchange not hidden behind attention (:mod:`.context`)."""
    cp_comm_total: float = 0.0
    overlap: float = 0.0
    """Computation lost to collectives running beside it: data-parallel and context-parallel
    communication hidden behind compute takes multiprocessors from it
    (:func:`ptd.cost.compute.overlap_loss`)."""

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @property
    def largest(self) -> str:
        parts = {k: getattr(self, k) for k in ("compute", "tp_comm", "pp_comm", "dp_comm_exposed",
                                               "bubble", "optimizer", "ep_comm", "cp_comm", "overlap")}
        return max(parts, key=parts.get)  # type: ignore[arg-type]


# the compute model's pure functions, remembered by the identity of the model and hardware
_block_time = memo(C.block_time, identity=(0, 1))
_output_time = memo(C.output_time, identity=(0, 1))
_overlap_loss = memo(C.overlap_loss, identity=(0, 1))
_coll = memo(collective_time, identity=(3,))  # (kind, nbytes, n, hw, nodes, per_node)


def _group(plan: ParallelPlan, cluster: ClusterSpec, axis: str) -> tuple[int, int, int]:
    if axis == "dp" and plan.cp > 1:  # cp joins dp for gradient averaging
        return CX.grad_group(plan, cluster.devices_per_node)
    n = {"tp": plan.tp, "dp": plan.dp, "pp": plan.pp}[axis]
    nodes, per_node = _node_split(axis, plan.dp, plan.tp, plan.pp, cluster.devices_per_node, plan.cp)
    return n, nodes, per_node


@lru_cache(maxsize=4096)
def _node_split(axis: str, dp: int, tp: int, pp: int, devices_per_node: int, cp: int = 1
                ) -> tuple[int, int]:
    """:func:`axis_node_split`, memoised (placement depends on the degrees alone)."""
    return axis_node_split(axis, ParallelPlan(dp=dp, tp=tp, pp=pp, cp=cp), devices_per_node)  # type: ignore[arg-type]


def shared_rate_ratio(cluster: ClusterSpec, dtype: str, busy: float) -> float:
    """How much faster one worker computes when only ``busy`` of its node's workers are
    computing instead of all of them: 1 where devices do not share compute units (GPUs,
    presets); on a calibrated CPU whose workers share the cores, the measured per-worker
    rate at the full count over a processor-sharing rate at ``busy`` workers,
    ``min(R_1, C / busy)`` with ``C = max_N N R_N`` the node's measured aggregate rate."""
    table = cluster.hardware.gemm_flops_measured.get(dtype, {})
    w = cluster.workers_per_node
    if len(table) < 2 or busy >= w:
        return 1.0
    cap = max(n * cluster.hardware.gemm_rate(dtype, n) for n in table)
    r1 = cluster.hardware.gemm_rate(dtype, 1)
    r_busy = min(r1, cap / max(busy, 1e-9))
    return min(1.0, cluster.gemm_rate(dtype) / r_busy)


def step_time(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec,
              attention: str = "flash", dp_overlap: bool = True,
              recompute_early_stop: bool = True, tp_grad_per_linear: bool = True,
              moe_imbalance: float = 1.0, ps_servers: int = 0) -> StepBreakdown:
    """``tp_grad_per_linear``: tensor parallelism without sequence parallelism all-reduces
    each column-parallel layer's input gradient on its own (PyTorch DTensor, ptd's runtime:
    wq, wk, wv, w1 and w3 each); False sums them first and all-reduces twice per block
    (Megatron-LM's fused QKV and MLP input)."""
    hw = cluster.hardware
    ab = DTYPE_BYTES[plan.dtype]
    rate = cluster.gemm_rate(plan.dtype)
    s, mb, m = CX.local_seq(plan), plan.micro_batch, plan.n_microbatches  # s: this rank's tokens
    tokens = s * mb
    bw, ovh = cluster.memory_bandwidth, cluster.op_overhead
    dt_ovh = (cluster.overhead("dtensor_op") or 0.0) if plan.tp > 1 else 0.0
    blk = _block_time(model, hw, s, mb, plan.tp, plan.sp, plan.dtype, rate, attention, bw,
                ovh, dt_ovh)
    out_f, out_b = _output_time(model, hw, tokens, plan.tp, plan.dtype, rate, bw, ovh,
                         dt_ovh, plan.sp)

    # tensor-parallel collectives, per block and per micro-batch: alpha-beta times and counts
    tp_n, tp_nodes, tp_per = _group(plan, cluster, "tp")
    act = ab * tokens * model.hidden
    ar = _coll("all_reduce", act, tp_n, hw, tp_nodes, tp_per)
    if tp_grad_per_linear and not plan.sp:
        col = 3 + (2 if model.mlp == "swiglu" else 1)  # wq, wk, wv; w1 (and w3)
    else:
        col = 2
    n_block_f, n_block_b = 2, col + (2 if plan.recompute == "full" else 0)
    # vocabulary-parallel embedding output (first rank); on the last rank the sequence-
    # parallel gather before the output layer, loss_parallel's cross-entropy (max, sum of
    # exponentials, target logit: fp32 per token) and the output layer's input gradient
    loss_ar = _coll("all_reduce", 4 * tokens, tp_n, hw, tp_nodes, tp_per)
    n_out_f = (1 if plan.sp else 0) + 3
    tp_out_f = (ar if plan.sp else 0.0) + 3 * loss_ar

    # per pipeline rank: compute and tp time of one micro-batch through all its chunks
    first, last = P.stage_to_rank(0, plan), P.stage_to_rank(plan.n_stages - 1, plan)
    worst = None
    layers = P.layers_per_rank(model, plan)
    for r in P.heaviest_rank_candidates(model, plan):
        nl = layers[r]
        f = nl * blk.forward + (out_f if r == last else 0.0)
        b = nl * blk.backward + (out_b if r == last else 0.0)
        rc = nl * blk.recompute(plan.recompute, recompute_early_stop)
        n_f = nl * n_block_f + (1 if r == first else 0) + (n_out_f if r == last else 0)
        n_b = nl * n_block_b + (1 if r == last else 0)
        # Each tp collective blocks the compute stream. After a chunk of computation it also
        # waits beyond its back-to-back time (calibrated ``blocking_wait_measured``: gloo's
        # threads wake, a peer descheduled on shared cores arrives late; 0 on GPUs and
        # presets), which grows with the chunk: the rank's compute shared among them.
        wait = cluster.blocking_wait((f + b + rc) / (n_f + n_b)) if tp_n > 1 else 0.0
        tf = nl * n_block_f * ar + (ar if r == first else 0.0) \
            + (tp_out_f if r == last else 0.0) + n_f * wait
        tb = nl * n_block_b * ar + (ar if r == last else 0.0) + n_b * wait
        key = f + b + rc + tf + tb
        if worst is None or key > worst[0]:
            worst = (key, f, b, rc, tf, tb, nl, wait)
    _, f, b, rc, tf, tb, nl, wait = worst  # type: ignore[misc]
    cpt = CX.cp_terms(model, plan, cluster, nl)  # context parallel: whole-sequence attention, K/V
    f, b = f + cpt.attn_forward, b + cpt.attn_backward
    per_mb = f + b + rc + tf + tb + cpt.comm_exposed

    p, v = plan.pp, plan.stages_per_rank
    if p > 1:
        if plan.schedule == "zero-bubble" and m >= 2 * p:
            fill = 0.0
        elif plan.schedule == "zero-bubble":
            fill = (p - 1) / (2 * v)
        else:
            fill = (p - 1) / v
        bubble = fill * per_mb
        # Workers that share compute units (a CPU with more workers than cores) lend their
        # share to the busy ones while they wait: on average only m / (m + fill) of the
        # node's workers compute, each at the processor-sharing rate for that many.
        k = shared_rate_ratio(cluster, plan.dtype, cluster.workers_per_node * m / (m + fill))
        if k < 1.0:
            c_mb = f + b + rc
            bubble = max(0.0, (m + fill) * c_mb * k - m * c_mb) + fill * (tf + tb)
        # Each receive the schedule waits on follows a chunk of computation, so where the
        # calibrated blocking wait applies (shared cores; 0 on GPUs) the stage waits beyond
        # the transfer, as tensor parallelism's collectives do. Per micro-batch and chunk a
        # rank receives an activation and a gradient, less the direction its first or last
        # stage lacks; the measurement counts that wait as bubble (waiting for a neighbour).
        bubble += m * (2 * v - 1) * cluster.blocking_wait((f + b + rc) / (2 * v))
        pp_n, pp_nodes, _ = _group(plan, cluster, "pp")
        p2p_bytes = act / (plan.tp if plan.sp else 1)
        t_p2p = _coll("send_recv", p2p_bytes, 2, hw, 2 if pp_nodes > 1 else 1)
        pp_comm = 2 * (m * v + p - 1) * t_p2p
    else:
        bubble = pp_comm = 0.0

    # data parallel
    dp_n, dp_nodes, dp_per = _group(plan, cluster, "dp")
    local = P.max_local_numel(model, plan)
    block_params = P.block_numel(model, plan.tp)
    grad_bytes = local * (2 if plan.grad_compression == "fp16" else 4)
    # the last micro-batch's backward, which gradient reduction can hide behind
    bwd_window = (b + rc + tb) if dp_overlap else 0.0
    dp_total = dp_exposed = 0.0
    opt_comm = 0.0
    if dp_n > 1:
        if plan.zero <= 1:
            t_ar = (_coll("all_reduce", grad_bytes, dp_n, hw, dp_nodes, dp_per) if not ps_servers
                    else dp_ps_time(grad_bytes, dp_n, ps_servers, hw))  # cost/ps.py
            last_bucket = t_ar * min(1.0, DDP_BUCKET_BYTES / grad_bytes)
            dp_total = t_ar
            dp_exposed = max(last_bucket, t_ar - bwd_window)
            if plan.zero == 1:  # ZeroRedundancyOptimizer broadcasts updated shards
                opt_comm = _coll("all_gather", local * 4, dp_n, hw, dp_nodes, dp_per)
        elif plan.zero == 2:
            # runtime/parallel/zero2.py: gradients reduce-scattered to their owners in
            # 25 MiB buckets (an all-reduce on gloo, which runs it faster), then ZeRO-1's
            # broadcasts of the updated parameters. Without tp or pp the buckets leave from
            # the gradient hooks and hide behind the last backward as DDP's do; with tp or
            # pp a gradient may still change after its hook fires, so all of it waits for
            # the end of the backward.
            rs_kind = "all_reduce" if hw.kind == "cpu" else "reduce_scatter"
            t_rs = _coll(rs_kind, grad_bytes, dp_n, hw, dp_nodes, dp_per)
            dp_total = t_rs
            if plan.tp == 1 and plan.pp == 1:
                last_bucket = t_rs * min(1.0, ZERO2_BUCKET_BYTES / grad_bytes)
                dp_exposed = max(last_bucket, t_rs - bwd_window)
            else:
                dp_exposed = t_rs
            opt_comm = _coll("all_gather", local * 4, dp_n, hw, dp_nodes, dp_per)
        else:
            ag_block = _coll("all_gather", block_params * ab, dp_n, hw, dp_nodes, dp_per)
            # on a CPU (gloo) ptd reduces FSDP's gradients with an all-reduce, which gloo runs
            # faster than its reduce-scatter (runtime/parallel/fsdp.py, AllReduceScatter)
            rs_kind = "all_reduce" if hw.kind == "cpu" else "reduce_scatter"
            rs_block = _coll(rs_kind, block_params * 4, dp_n, hw, dp_nodes, dp_per)
            gathers = 2 * m * nl  # ZeRO-3 gathers again for the backward
            dp_total = gathers * ag_block + nl * rs_block
            blk_f = blk.forward + 2 * (ar + wait)
            blk_b = (blk.backward + blk.recompute(plan.recompute, recompute_early_stop)
                     + 2 * (ar + wait))
            if not dp_overlap:
                blk_f = blk_b = 0.0
            hidden_ag = max(0.0, ag_block - blk_f)  # prefetch one block ahead
            exposed_ag = m * (ag_block + (nl - 1) * hidden_ag)
            # Backward: while a block computes, the next block's gather and (on the last
            # micro-batch) this block's reduce-scatter both cross the same links, so they
            # hide behind its compute together, not each on its own.
            exposed_b = (m - 1) * nl * max(0.0, ag_block - blk_b)
            exposed_b += nl * max(0.0, ag_block + rs_block - blk_b) + rs_block
            dp_exposed = exposed_ag + exposed_b

    opt_params = local / plan.dp if plan.zero >= 1 else local  # ZeRO shards over dp (not cp)
    n_tensors = len(P.layer_params(model)) * nl + 4
    dtensor_params = plan.tp > 1 or plan.zero >= 3
    per_tensor = cluster.overhead("optimizer_tensor_dtensor" if dtensor_params else "optimizer_tensor")
    optimizer = C.optimizer_time(opt_params, n_tensors, hw, plan.offload, bw, ovh, per_tensor) + opt_comm
    if plan.tp > 1 and plan.sp and plan.zero < 3:
        # the norms' partial gradients, summed over tp once per step (one small all-reduce each)
        n_norms = (2 * nl + 1) if model.norm == "rmsnorm" else (4 * nl + 2)
        tp_step = n_norms * (_coll("all_reduce", 4 * model.hidden, tp_n, hw, tp_nodes, tp_per)
                             + wait)
    else:
        tp_step = 0.0

    compute = m * (f + b + rc)
    tp_comm = m * (tf + tb) + tp_step
    ep_comm = _ep_time(model, plan, cluster, nl, rate, moe_imbalance)
    # hidden communication is not free: it slows the computation it hides behind
    hidden = max(0.0, dp_total - dp_exposed) if dp_overlap else 0.0
    hidden += m * max(0.0, cpt.comm_total - cpt.comm_exposed)
    overlap = hidden * _overlap_loss(model, hw, s, mb, plan.tp, plan.dtype, rate, bw, blk)
    total = (compute + tp_comm + pp_comm + bubble + dp_exposed + optimizer + ep_comm
             + m * cpt.comm_exposed + overlap)
    return StepBreakdown(total=total, compute=compute, tp_comm=tp_comm, pp_comm=pp_comm,
                         dp_comm_exposed=dp_exposed, bubble=bubble, optimizer=optimizer,
                         forward=m * f, backward=m * b, recompute=m * rc, dp_comm_total=dp_total,
                         ep_comm=ep_comm, cp_comm=m * cpt.comm_exposed,
                         cp_comm_total=m * cpt.comm_total, overlap=overlap)


def _ep_time(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, layers: int, rate: float,
             imbalance: float) -> float:
    """:func:`ptd.cost.moe.ep_comm_time` over the ep group's placement, plus imbalance."""
    if not model.is_moe:
        return 0.0
    nodes, per_node = MOE.ep_node_split(plan, cluster.devices_per_node)
    hw = cluster.hardware
    comm = MOE.ep_comm_time(model, plan, layers,
                            lambda kind, nbytes, n: _coll(kind, nbytes, n, hw, nodes, per_node),
                            imbalance)
    return comm + MOE.imbalance_compute_time(model, plan, layers, rate, imbalance)

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

Data-parallel gradient reduction overlaps backward (:mod:`ptd.cost.dp`); communication
hidden behind compute still takes multiprocessors from it (the ``overlap`` part).

One function per dimension, as ``runtime/parallel/`` has one file per dimension:
:func:`micro_batch` (compute and tensor parallel on the slowest pipeline rank),
:func:`pipeline` (bubble and point-to-point), :func:`ptd.cost.dp.dp_terms` (data parallel and
ZeRO), :func:`optimizer_time`, :func:`ptd.cost.context.cp_terms`, and expert parallelism
(:mod:`ptd.cost.moe`); :func:`step_time` adds them up.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from functools import lru_cache

from ..specs.hardware import DTYPE_BYTES, ClusterSpec, HardwareSpec
from ..specs.layout import axis_node_split, axis_span, node_span
from ..specs.stages import stage_to_rank
from ..specs.model import ModelSpec
from ..specs.plan import ParallelPlan
from . import compute as C
from . import moe as MOE
from . import context as CX
from . import dp as DP
from . import eager as E
from . import params as P
from .comm import collective_time
from .memo import memo



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
    """Data-parallel communication not hidden behind compute (with a tied embedding over
    pipeline stages, also the sum of its two copies' gradients, which runs beside it)."""
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

    def bound(self) -> str:
        """What limits the step, in words: the largest part, and whether the step is
        compute- or communication-bound (communication that compute cannot hide is larger
        than the compute itself)."""
        part = self.largest
        share = getattr(self, part) / self.total if self.total else 0.0
        what = _BOUND_WORDS[part]
        exposed = self.tp_comm + self.pp_comm + self.dp_comm_exposed + self.ep_comm + self.cp_comm
        kind = "communication-bound" if exposed > self.compute else (
            "compute-bound" if part == "compute" else f"{what}-bound")
        return f"{kind}: the largest part is {what} ({share:.0%} of the step)"


_BOUND_WORDS = {
    "compute": "computation", "tp_comm": "tensor-parallel collectives",
    "pp_comm": "pipeline transfers", "dp_comm_exposed": "data-parallel communication not hidden",
    "bubble": "the pipeline bubble", "optimizer": "the optimizer step",
    "ep_comm": "MoE token dispatch and combine", "cp_comm": "context-parallel exchange not hidden",
    "overlap": "computation slowed by hidden communication"}


# the compute model's pure functions, remembered by the identity of the model and hardware
_block_time = memo(C.block_time, identity=(0, 1))
_output_time = memo(C.output_time, identity=(0, 1))
_overlap_loss = memo(C.overlap_loss, identity=(0, 1))
_coll = memo(collective_time, identity=(3,))  # (kind, nbytes, n, hw, nodes, per_node)


def _net(cluster: ClusterSpec, plan: ParallelPlan, axis: str) -> HardwareSpec:
    """The hardware as the group along ``axis`` sees the network: across an oversubscribed
    spine when it spans more nodes than a leaf joins (``HardwareSpec.across_spine``)."""
    hw = cluster.hardware
    if hw.spine_oversubscription <= 1 or not hw.nodes_per_leaf:
        return hw
    return hw.across_spine(axis_span(axis, plan, cluster.devices_per_node))


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


def shared_rate_ratio(cluster: ClusterSpec, dtype: str, busy: int) -> float:
    """How much faster one worker computes when only ``busy`` of its node's workers are
    computing instead of all of them: 1 where devices do not share compute units (GPUs,
    presets); on a calibrated CPU whose workers share the cores, the mean time a unit of
    work takes over ``busy`` computing workers (:func:`_shared_time`) over its time at the
    per-worker rate the step's computation is priced at (all of the node's workers), at
    most 1."""
    table = cluster.hardware.gemm_flops_measured.get(dtype, {})
    if len(table) < 2 or busy >= cluster.workers_per_node:
        return 1.0
    return min(1.0, cluster.gemm_rate(dtype) * _shared_time(cluster.hardware, dtype, max(1, busy)))


def pipeline_sharing(cluster: ClusterSpec, dtype: str, group: int, m: int, fill: float,
                     compute: float, waiting: float) -> float:
    """The factor ``k <= 1`` by which a pipeline rank's computation runs faster than priced
    (at every worker of its node computing) because, on a CPU whose workers share the cores,
    the others do not all compute at once: 1 on GPUs and where the node has a core for each
    worker.

    A rank computes together with the ``group`` ranks that wait in its collectives with it
    (tensor and context parallelism; 1 without), for ``compute * k`` of each micro-batch's
    ``compute * k + waiting`` (``waiting``: its collectives' time), and in ``m`` of the
    schedule's ``m + fill`` slots (idle while the pipeline fills and drains). Each of the
    node's other groups is computing at a given moment with that probability ``P``,
    independently, so ``X ~ Binomial(W / group - 1, P)`` of them are, and the rank's work
    takes ``E[shared_rate_ratio(group (1 + X))]`` of its priced time -- the mean over the
    cases, not the ratio at the mean count, as the rate is not linear in the count. ``k``
    and ``P`` depend on each other; iterated from ``k = 1`` to the fixed point."""
    w = cluster.workers_per_node
    if shared_rate_ratio(cluster, dtype, group) >= 1.0:
        return 1.0
    others = max(0, w // group - 1)
    # the ratio with x other groups computing (fixed; only their probability moves with k)
    ratio = [shared_rate_ratio(cluster, dtype, min(w, group * (1 + x))) for x in range(others + 1)]
    k = 1.0
    for _ in range(200):
        busy_time = compute * k
        u = busy_time / (busy_time + waiting) if busy_time + waiting > 0 else 1.0
        p = u * m / (m + fill) if m + fill > 0 else 1.0
        new = sum(math.comb(others, x) * p ** x * (1 - p) ** (others - x) * ratio[x]
                  for x in range(others + 1))
        if abs(new - k) < 1e-12:
            return new
        k = new
    return k


def _shared_time(hw: HardwareSpec, dtype: str, n: int) -> float:
    """Mean seconds per FLOP over ``n`` workers computing at once on a CPU node whose cores
    they share. The node's cores ``N``: its logical CPUs as the calibration recorded them
    (``HardwareSpec.cpus``), else the worker count at which the measured aggregate matmul
    rate ``N R_N`` peaks. Linux keeps one run queue per core and spreads runnable
    workers evenly over them, but does not rotate them to share out a remainder: with
    ``n = q N + e`` workers, ``e`` cores hold ``q + 1`` of them and the others ``q``, and a
    worker runs at the per-worker rate of as many workers to every core as share its own,
    ``R_{L N}`` (measured, or beyond the table as the model prices any worker count:
    :meth:`~ptd.specs.HardwareSpec.gemm_rate`). Not fluid processor sharing, which would
    give each of them ``N R_N / n``: three workers computing on two
    cores measured one of them at 1.93x its time alone, not 1.5x (docs/measuring.md,
    twenty-fifth session). With ``n <= N`` each has a core: ``R_n``."""
    table = hw.gemm_flops_measured.get(dtype, {})
    cores = hw.cpus or min(table, key=lambda c: (-c * hw.gemm_rate(dtype, c), c))
    if n <= cores:
        return 1.0 / hw.gemm_rate(dtype, n)
    q, e = divmod(n, cores)
    t = (cores - e) * q / hw.gemm_rate(dtype, q * cores)
    if e:
        t += e * (q + 1) / hw.gemm_rate(dtype, (q + 1) * cores)
    return t / n


def cpu_overlap_loss(cluster: ClusterSpec, dtype: str) -> float:
    """Seconds of computation lost per second of communication hidden behind it, on a CPU.

    gloo moves and sums the bytes on the CPU (its own threads, copies through shared memory
    or the loopback socket), so a collective running beside computation takes a core's
    time from it unless a core is spare. Spare cores, in units of one worker's core: the
    node's measured aggregate matmul rate ``C = max_N N R_N`` less what its ``W`` workers use,
    ``(C - W R_W) / R_1`` (``R_N``: the per-worker rate measured with ``N`` at once). The loss is
    1 minus that, between 0 and 1: 1 when the workers already fill the cores (2 workers on 2
    cores lose a second of computation per second of hidden communication), 0 with a core
    to spare. Without a measured table (fewer than two worker counts) nothing is known
    about sharing: 0, as before."""
    hw = cluster.hardware
    table = hw.gemm_flops_measured.get(dtype, {})
    if len(table) < 2:
        return 0.0
    w = cluster.workers_per_node
    cap = max(n * hw.gemm_rate(dtype, n) for n in table)
    spare = (cap - w * hw.gemm_rate(dtype, w)) / hw.gemm_rate(dtype, 1)
    return min(1.0, max(0.0, 1.0 - spare))


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch through the slowest pipeline rank: seconds of forward ``f``,
    backward ``b`` and recompute ``rc`` (compute), tensor-parallel collectives forward ``tf``
    and backward ``tb``; the rank's block count ``nl``; one block's times ``blk``; the tp
    activation all-reduce ``ar`` and the calibrated wait each blocking collective adds."""

    f: float
    b: float
    rc: float
    tf: float
    tb: float
    nl: int
    blk: C.BlockTime
    ar: float
    wait: float


def step_time(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec,
              attention: str = "flash", dp_overlap: bool = True,
              recompute_early_stop: bool = True, tp_grad_per_linear: bool = True,
              moe_imbalance: float = 1.0, ps_servers: int = 0,
              zero3_gather: str = "unit", elementwise: str = "autocast",
              fsdp_copy_out: bool = True, selective: str = "attention",
              expert_tp: bool = False) -> StepBreakdown:
    """``tp_grad_per_linear``: tensor parallelism without sequence parallelism all-reduces
    each column-parallel layer's input gradient on its own (PyTorch DTensor, ptd's runtime:
    wq, wk, wv, w1 and w3 each); False sums them first and all-reduces twice per block
    (Megatron-LM's fused QKV and MLP input). ``expert_tp``: routed experts split over tp,
    their tokens gathered over it (Megatron-Core; :mod:`ptd.cost.moe`)."""
    m = plan.n_microbatches
    elementwise = E.for_plan(elementwise, plan.zero)  # autocast under ZeRO-0 only
    mbt = micro_batch(model, plan, cluster, attention, recompute_early_stop, tp_grad_per_linear,
                      elementwise, selective, expert_tp)
    cpt = CX.cp_terms(model, plan, cluster, mbt.nl)  # context parallel: whole-sequence attention
    mbt = dataclasses.replace(mbt, f=mbt.f + cpt.attn_forward, b=mbt.b + cpt.attn_backward)
    # a pipeline on shared cores computes faster than priced while others wait (1 elsewhere)
    k = pipeline_rate(plan, cluster, mbt, cpt.comm_exposed)
    bubble, pp_comm = pipeline(model, plan, cluster, mbt, cpt.comm_exposed, k)
    net = _net(cluster, plan, "grad" if plan.cp > 1 else "dp")
    dp = DP.dp_terms(model, plan, cluster, mbt, _group(plan, cluster, "dp"),
                     lambda kind, nbytes, n, _hw, nodes, per: _coll(kind, nbytes, n, net, nodes, per),
                     dp_overlap, recompute_early_stop, ps_servers, zero3_gather, fsdp_copy_out,
                     expert_tp)
    # the runner sums a tied embedding's copies after the schedule, with the gradient
    # average (the measurement counts both as data-parallel communication): exposed
    tied = tied_embedding_sync(model, plan, cluster)
    dp = dataclasses.replace(dp, total=dp.total + tied, exposed=dp.exposed + tied)
    optimizer, tp_step = optimizer_time(model, plan, cluster, mbt)
    # FSDP's copies around its collectives (CPUs: :func:`ptd.cost.dp.fsdp_copy_time`)
    compute = m * (mbt.f + mbt.b + mbt.rc) * k + dp.copy_forward + dp.copy_backward
    tp_comm = m * (mbt.tf + mbt.tb) + tp_step
    ep_comm = _ep_time(model, plan, cluster, mbt, cluster.gemm_rate(plan.dtype), moe_imbalance,
                       expert_tp)
    # hidden communication is not free: it slows the computation it hides behind
    hidden = max(0.0, dp.total - dp.exposed) if dp_overlap else 0.0
    hidden += m * max(0.0, cpt.comm_total - cpt.comm_exposed)
    if cluster.hardware.kind == "cpu":
        overlap = hidden * cpu_overlap_loss(cluster, plan.dtype)
    else:
        overlap = hidden * _overlap_loss(model, cluster.hardware, CX.local_seq(plan),
                                         plan.micro_batch, plan.tp, plan.dtype,
                                         cluster.gemm_rate(plan.dtype), cluster.memory_bandwidth,
                                         mbt.blk, expert_tp)
    total = (compute + tp_comm + pp_comm + bubble + dp.exposed + optimizer + dp.opt_comm
             + ep_comm + m * cpt.comm_exposed + overlap)
    return StepBreakdown(total=total, compute=compute, tp_comm=tp_comm, pp_comm=pp_comm,
                         dp_comm_exposed=dp.exposed, bubble=bubble,
                         optimizer=optimizer + dp.opt_comm, forward=m * mbt.f * k + dp.copy_forward,
                         backward=m * mbt.b * k + dp.copy_backward, recompute=m * mbt.rc * k,
                         dp_comm_total=dp.total,
                         ep_comm=ep_comm, cp_comm=m * cpt.comm_exposed,
                         cp_comm_total=m * cpt.comm_total, overlap=overlap)


def micro_batch(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, attention: str,
                recompute_early_stop: bool, tp_grad_per_linear: bool,
                elementwise: str = "autocast", selective: str = "attention",
                expert_tp: bool = False) -> MicroBatch:
    """Compute and tensor-parallel time of one micro-batch on the slowest pipeline rank."""
    hw = cluster.hardware
    rate = cluster.gemm_rate(plan.dtype)
    s, mb = CX.local_seq(plan), plan.micro_batch  # s: this rank's tokens of a sequence
    tokens = s * mb
    bw, ovh = cluster.memory_bandwidth, cluster.op_overhead
    # tp > 1: each operator on a DTensor costs a fixed part more, and the rank's operators
    # run a share slower than on plain tensors (both calibrated on CPUs: ``dtensor_op``,
    # ``dtensor_compute_share``; 0 elsewhere)
    dt_ovh = (cluster.overhead("dtensor_op") or 0.0) if plan.tp > 1 else 0.0
    dt_share = (cluster.overhead("dtensor_compute_share") or 0.0) if plan.tp > 1 else 0.0
    # a MoE layer measured by ``ptd calibrate --model`` (CPUs): on the rank's tokens, all
    # of them on every tp rank (its router and experts are whole there)
    moe = (cluster.moe_layer(MOE.moe_layer_key(model, plan.dtype), tokens)
           if model.is_moe else None)
    blk = _block_time(model, hw, s, mb, plan.tp, plan.sp, plan.dtype, rate, attention, bw,
                      ovh, dt_ovh, elementwise, plan.ep, moe, selective, expert_tp, dt_share)
    if plan.ep > 1 and model.is_moe:
        ef, eb, _ = ep_layer_overheads(cluster)
        blk = dataclasses.replace(blk, forward=blk.forward + ef, backward=blk.backward + eb)
    out_f, out_b = _output_time(model, hw, tokens, plan.tp, plan.dtype, rate, bw, ovh,
                                dt_ovh, plan.sp, elementwise, dt_share)
    tpc = _tp_collectives(model, plan, cluster, tokens, tp_grad_per_linear, expert_tp,
                          elementwise)
    tp_n = plan.tp
    first, last = stage_to_rank(0, plan), stage_to_rank(plan.n_stages - 1, plan)
    worst = None
    layers = P.layers_per_rank(model, plan)
    for r in P.heaviest_rank_candidates(model, plan):
        nl = layers[r]
        f = nl * blk.forward + (out_f if r == last else 0.0)
        b = nl * blk.backward + (out_b if r == last else 0.0)
        rc = nl * blk.recompute(plan.recompute, recompute_early_stop)
        n_f = nl * tpc.n_f + (1 if r == first else 0) + (tpc.n_out_f if r == last else 0)
        n_b = nl * tpc.n_b + (1 if r == last else 0)
        # Each tp collective blocks the compute stream. After a chunk of computation it also
        # waits beyond its back-to-back time (calibrated ``blocking_wait_measured``: gloo's
        # threads wake, a peer descheduled on shared cores arrives late; 0 on GPUs and
        # presets), which grows with the chunk: the rank's compute shared among them, and
        # with the group (it waits for the latest of its peers).
        wait = cluster.blocking_wait((f + b + rc) / (n_f + n_b), tp_n) if tp_n > 1 else 0.0
        tf = nl * tpc.n_f * tpc.ar_f + (tpc.ar_end if r == first else 0.0) \
            + (tpc.out_f if r == last else 0.0) + n_f * wait
        tb = nl * ((tpc.n_b - tpc.n_rc) * tpc.ar_b + tpc.n_rc * tpc.ar_f) \
            + (tpc.ar_end if r == last else 0.0) + n_b * wait
        cand = MicroBatch(f, b, rc, tf, tb, nl, blk, tpc.ar_f, wait)
        if worst is None or f + b + rc + tf + tb > worst.f + worst.b + worst.rc + worst.tf + worst.tb:
            worst = cand
    return worst  # type: ignore[return-value]


@dataclasses.dataclass(frozen=True)
class TPCollectives:
    """Tensor-parallel collectives of one micro-batch (:func:`_tp_collectives`): seconds of
    one of a block's activation all-reduces (or, under sp, all-gather + reduce-scatter
    pairs) forward ``ar_f`` and backward ``ar_b``, and of the embedding's (first rank,
    forward) and the output layer's input gradient's (last rank, backward) ``ar_end``; how
    many a block runs forward ``n_f`` and backward ``n_b``, ``n_rc`` of the latter its
    recomputed forward's; the output layer's forward count ``n_out_f`` and time ``out_f``."""

    ar_f: float
    ar_b: float
    ar_end: float
    n_f: int
    n_b: int
    n_rc: int
    n_out_f: int
    out_f: float


def _tp_collectives(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, tokens: int,
                    tp_grad_per_linear: bool, expert_tp: bool = False,
                    elementwise: str = "fused") -> TPCollectives:
    """Tensor-parallel collectives of one micro-batch (:class:`TPCollectives`).
    ``expert_tp``: a MoE block's MLP has no all-reduce (or sequence-parallel gather and
    reduce-scatter) of its own; its experts' tp collectives are the dispatcher's, priced
    with the all-to-alls (:func:`_ep_time`). ``elementwise`` ``autocast`` (ptd's runtime:
    fp32 weights under autocast in a 16-bit dtype): the residual stream, the norms' outputs
    and the embedding's output stay fp32, so the collectives on them and on their gradients
    move 4 bytes an element -- without sp the column-parallel layers' input-gradient
    all-reduces (backward), with sp the all-gathers before those layers (forward) and their
    gradients' reduce-scatters (backward) -- while the row-parallel outputs and their
    gradients move the 16-bit dtype (two ranks of the runtime,
    tests/test_tp_collective_dtypes.py). An all-gather and a reduce-scatter of ``e`` and
    ``e'`` bytes an element are priced as one all-reduce of their mean."""
    hw = _net(cluster, plan, "tp")
    tp_n, tp_nodes, tp_per = _group(plan, cluster, "tp")
    ab = DTYPE_BYTES[plan.dtype]
    wide = 4 if (elementwise == "autocast" and ab < 4) else ab
    # ptd's tp layers issue each collective through DTensor: its redistribution and the
    # functional collective's out-of-place copy add to the call (calibrated on CPUs,
    # ``dtensor_reduce_measured``; 0 elsewhere). With sequence parallelism an all-reduce's
    # place is taken by a reduce-scatter and an all-gather, each charged as a reduction
    # writing what it writes (act / tp, act).
    # Timed in place in ptd's tp model on pairs, each costs more than those parts
    # (calibrated on CPUs, ``tp_situ_measured``; 0 elsewhere): the residual is added once
    # per all-reduce (or gather and reduce-scatter pair) of a tp pair, the extras' sum not
    # below 0. Larger groups wait for more peers (their own blocking curve), in place not
    # measured: none.
    dt = cluster.dtensor_reduce if tp_n > 1 else (lambda _: 0.0)
    situ = cluster.tp_situ if tp_n == 2 else (lambda _: 0.0)

    def ar(elt_bytes: float) -> float:
        act = elt_bytes * tokens * model.hidden
        extra = dt(act / tp_n) + dt(act) if plan.sp else dt(act)
        return _coll("all_reduce", act, tp_n, hw, tp_nodes, tp_per) + max(0.0, extra + situ(act))
    mixed = ar((wide + ab) / 2)
    ar_f, ar_b = (mixed, mixed) if plan.sp else (ar(ab), ar(wide))
    ar_end = ar(wide)
    if tp_grad_per_linear and not plan.sp:
        col = 3 + (2 if model.mlp == "swiglu" else 1)  # wq, wk, wv; w1 (and w3)
    else:
        col = 2
    n_rc = 2 if plan.recompute == "full" else 0
    n_block_f, n_block_b = 2, col + n_rc
    if expert_tp and model.is_moe:  # (Megatron runs MoE with tp only under sp: col 2)
        n_rc //= 2
        n_block_f, n_block_b = 1, col - 1 + n_rc
    # vocabulary-parallel embedding output (first rank); on the last rank the sequence-
    # parallel gather before the output layer, loss_parallel's cross-entropy (max, sum of
    # exponentials, target logit: fp32 per token) and the output layer's input gradient
    loss_ar = _coll("all_reduce", 4 * tokens, tp_n, hw, tp_nodes, tp_per) \
        + max(0.0, dt(4 * tokens) + situ(4 * tokens))
    n_out_f = (1 if plan.sp else 0) + 3
    tp_out_f = (ar_end if plan.sp else 0.0) + 3 * loss_ar
    return TPCollectives(ar_f, ar_b, ar_end, n_block_f, n_block_b, n_rc, n_out_f, tp_out_f)


def _fill(plan: ParallelPlan) -> float:
    """Slots of the schedule in which a rank waits while the pipeline fills and drains, in
    micro-batches of its work (``p - 1`` over its ``v`` stages; zero-bubble: half, none
    with ``m >= 2 p``)."""
    p, v, m = plan.pp, plan.stages_per_rank, plan.n_microbatches
    if plan.schedule == "zero-bubble" and m >= 2 * p:
        return 0.0
    if plan.schedule == "zero-bubble":
        return (p - 1) / (2 * v)
    return (p - 1) / v


def pipeline_rate(plan: ParallelPlan, cluster: ClusterSpec, mbt: MicroBatch,
                  cp_exposed: float) -> float:
    """:func:`pipeline_sharing` for ``plan``'s pipeline (1 without one): its ranks compute
    in groups of tp x cp, each micro-batch's collectives ``tf + tb`` and exposed context-
    parallel exchange the time they wait."""
    if plan.pp <= 1:
        return 1.0
    return pipeline_sharing(cluster, plan.dtype, plan.tp * plan.cp, plan.n_microbatches,
                            _fill(plan), mbt.f + mbt.b + mbt.rc, mbt.tf + mbt.tb + cp_exposed)


def pipeline(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, mbt: MicroBatch,
             cp_exposed: float, rate: float | None = None) -> tuple[float, float]:
    """(bubble, point-to-point time) of the pipeline; (0, 0) without one. ``rate``: the
    :func:`pipeline_rate` the caller has (computed here where not given)."""
    p, v, m = plan.pp, plan.stages_per_rank, plan.n_microbatches
    if p <= 1:
        return 0.0, 0.0
    f, b, rc, tf, tb = mbt.f, mbt.b, mbt.rc, mbt.tf, mbt.tb
    fill = _fill(plan)
    # Workers that share compute units (a CPU with more workers than cores) lend their
    # share to the busy ones while they wait: the rank computes k of its priced time, in
    # the fill's slots as in its own (step_time scales the computation by the same k)
    k = pipeline_rate(plan, cluster, mbt, cp_exposed) if rate is None else rate
    bubble = fill * ((f + b + rc) * k + tf + tb + cp_exposed)
    # Each receive the schedule waits on follows a chunk of computation, so where the
    # calibrated blocking wait applies (shared cores; 0 on GPUs) the stage waits beyond
    # the transfer, as tensor parallelism's collectives do. Per micro-batch and chunk a
    # rank receives an activation and a gradient, less the direction its first or last
    # stage lacks; the measurement counts that wait as bubble (waiting for a neighbour).
    bubble += m * (2 * v - 1) * cluster.blocking_wait((f + b + rc) / (2 * v))
    _, pp_nodes, _ = _group(plan, cluster, "pp")
    act = DTYPE_BYTES[plan.dtype] * CX.local_seq(plan) * plan.micro_batch * model.hidden
    p2p_bytes = act / (plan.tp if plan.sp else 1)
    t_p2p = _coll("send_recv", p2p_bytes, 2, _net(cluster, plan, "pp_pair"),
                  2 if pp_nodes > 1 else 1)
    return bubble, 2 * (m * v + p - 1) * t_p2p


def tied_embedding_sync(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec) -> float:
    """The all-reduce that sums a tied embedding's gradient over its two copies, the first
    and the last pipeline rank (``runtime/parallel/pp.py``, ``TiedEmbeddingGrads``): once a
    step, after the schedule, on their critical path (priced with the exposed data-parallel
    communication, where the measurement puts the runner's gradient synchronisation). The copies are the output matrix's
    local shard (vocabulary rows over tp, then ZeRO's dim-0 chunk over dp) in fp32; the pair
    crosses nodes when the pipeline does. 0 without tying, without a pipeline, or where one
    rank holds both stages (the V of zero-bubble: one tensor)."""
    first, last = P.ends_of(P.layout_key(plan))
    if not model.tied_embeddings or plan.pp <= 1 or first == last:
        return 0.0
    rows, cols = P.last_stage_params(model, True)[-1].local_shape(plan.tp)
    if plan.zero >= 1:
        rows = -(-rows // plan.dp)  # torch.chunk's first (largest) chunk
    _, pp_nodes, _ = _group(plan, cluster, "pp")
    return _coll("all_reduce", 4 * rows * cols, 2, _net(cluster, plan, "pp"),
                 2 if pp_nodes > 1 else 1)


def optimizer_time(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, mbt: MicroBatch
                   ) -> tuple[float, float]:
    """(optimizer step over this rank's parameters, the once-a-step tp all-reduces of the
    norms' partial gradients under sequence parallelism)."""
    hw = cluster.hardware
    local = P.max_local_numel(model, plan)
    opt_params = local / plan.dp if plan.zero >= 1 else local  # ZeRO shards over dp (not cp)
    n_tensors = len(P.layer_params(model)) * mbt.nl + 4
    dtensor_params = plan.tp > 1 or plan.zero >= 1  # FSDP's shards are DTensors
    per_tensor = cluster.overhead("optimizer_tensor_dtensor" if dtensor_params else "optimizer_tensor")
    per_param = cluster.overhead("optimizer_param")
    per_param_dt = cluster.overhead("optimizer_param_dtensor")
    if dtensor_params and per_param_dt is not None:
        per_param = per_param_dt
    optimizer = C.optimizer_time(opt_params, n_tensors, hw, plan.offload, cluster.memory_bandwidth,
                                 cluster.op_overhead, per_tensor, per_param)
    if plan.ep > 1 and not dtensor_params:
        # expert parallelism alone: the routed experts are DTensors (sharded over ep), the
        # rest plain -- each expert tensor, and each of its parameters, pays the DTensor
        # phase's cost instead
        layer = P.layer_params(model)
        n_exp = sum(P.is_routed_expert(p) for p in layer) * mbt.nl
        dt = cluster.overhead("optimizer_tensor_dtensor")
        if dt is not None and per_tensor is not None:
            optimizer += n_exp * (dt - per_tensor)
        if per_param_dt is not None and per_param is not None:
            exp_numel = MOE.routed_expert_numel(model) // plan.ep * mbt.nl
            optimizer += exp_numel * (per_param_dt - per_param)
    optimizer += grad_norm_comm(model, plan, cluster)
    if not (plan.tp > 1 and plan.sp and plan.zero == 0):  # (FSDP reduces them itself)
        return optimizer, 0.0
    tp_n, tp_nodes, tp_per = _group(plan, cluster, "tp")
    n_norms = (2 * mbt.nl + 1) if model.norm == "rmsnorm" else (4 * mbt.nl + 2)
    tp_step = n_norms * (_coll("all_reduce", 4 * model.hidden, tp_n, _net(cluster, plan, "tp"),
                               tp_nodes, tp_per)
                         + mbt.wait)
    return optimizer, tp_step


def grad_norm_groups(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec
                     ) -> list[tuple[int, int, int]]:
    """The groups (size, nodes, per node) of the scalar all-reduces that sum the squared
    gradient norm over shards and stages, one entry per all-reduce, as
    ``runtime/optim.py global_grad_norm`` runs them (one per mesh axis a gradient is sharded
    along, gradients on equal meshes and axes summed first; then the pipeline stages).
    Counted on ptd's runtime (dp 2 x tp 2 under ZeRO-3: the matrices on (dp, tp), the norms
    on dp alone -- dp, tp, dp)."""
    dpn = cluster.devices_per_node
    groups: list[tuple[int, int, int]] = []
    tp_g = _group(plan, cluster, "tp")
    dp_g = (plan.dp, *_node_split("dp", plan.dp, plan.tp, plan.pp, dpn, plan.cp))
    if plan.zero >= 1:  # FSDP's shards: over dp; under tp, matrices over (dp, tp) as well
        groups += [dp_g, dp_g, tp_g] if plan.tp > 1 else [dp_g]
    elif plan.tp > 1 and plan.tp_mode == "2d":
        # q x q mesh: matrices sharded along both axes, the norms' weights along the columns
        q = int(round(plan.tp ** 0.5))
        sub = (q, 1, q) if tp_g[1] == 1 else (q, q, 1)  # across nodes: one rank per node
        groups += [sub, sub, sub]
    elif plan.tp > 1:  # the tp-sharded matrices (norms are replicated: plain)
        groups.append(tp_g)
    if plan.ep > 1 and model.is_moe:  # routed experts: over ep, and over edp under ZeRO
        groups.append((plan.ep, *MOE.ep_node_split(plan, dpn)))
        edp = plan.dp // plan.ep
        if plan.zero >= 1 and edp > 1:
            groups.append((edp, *MOE.edp_node_split(plan, dpn)))
    if plan.pp > 1:
        groups.append(_group(plan, cluster, "pp"))
    return groups


def grad_norm_comm(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec) -> float:
    """Seconds of the gradient norm's scalar all-reduces (:func:`grad_norm_groups`), each its
    group's latency; inside the optimizer phase, where a run's measurement counts them."""
    hw = cluster.hardware
    return sum(_coll("all_reduce", 4, n, hw, nodes, per) for n, nodes, per in
               grad_norm_groups(model, plan, cluster))


EP_ROW_ALL_TO_ALLS = (2, 2)
"""The rows' all-to-alls of one MoE layer and micro-batch under ep (runtime/parallel/ep.py):
there and back in the forward, both again with the gradients in the backward."""


def ep_layer_overheads(cluster: ClusterSpec) -> tuple[float, float, float]:
    """Expert parallelism's own work per MoE block and micro-batch beyond its products and
    the all-to-alls' alpha-beta time, as ``ptd calibrate`` times it on CPUs
    (``overheads_measured["ep_layer_*"]``: DTensor expert weights and their gradients, the
    index arithmetic, the all-to-alls' autograd wrappers; 0 uncalibrated):
    ``(forward, backward)`` computation without the wrappers, and the wrappers' seconds
    (``ep_all_to_all_*``, per call, times :data:`EP_ROW_ALL_TO_ALLS`), which a run's
    measurement counts as the all-to-alls' time."""
    def get(key: str) -> float:
        return cluster.overhead(key) or 0.0
    calls_f = EP_ROW_ALL_TO_ALLS[0] * get("ep_all_to_all_forward")
    calls_b = EP_ROW_ALL_TO_ALLS[1] * get("ep_all_to_all_backward")
    return (max(0.0, get("ep_layer_forward") - calls_f),
            max(0.0, get("ep_layer_backward") - calls_b), calls_f + calls_b)


def ep_waits(cluster: ClusterSpec, blk: C.BlockTime, group: int = 2) -> float:
    """The late-peer waits of one MoE block's ep collectives in one micro-batch (CPUs:
    ``ClusterSpec.blocking_wait``, 0 where not calibrated). Each of the five blocks the
    calling thread and waits ``w(c)``, ``c`` the computation since the rank's previous
    collective, as tensor parallelism's all-reduces and FSDP's collectives do
    (:func:`ptd.cost.dp._cpu_late_peers`): in the forward the counts' exchange after the
    block's work before its routed experts, the rows' dispatch right after it (``w(0)``),
    the combine after the experts' products; in the backward the combine's gradient after
    the work since the previous block's dispatch, the dispatch's after the experts'
    backward. (Measured on this CPU, 2 ranks, tiny-moe, 512 tokens: a rows' all-to-all
    right after a barrier took 0.5-0.6 ms at the median but 1.0-1.9 ms on average, where
    back to back it takes 0.3; docs/moe.md.)"""
    def w(chunk: float) -> float:
        return cluster.blocking_wait(chunk, group)  # the ep group's
    before_f, ef, before_b, eb = MOE.ep_chunks(blk)
    return w(before_f) + w(0.0) + w(ef) + w(before_b) + w(eb)


def _ep_time(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, mbt: MicroBatch,
             rate: float, imbalance: float, expert_tp: bool = False) -> float:
    """:func:`ptd.cost.moe.ep_comm_time` over the ep group's placement, plus imbalance, the
    all-to-alls' own calls (:func:`ep_layer_overheads`) and their late-peer waits
    (:func:`ep_waits`)."""
    if not model.is_moe:
        return 0.0
    nodes, per_node = MOE.ep_node_split(plan, cluster.devices_per_node)
    hw = cluster.hardware.across_spine(node_span(MOE.ep_group_ranks(plan),
                                                 cluster.devices_per_node))
    tp_n, tp_nodes, tp_per = _group(plan, cluster, "tp")
    tp_hw = _net(cluster, plan, "tp")
    comm = MOE.ep_comm_time(model, plan, mbt.nl,
                            lambda kind, nbytes, n: _coll(kind, nbytes, n, hw, nodes, per_node),
                            imbalance, expert_tp,
                            lambda kind, nbytes: _coll(kind, nbytes, tp_n, tp_hw, tp_nodes, tp_per))
    if plan.ep > 1:
        comm += mbt.nl * plan.n_microbatches * (ep_layer_overheads(cluster)[2]
                                                 + ep_waits(cluster, mbt.blk, plan.ep))
    return comm + MOE.imbalance_compute_time(model, plan, mbt.nl, rate, imbalance, expert_tp)

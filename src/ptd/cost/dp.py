"""Data-parallel communication of one step: gradient reduction, ZeRO's gathers, and what of
it the backward pass hides (the step's docstring, :mod:`ptd.cost.step`, states the rules).

DDP reduces buckets as gradients become ready; FSDP (ZeRO-1/2/3) reduce-scatters each
block's gradients while the previous block computes and prefetches each block's parameters
one block ahead. Exposed is what does not fit behind the last micro-batch's backward, and
never less than the last bucket or block; with ``dp_overlap=False`` (frameworks that reduce
after backward) all of it is exposed. On a CPU none of FSDP's communication hides (it
overlaps through CUDA streams) and each of its collectives waits for late peers
(:func:`_cpu_late_peers`); DDP's buckets still overlap there (gloo's threads).
"""

from __future__ import annotations

import dataclasses
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
    copy_forward: float = 0.0
    """FSDP's own work on the computing thread, in the forward and the backward: the copies
    in and out of its collectives' buffers (:func:`fsdp_copy_time`) and, where calibrated,
    its per-unit hooks (:func:`fsdp_unit_time`); seconds of computation, where they run and
    the measurement finds them."""
    copy_backward: float = 0.0


def dp_terms(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, mbt: Any,
             group: tuple[int, int, int], coll: Callable[..., float], dp_overlap: bool,
             recompute_early_stop: bool, ps_servers: int = 0,
             zero3_gather: str = "unit", fsdp_copy_out: bool = True,
             expert_tp: bool = False) -> DpTerms:
    """``mbt``: the slowest rank's micro-batch (:class:`ptd.cost.step.MicroBatch`);
    ``group``: (size, nodes, per node) of the gradient group; ``coll``: the collective
    pricing (``collective_time``'s arguments); ``zero3_gather``: see
    :class:`ptd.cost.estimate.CostOptions`; ``expert_tp``: routed experts split over tp
    (:mod:`ptd.cost.moe`), so a rank's gradients hold ``1 / tp`` of its experts'."""
    dp_n, dp_nodes, dp_per = group
    if dp_n <= 1:
        return DpTerms()
    hw = cluster.hardware
    local = P.max_local_numel(model, plan, expert_tp)
    grad_bytes = local * (2 if plan.grad_compression == "fp16" else 4)
    # the last micro-batch's backward, which gradient reduction can hide behind
    window = (mbt.b + mbt.rc + mbt.tb) if dp_overlap else 0.0
    if plan.zero == 0:
        if ps_servers:
            t_ar = dp_ps_time(grad_bytes, dp_n, ps_servers, hw)  # cost/ps.py
        elif plan.ep > 1 and model.is_moe:
            t_ar = (_ep_all_reduces(model, plan, cluster, group, coll, local, grad_bytes / local,
                                    expert_tp)
                    + _ep_all_reduce_waits(plan, cluster, mbt.blk, dp_n))
        else:
            t_ar = coll("all_reduce", grad_bytes, dp_n, hw, dp_nodes, dp_per)
        last_bucket = t_ar * min(1.0, DDP_BUCKET_BYTES / grad_bytes)
        return DpTerms(t_ar, max(last_bucket, t_ar - window), 0.0)
    terms = _fsdp(model, plan, cluster, mbt, group, coll, dp_overlap, recompute_early_stop,
                  zero3_gather, expert_tp)
    if not fsdp_copy_out:
        return terms
    cf, cb = fsdp_copy_time(model, plan, cluster)
    hf, hb = fsdp_unit_time(model, plan, cluster, mbt.nl)
    return dataclasses.replace(terms, copy_forward=cf + hf, copy_backward=cb + hb)


def _ep_all_reduces(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec,
                    group: tuple[int, int, int], coll: Callable[..., float], local: int,
                    bytes_per: float, expert_tp: bool = False) -> float:
    """Zero-0 gradient reduction under expert parallelism as the runtime runs it
    (``runtime/parallel/ep.py``, ``EPGradSync``): two all-reduces, the rank's dense
    gradients over all ``dp`` replicas, then its routed experts' over the ``dp / ep`` ranks
    holding the same experts (global ranks ``ep * tp`` apart); each pays its own latency.
    ``local``: the heaviest rank's parameters (:func:`ptd.cost.params.max_local_numel`)."""
    from .moe import edp_node_split
    dp_n, dp_nodes, dp_per = group
    hw = cluster.hardware
    r = next(i for i in range(plan.pp) if P.local_numel(model, plan, i, expert_tp) == local)
    experts = P.local_expert_numel(model, plan, r, expert_tp)
    edp = dp_n // plan.ep
    nodes, per = edp_node_split(plan, cluster.devices_per_node)
    return (coll("all_reduce", (local - experts) * bytes_per, dp_n, hw, dp_nodes, dp_per)
            + coll("all_reduce", experts * bytes_per, edp, hw, nodes, per))


def _ep_all_reduce_waits(plan: ParallelPlan, cluster: ClusterSpec, blk: Any, dp_n: int) -> float:
    """The late-peer waits of :func:`_ep_all_reduces` on CPUs (``blocking_wait``, 0 where
    not calibrated): the dense all-reduce follows the backward's work since its last
    all-to-all (the first block's, before its routed experts: ``w(c)``, as
    :func:`ptd.cost.step.ep_waits`), the experts' follows it at once (``w(0)``; none where
    no other rank holds the same experts), each for its group's size."""
    from .moe import ep_chunks
    w = cluster.blocking_wait
    experts = dp_n // plan.ep  # ranks holding the same experts
    return w(ep_chunks(blk)[2], dp_n) + (w(0.0, experts) if experts > 1 else 0.0)


def _fsdp(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, mbt: Any,
          group: tuple[int, int, int], coll: Callable[..., float], dp_overlap: bool,
          recompute_early_stop: bool, zero3_gather: str = "unit",
          expert_tp: bool = False) -> DpTerms:
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
    block_params = P.local_block_numel(model, plan.tp, plan.ep, expert_tp)
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
        terms = _zero12(model, plan, hw, nl, blk_f, blk_b, rs_kind, group, coll, expert_tp)
    elif zero3_gather == "param-sync":
        return _zero3_per_param(model, plan, hw, nl, blk_b, rs_block, group, coll, expert_tp)
    else:
        # the root's unit: the rank's parameters outside its blocks (embedding, final norm,
        # output layer), its own FSDP unit (runtime/parallel/fsdp.py; torchtitan's
        # parallelize_llama.py fully_shard(model) the same)
        root = _outside_blocks(model, plan, nl, block_params, expert_tp)
        ag_root = coll("all_gather", root * DTYPE_BYTES[plan.dtype], dp_n, hw, dp_nodes, dp_per)
        rs_root = coll(rs_kind, root * 4, dp_n, hw, dp_nodes, dp_per)
        terms = _zero3_units(plan, nl, m, ag_block, rs_block, blk_f, blk_b, ag_root, rs_root)
    if hw.kind == "cpu":
        return DpTerms(terms.total, terms.total + _cpu_late_peers(model, plan, cluster, mbt,
                                                                   recompute_early_stop,
                                                                   dp_n), 0.0)
    return terms


def _outside_blocks(model: ModelSpec, plan: ParallelPlan, nl: int, block: int,
                    expert_tp: bool = False) -> int:
    """The heaviest rank's parameters outside its ``nl`` blocks (embedding, final norm,
    output layer, as its pipeline stages hold them): what FSDP's root unit holds beside any
    blocks left to it."""
    return max(0, P.max_local_numel(model, plan, expert_tp) - nl * block)


def fsdp_unit_time(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, nl: int
                   ) -> tuple[float, float]:
    """(forward, backward) seconds per step of FSDP2's per-unit work beyond its copies and
    collectives -- its pre- and post-forward and backward hooks, the unit's gather and
    release, the gradient reduction's bookkeeping -- at the calibrated cost per unit and
    micro-batch (``overheads_measured["fsdp_unit_forward"]`` and ``_backward``, resharded
    units, for ZeRO-3; ``fsdp_unit_keep_*`` for ZeRO-1/2: ``ptd calibrate`` times both on a
    group of the worker count, less the bare collectives FSDP2 issues, and on a one-rank
    mesh for one worker, ``runtime/calibrate/bench.py``; on this 2-core CPU about 0.6 ms
    forward and 0.55 backward a unit with two workers, 0.1 on a one-rank mesh, which
    issues no collectives and misses the work around them). 0 where not calibrated (GPUs, presets: the hooks
    run on the host while the device works). Units on the heaviest rank: ZeRO-3 one per
    block, ZeRO-1/2 one per ``k`` blocks (:func:`ptd.cost.params.zero12_unit_blocks`),
    plus the root (one per pipeline chunk) and, under ep, each MoE layer's experts. Every
    micro-batch runs every unit's hooks; ZeRO-1's micro-batches before the last reduce
    nothing, which this prices as if they did.

    ZeRO-3 over a pair also pays, on each gather (a unit's forward and its backward, every
    micro-batch), what its work costs in place beyond every priced part
    (``HardwareSpec.fsdp_situ_measured``, read at a block unit's bytes; 0.1-2.4 ms a gather
    in six calibrations of the 2-core EPYC, where the hooks read 0.6), the unit's cost in each pass not below 0."""
    keep = "" if plan.zero >= 3 else "_keep"
    f = cluster.overhead(f"fsdp_unit{keep}_forward") or 0.0
    b = cluster.overhead(f"fsdp_unit{keep}_backward") or 0.0
    situ = 0.0
    if plan.zero >= 3 and plan.dp == 2 and plan.cp == 1:
        # FSDP gathers the unit's parameters in the training dtype (fp32 on a CPU)
        unit = P.local_block_numel(model, plan.tp, plan.ep) * DTYPE_BYTES[plan.dtype]
        situ = cluster.fsdp_situ(unit)
    if not f and not b and not situ:
        return 0.0, 0.0
    blocks = nl if plan.zero >= 3 else nl // P.zero12_unit_blocks(model, plan.tp, plan.ep)
    units = blocks + (plan.vpp if plan.pp > 1 else 1) + (nl if plan.ep > 1 and model.is_moe else 0)
    m = plan.n_microbatches
    return m * units * max(0.0, f + situ), m * units * max(0.0, b + situ)


def fsdp_copy_time(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec
                   ) -> tuple[float, float]:
    """(forward, backward) seconds of FSDP2's copies around its collectives, at the copy
    bandwidth (torch 2.13 ``_fsdp_collectives.py``). A gather of ``N`` parameters (a shard
    of ``N / dp`` on the rank) copies the shard into the gather's input (``all_gather_copy_in``:
    read 4 bytes, write 4 in fp32; under mixed precision a cast into ``c``-byte elements,
    then that copy, ``4 + 3c``) and the gathered buffer out into the parameters
    (``split_with_sizes_copy``: ``2c`` a parameter); a reduction copies the gradients into
    its fp32 input (``_chunk_cat``: ``c + 4``) and, on gloo (ptd's ``AllReduceScatter``), the
    rank's chunk out (8 a shard element). ZeRO-3 gathers every micro-batch for the forward
    and again for the backward and reduces once; ZeRO-1/2 gather once a step and reduce once
    (ZeRO-2 without a pipeline: every micro-batch). ``N`` is the rank's parameters.

    On a CPU all of them run between the blocks, on the one thread (about 6 ms of a 400 ms
    step of ``small`` on 2 workers). On a GPU only the copy-out runs on the compute stream
    (``foreach_all_gather_copy_out``, after waiting for the gather); the copy-in and the
    reduction's copies run on the all-gather and reduce-scatter streams beside the
    computation and are not charged (the copy-out adds 1.4% to the step of ``ptd validate``'s
    torchtitan Llama 3 8B case on 64 A100s).
    Stacks whose parameters are views of the gathered buffer skip this
    (``CostOptions.fsdp_copy_out``)."""
    if plan.zero < 1 or plan.dp <= 1:
        return 0.0, 0.0
    c = DTYPE_BYTES[plan.dtype]
    n = P.max_local_numel(model, plan)
    shard = n / plan.dp
    if cluster.hardware.kind == "cpu":
        gather = shard * (8 if c == 4 else 4 + 3 * c) + 2 * c * n
        reduce = (c + 4) * n + 8 * shard
    else:
        gather, reduce = 2 * c * n, 0.0
    bw = cluster.memory_bandwidth
    m = plan.n_microbatches
    if plan.zero >= 3:
        return m * gather / bw, (m * gather + reduce) / bw
    n_rs = m if (plan.zero == 2 and plan.pp == 1) else 1
    return gather / bw, n_rs * reduce / bw


def _zero3_units(plan: ParallelPlan, nl: int, m: int, ag_block: float, rs_block: float,
                 blk_f: float, blk_b: float, ag_root: float = 0.0, rs_root: float = 0.0
                 ) -> DpTerms:
    """ZeRO-3 with one FSDP unit per block, gathers prefetched one block ahead (GPUs), and
    the root's unit. The root is resharded after the forward like the blocks (ptd and
    torchtitan pass ``reshard_after_forward=True`` to it explicitly, which turns off FSDP2's
    keeping the root gathered, ``FSDPState._lazy_init``), so every micro-batch gathers it
    to open the forward and again to open the backward, with nothing yet to hide behind,
    and the last one reduces its gradients after the embedding's backward, the last thing
    the backward computes: all of the root's communication is exposed."""
    hidden_ag = max(0.0, ag_block - blk_f)  # prefetch one block ahead
    total = 2 * m * nl * ag_block + nl * rs_block  # ZeRO-3 gathers again for the backward
    total += 2 * m * ag_root + rs_root
    exposed = 2 * m * ag_root + rs_root
    exposed += m * (ag_block + (nl - 1) * hidden_ag)
    # Backward: while a block computes, the next block's gather and (on the last
    # micro-batch) this block's reduce-scatter both cross the same links, so they hide
    # behind its compute together, not each on its own.
    exposed += (m - 1) * nl * max(0.0, ag_block - blk_b)
    exposed += nl * max(0.0, ag_block + rs_block - blk_b) + rs_block
    return DpTerms(total, exposed, 0.0)


def _cpu_late_peers(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, mbt: Any,
                    recompute_early_stop: bool, group: int = 2) -> float:
    """On a CPU nothing of FSDP's communication hides: FSDP2 overlaps its collectives with
    computation through CUDA streams, and a CPU has none. Its implicit prefetch issues each
    unit's all-gather on "the all-gather stream" with ``async_op=False``
    (``FSDPParamGroup.unshard_async_op`` defaults to False), and ``foreach_reduce`` calls
    the reduce-scatter without ``async_op`` on "the reduce-scatter stream"
    (torch 2.13, ``distributed/fsdp/_fully_shard/_fsdp_param_group.py`` and
    ``_fsdp_collectives.py``); on a CPU those stream contexts are no-ops, so every gather
    and every gradient reduction runs to its end on the thread that issued it, between two
    blocks' computation. Each is then a blocking collective after a chunk of computation,
    as tensor parallelism's all-reduces are, and pays the same calibrated late-peer wait
    (``ClusterSpec.blocking_wait`` for a group of ``group``, the dp group; 0 where not
    calibrated). This returns the waits; the collectives themselves are all exposed.

    Each call waits ``w(c)``, ``c`` the computation since the rank's previous collective: a
    block's (or a unit's) forward or backward between two blocks' collectives, 0 where two
    follow each other or only the root's layers (embedding, output layer) lie between; the
    first gather of a step is priced as following nothing. FSDP gathers the root's unit
    (embedding, final norm, output layer and the blocks no unit holds) before each
    forward and each backward. ZeRO-3 (a unit per block): each micro-batch's forward
    gathers the root and block 0 back to back, every later block after the block before
    it; its backward gathers the root and the last block back to back, every earlier block
    after the later block's backward, except in the last micro-batch, where each block's
    gradients are reduced after its backward and the next gather follows that reduction,
    and the root's gradients are reduced at the end. ZeRO-1/2 (``nl // k`` units of ``k``
    blocks, :func:`_zero12`) gather once a step -- the root, unit 0 after it, each later unit
    after the unit before -- and reduce each unit's gradients after its backward (the
    last unit's after the root's left-over blocks too), the root's at the end: ZeRO-2 in
    every micro-batch, ZeRO-1 in the last; under a pipeline all at the end of the
    schedule, back to back."""
    def w(chunk: float) -> float:
        return cluster.blocking_wait(chunk, group)
    m, nl, blk = plan.n_microbatches, mbt.nl, mbt.blk
    f = blk.forward + 2 * (mbt.ar + mbt.wait)
    b = blk.backward + blk.recompute(plan.recompute, recompute_early_stop) + 2 * (mbt.ar + mbt.wait)
    w0 = w(0.0)
    if plan.zero >= 3:
        return (m * (2 * w0 + (nl - 1) * w(f)) + (m - 1) * (2 * w0 + (nl - 1) * w(b))
                + (nl + 2) * w0 + nl * w(b))
    k = P.zero12_unit_blocks(model, plan.tp, plan.ep)
    n_units = nl // k
    left = nl - n_units * k  # the root's blocks
    gathers = w0 + (w0 + (n_units - 1) * w(k * f) if n_units else 0.0)
    if plan.pp > 1:
        return gathers + (n_units + 1) * w0
    reduce = (w((left + k) * b) + (n_units - 1) * w(k * b) + w0 if n_units else w(nl * b))
    return gathers + (plan.n_microbatches if plan.zero == 2 else 1) * reduce


def _zero12(model: ModelSpec, plan: ParallelPlan, hw: Any, nl: int, blk_f: float, blk_b: float,
            rs_kind: str, group: tuple[int, int, int], coll: Callable[..., float],
            expert_tp: bool = False) -> DpTerms:
    """ZeRO-1/2 (runtime/parallel/fsdp.py): ``nl // k`` FSDP units of ``k`` blocks
    (:func:`ptd.cost.params.zero12_unit_blocks`) and the root's unit (the ``nl % k`` blocks
    left and the rank's other parameters). Each is gathered once per step -- the root's
    first, at the start of the forward, then each unit's behind the previous unit's forward
    -- and kept until the last backward; each is reduce-scattered in the last micro-batch's
    backward (ZeRO-1) or in every one (ZeRO-2), a unit's behind the next unit's backward, the
    first unit's and the root's (at the very end) exposed. Under a pipeline torch defers every
    reduce-scatter to the end of the schedule."""
    dp_n, dp_nodes, dp_per = group
    block = P.local_block_numel(model, plan.tp, plan.ep, expert_tp)  # (experts with it: see _fsdp)
    k = P.zero12_unit_blocks(model, plan.tp, plan.ep)
    n_units = nl // k
    root = (nl % k) * block + _outside_blocks(model, plan, nl, block, expert_tp)

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
                     coll: Callable[..., float], expert_tp: bool = False) -> DpTerms:
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
    block_bytes = P.local_block_numel(model, plan.tp, plan.ep, expert_tp) * DTYPE_BYTES[plan.dtype]
    ag_block = t * coll("all_gather", block_bytes / t, dp_n, hw, dp_nodes, dp_per)
    gathers = 3 if plan.recompute == "full" else 2
    gather_total = gathers * plan.n_microbatches * nl * ag_block
    total = gather_total + nl * rs_block
    exposed = gather_total + (nl - 1) * max(0.0, rs_block - blk_b) + rs_block
    return DpTerms(total, exposed, 0.0)

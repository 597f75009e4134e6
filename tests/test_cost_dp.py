"""Data-parallel communication of a step (cost/dp.py) against hand arithmetic.

The collectives are priced by a stand-in whose times are easy to write out -- every
collective takes ``bytes / 1e9`` seconds, an all-gather 1 ms more -- so each expected value
below is the formula of the module docstring worked by hand. The tiny model holds 180,800
parameters (36,992 per block); with tp 2 a rank holds 90,688 (18,560 per block).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from helpers import cluster, gpt
from ptd.specs import load_hardware
from ptd.cost.dp import dp_terms
from ptd.specs import ParallelPlan, get_preset

TINY = get_preset("tiny")
GPU = cluster("h100-sxm", 8)


def coll(kind, nbytes, n, hw, nodes=1, per_node=None):  # noqa: ANN001
    return nbytes / 1e9 + (1e-3 if kind == "all_gather" else 0.0)


def blk(forward: float, backward: float, recompute: float = 0.0, routed: float = 0.0
        ) -> SimpleNamespace:
    return SimpleNamespace(forward=forward, backward=backward, routed_forward=routed,
                           recompute=lambda kind, early=True: recompute if kind == "full" else 0.0)


def mb(b: float = 0.0, rc: float = 0.0, tb: float = 0.0, nl: int = 4, block=None, ar=0.0,
       wait=0.0) -> SimpleNamespace:
    return SimpleNamespace(b=b, rc=rc, tb=tb, nl=nl, blk=block or blk(0.0, 0.0), ar=ar, wait=wait)


def terms(plan, m, overlap=True, early=True):  # noqa: ANN001
    return dp_terms(TINY, plan, GPU, m, (plan.dp, 1, plan.dp), coll, overlap, early)


def test_one_replica_communicates_nothing() -> None:
    t = terms(ParallelPlan(dp=1, global_batch=8), mb(b=1.0))
    assert (t.total, t.exposed, t.opt_comm) == (0.0, 0.0, 0.0)


def test_ddp_hides_all_but_the_last_bucket() -> None:
    # fp32 gradients 4 * 180,800 = 723,200 B -> all-reduce 723.2 us; one 25 MiB bucket holds
    # them all, so the last bucket is the whole reduction and nothing hides.
    t = terms(ParallelPlan(dp=4, zero=0, global_batch=8), mb(b=10.0))
    assert t.total == pytest.approx(723.2e-6)
    assert t.exposed == pytest.approx(723.2e-6)
    assert t.opt_comm == 0.0  # no ZeRO-1 exchange without ZeRO


def test_ddp_without_overlap() -> None:
    t = terms(ParallelPlan(dp=4, zero=0, global_batch=8), mb(b=10.0), overlap=False)
    assert t.exposed == pytest.approx(723.2e-6)
    assert t.opt_comm == 0.0


# ZeRO-1/2 (FSDP without resharding after forward), m = 2 micro-batches (global batch 8 over
# dp 4, micro-batch 1), fp32. A unit closes at 25 MiB of fp32 parameters: the tiny model's
# 36,992-parameter block is 147,968 B, so its 4 blocks stay with the root in one unit of all
# 180,800 parameters: gather 4 * 180,800 B = 723.2 us + 1 ms = 1.7232 ms, reduce-scatter
# 723.2 us, neither with anything to hide behind.
AG_T, RS_T = 1.7232e-3, 723.2e-6


def zero12(zero: int, **kw) -> ParallelPlan:  # noqa: ANN003
    return ParallelPlan(**{"dp": 4, "zero": zero, "micro_batch": 1, "global_batch": 8, **kw})


def test_zero1_on_one_unit_gathers_once_and_reduces_once() -> None:
    t = terms(zero12(1), mb(nl=4, block=blk(0.5e-3, 2e-3)))
    assert t.total == pytest.approx(AG_T + RS_T)
    assert t.exposed == pytest.approx(AG_T + RS_T)
    assert t.opt_comm == 0.0  # no exchange after the step: the next forward gathers


def test_zero2_on_one_unit_reduces_every_micro_batch() -> None:
    t = terms(zero12(2), mb(nl=4, block=blk(0.5e-3, 2e-3)))
    assert t.total == pytest.approx(AG_T + 2 * RS_T)
    assert t.exposed == pytest.approx(AG_T + 2 * RS_T)


# Llama-3-8B: a block holds 2 x 4096^2 + 2 x 4096 x 1024 + 3 x 4096 x 14336 + 2 x 4096
# = 218,112,000 parameters (872 MB of fp32: one unit each); the root's unit the embeddings and
# output layer, 2 x 128,256 x 4096, and the final norm: 1,050,677,248. With the stand-in
# (bytes / 1e9, an all-gather 1 ms more), fp32: a block gathers in 0.872448 s + 1 ms and
# reduce-scatters in 0.872448 s; the root in 4.202708992 s (+ 1 ms for the gather).
M8 = get_preset("llama3-8b")
AG_B, RS_B = 0.872448 + 1e-3, 0.872448
AG_R, RS_R = 4.202708992 + 1e-3, 4.202708992


def test_zero12_units_of_one_block_hide_behind_their_neighbours() -> None:
    # 32 blocks, 0.5 s of forward and 1 s of backward per block (tp terms 0): the root's
    # gather and the first block's show, each later gather 0.373448 s past the block before
    # it; in the backward each block's reduce-scatter hides behind the next (1 s), the
    # first block's and the root's (at the very end) show
    m = mb(nl=32, block=blk(0.5, 1.0))
    fwd = AG_R + AG_B + 31 * (AG_B - 0.5)
    for zero, n_rs in ((1, 1), (2, 2)):
        t = dp_terms(M8, zero12(zero), GPU, m, (4, 1, 4), coll, True, True)
        assert t.total == pytest.approx(AG_R + 32 * AG_B + n_rs * (RS_R + 32 * RS_B))
        assert t.exposed == pytest.approx(fwd + n_rs * (RS_R + RS_B))
        t = dp_terms(M8, zero12(zero), GPU, m, (4, 1, 4), coll, False, True)
        assert t.exposed == pytest.approx(t.total)  # without overlap all of it shows


# The root's unit of TINY: 180,800 - 4 x 36,992 = 32,832 parameters (embedding and output
# layer 256 x 64 each, final norm 64). Resharded after the forward like the blocks, it is
# gathered to open each micro-batch's forward and again its backward, and reduced after the
# last backward, none of it hidden: with 2 micro-batches and the ``coll`` stand-in, 4
# gathers of 2 x 32,832 B (65.664 us + 1 ms) and a reduce-scatter of 4 x 32,832 B.
ROOT = 4 * (65.664e-6 + 1e-3) + 131.328e-6


def test_zero3_gathers_twice_and_hides_behind_blocks() -> None:
    # m = 2 micro-batches (global batch 8 over dp 4, micro-batch 1), 4 blocks. Per block:
    # gather 2 * 36,992 B (bf16) = 73.984 us + 1 ms = 1.073984 ms; reduce-scatter of fp32
    # gradients 4 * 36,992 = 147.968 us. Block compute: forward 0.5 ms, backward 2 ms,
    # tp all-reduce 0.1 ms and wait 0.05 ms, twice each way.
    p = ParallelPlan(dp=4, zero=3, micro_batch=1, global_batch=8, dtype="bf16")
    m = mb(nl=4, block=blk(0.5e-3, 2e-3), ar=0.1e-3, wait=0.05e-3)
    t = terms(p, m)
    ag, rs = 1.073984e-3, 147.968e-6
    assert t.total == pytest.approx(2 * 2 * 4 * ag + 4 * rs + ROOT)
    f = 0.5e-3 + 2 * 0.15e-3  # 0.8 ms of forward per block: the gather outlasts it
    b = 2e-3 + 2 * 0.15e-3    # 2.3 ms of backward: gather and reduce-scatter hide
    forward = 2 * (ag + 3 * (ag - f))           # the first gather, then what shows past f
    backward = (2 - 1) * 4 * max(0.0, ag - b)   # earlier micro-batches' backward gathers
    backward += 4 * max(0.0, ag + rs - b) + rs  # the last one: both share the links
    assert t.exposed == pytest.approx(forward + backward + ROOT)
    assert t.opt_comm == 0.0


def test_zero3_recompute_widens_the_backward_window() -> None:
    p = ParallelPlan(dp=4, zero=3, micro_batch=1, global_batch=8, dtype="bf16", recompute="full")
    ag, rs = 1.073984e-3, 147.968e-6
    # backward 0.9 ms + recompute 0.4 ms = 1.3 ms: the last micro-batch's gather + reduce-
    # scatter (1.221952 ms) hide, the earlier ones' gathers (1.073984 ms) too
    t = terms(p, mb(nl=4, block=blk(2e-3, 0.9e-3, 0.4e-3)))
    assert t.exposed == pytest.approx(2 * ag + rs + ROOT)  # first gathers (forward hides the rest)
    t2 = terms(p.replace(recompute="none"), mb(nl=4, block=blk(2e-3, 0.9e-3, 0.4e-3)))
    assert t2.exposed == pytest.approx(2 * ag + 4 * (ag - 0.9e-3) + 4 * (ag + rs - 0.9e-3) + rs
                                       + ROOT)


# ------------------------------------------------------------ kinds, windows, buckets
def by_kind(kind, nbytes, n, hw, nodes=1, per_node=None):  # noqa: ANN001
    """A stand-in that tells the collectives apart: an all-reduce moves twice the bytes."""
    return {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.5}[kind] * nbytes / 1e9


def test_ddp_window_is_the_last_backward_with_its_recompute_and_tp() -> None:
    # the 8B model: 4 * 8,030,261,248 B of fp32 gradients = 32.12 GB -> all-reduce 64.24 s;
    # the last 25 MiB bucket is 25 * 2**20 / 32.12e9 of it; the window is b + rc + tb
    p = ParallelPlan(dp=4, zero=0, global_batch=8)
    g = 4 * 8_030_261_248
    t_ar = 2 * g / 1e9
    m = mb(b=20.0, rc=7.0, tb=3.0)
    t = dp_terms(get_preset("llama3-8b"), p, GPU, m, (4, 1, 4), by_kind, True, True)
    assert t.total == pytest.approx(t_ar)
    assert t.exposed == pytest.approx(t_ar - 30.0)
    t = dp_terms(get_preset("llama3-8b"), p, GPU, mb(b=100.0), (4, 1, 4), by_kind, True, True)
    assert t.exposed == pytest.approx(t_ar * 25 * 2**20 / g)  # all but the last bucket hides


def test_compressed_gradients_move_two_bytes_each() -> None:
    p = ParallelPlan(dp=4, zero=0, global_batch=8, grad_compression="fp16")
    t = dp_terms(TINY, p, GPU, mb(), (4, 1, 4), by_kind, False, True)
    assert t.total == pytest.approx(2 * 2 * 180_800 / 1e9)


@pytest.mark.parametrize("hw, kind_factor", [("h100-sxm", 1.0), ("cpu", 2.0)])
def test_zero2_reduce_scatter_on_gpus_all_reduce_on_gloo(hw: str, kind_factor: float) -> None:
    # one micro-batch, the tiny model's one unit: a gather of 1.5 * 4 * 180,800 B and a
    # reduce-scatter (GPU) or all-reduce (gloo, twice the bytes) of 4 * 180,800 B
    p = ParallelPlan(dp=4, zero=2, micro_batch=1, global_batch=4)
    t = dp_terms(TINY, p, cluster(hw, 4), mb(nl=4), (4, 1, 4), by_kind, False, True)
    assert t.total == pytest.approx(1.5 * 4 * 180_800 / 1e9 + kind_factor * 4 * 180_800 / 1e9)
    assert t.opt_comm == 0.0


def test_zero3_three_micro_batches_tp_waits_and_no_overlap() -> None:
    # m = 3 (global batch 12 over dp 4), 4 blocks; gather 1.5 * 2 * 36,992 / 1e9 = 110.976 us,
    # reduce-scatter (GPU) 4 * 36,992 / 1e9 = 147.968 us; forward 0.05 ms, backward 0.1 ms,
    # tp all-reduce 0.01 ms and wait 0.005 ms, twice each way: f = 0.08 ms, b = 0.13 ms.
    # The root (32,832 parameters): 2 gathers a micro-batch of 1.5 * 2 * 32,832 / 1e9 =
    # 98.496 us, one reduce-scatter of 4 * 32,832 / 1e9 = 131.328 us, all exposed.
    p = ParallelPlan(dp=4, zero=3, micro_batch=1, global_batch=12, dtype="bf16")
    m = mb(nl=4, block=blk(0.05e-3, 0.1e-3), ar=0.01e-3, wait=0.005e-3)
    ag, rs, f, b = 110.976e-6, 147.968e-6, 0.08e-3, 0.13e-3
    root = 2 * 3 * 98.496e-6 + 131.328e-6
    t = dp_terms(TINY, p, GPU, m, (4, 1, 4), by_kind, True, True)
    assert t.total == pytest.approx(2 * 3 * 4 * ag + 4 * rs + root)
    want = 3 * (ag + 3 * max(0.0, ag - f))          # forward
    want += (3 - 1) * 4 * max(0.0, ag - b)          # earlier backward gathers: hidden (0)
    want += 4 * max(0.0, ag + rs - b) + rs          # the last backward
    assert t.exposed == pytest.approx(want + root)
    # without overlap nothing hides: every gather and reduce-scatter is exposed
    t = dp_terms(TINY, p, GPU, m, (4, 1, 4), by_kind, False, True)
    assert t.exposed == pytest.approx(3 * (ag + 3 * ag) + (3 - 1) * 4 * ag + 4 * (ag + rs) + rs
                                      + root)


def test_zero2_with_a_pipeline_reduces_once_after_the_schedule() -> None:
    # pp 2, dp 2, m = 2, 16 blocks on the rank: torch's schedules defer FSDP's reduce-scatters
    # to the end, so ZeRO-2 reduces once per step as ZeRO-1 does and none of it hides; the
    # forward's gathers hide as without a pipeline. The rank with the most parameters holds
    # the output layer and final norm (525,340,672) beside its 16 blocks.
    p = ParallelPlan(dp=2, pp=2, zero=2, micro_batch=1, global_batch=4)
    t = dp_terms(M8, p, GPU, mb(nl=16, block=blk(0.5, 0.8)), (2, 1, 2), coll, True, True)
    ag_r, rs_r = 4 * 525_340_672 / 1e9 + 1e-3, 4 * 525_340_672 / 1e9
    assert t.total == pytest.approx(ag_r + 16 * AG_B + rs_r + 16 * RS_B)
    assert t.exposed == pytest.approx(ag_r + AG_B + 15 * (AG_B - 0.5) + rs_r + 16 * RS_B)


@pytest.mark.parametrize("hw, kind_factor", [("h100-sxm", 1.0), ("cpu", 2.0)])
def test_zero3_reduces_with_an_all_reduce_on_gloo(hw: str, kind_factor: float) -> None:
    p = ParallelPlan(dp=4, zero=3, micro_batch=1, global_batch=4, dtype="bf16")
    t = dp_terms(TINY, p, cluster(hw, 4), mb(nl=4), (4, 1, 4), by_kind, False, True)
    ag = 1.5 * 2 * 36_992 / 1e9
    # the root's 32,832 parameters: gathered for the forward and the backward, reduced once
    root = 2 * 1.5 * 2 * 32_832 / 1e9 + kind_factor * 4 * 32_832 / 1e9
    assert t.total == pytest.approx(2 * 4 * ag + 4 * kind_factor * 4 * 36_992 / 1e9 + root)


def test_zero3_gathered_tensor_by_tensor_and_waited_for() -> None:
    # DeepSpeed 2021 (zero3_gather "param-sync"): the tiny block's 9 tensors (2 norms, wq,
    # wk, wv, wo, w1, w3, w2) each gathered on its own -> 9 stand-in latencies of 1 ms and
    # the block's 2 * 36,992 B once: 9e-3 + 73.984e-6 = 9.073984 ms per block gather. None
    # hides. Full recompute gathers a third time. Reduce-scatter 147.968 us per block hides
    # behind backward 0.9 ms + recompute 0.4 ms, except the last block's.
    p = ParallelPlan(dp=4, zero=3, micro_batch=1, global_batch=8, dtype="bf16", recompute="full")
    m = mb(nl=4, block=blk(2e-3, 0.9e-3, 0.4e-3))
    ag, rs = 9.073984e-3, 147.968e-6

    def run(plan, overlap=True):  # noqa: ANN001
        return dp_terms(TINY, plan, GPU, m, (4, 1, 4), coll, overlap, True, 0, "param-sync")
    t = run(p)
    assert t.total == pytest.approx(3 * 2 * 4 * ag + 4 * rs)
    assert t.exposed == pytest.approx(3 * 2 * 4 * ag + rs)
    t = run(p.replace(recompute="none"))  # forward and backward gathers only
    assert t.total == pytest.approx(2 * 2 * 4 * ag + 4 * rs)
    assert t.exposed == pytest.approx(2 * 2 * 4 * ag + rs)
    t = run(p, overlap=False)  # nothing hides: every reduce-scatter shows too
    assert t.exposed == pytest.approx(t.total)
    # the default (FSDP's per-block prefetched gathers) prices 1 latency per block gather
    # and the root's unit (ROOT: gathered per pass, not tensor by tensor)
    assert terms(p, m).total == pytest.approx(2 * 2 * 4 * 1.073984e-3 + 4 * rs + ROOT)


def test_ptd_reduces_model_parallel_zero0_gradients_after_the_backward():
    """ptd's runtime all-reduces zero-0 gradients after the backward when tp, pp, cp or ep > 1
    (GradAllReduce), so none of it hides; plain data parallelism is DDP, which overlaps; a
    stack that overlaps with tp (Megatron-Core) hides it there too."""
    from ptd.cost.estimate import estimate
    from ptd.cost.stacks import stack_options
    from ptd.specs import ClusterSpec, load_hardware
    from ptd.specs.model import get_preset
    from ptd.specs.plan import ParallelPlan
    m = get_preset("llama2-7b")
    c = ClusterSpec(load_hardware("h100-sxm"), 8)
    tp2 = ParallelPlan(dp=4, tp=2, micro_batch=4, global_batch=16, seq_len=1024, dtype="bf16")
    ptd = estimate(m, c, tp2, options=stack_options("ptd")).step
    assert ptd.dp_comm_exposed == ptd.dp_comm_total > 0
    core = estimate(m, c, tp2, options=stack_options("megatron-core")).step
    assert core.dp_comm_exposed < core.dp_comm_total
    dp8 = tp2.replace(dp=8, tp=1, global_batch=32)
    plain = estimate(m, c, dp8, options=stack_options("ptd")).step
    assert plain.dp_comm_exposed < plain.dp_comm_total


def _late_peer_cpu(workers: int) -> "ClusterSpec":  # noqa: F821
    """A CPU whose calibrated late-peer wait is 1 ms plus the chunk of computation before
    the collective (two points, interpolated linearly): wait(c) = 1e-3 + c."""
    import dataclasses
    from ptd.specs.hardware import ClusterSpec
    hw = dataclasses.replace(load_hardware("cpu"),
                             blocking_wait_measured={workers: [[0.0, 1e-3], [1.0, 1.001]]})
    return ClusterSpec(hw, workers, workers)


def test_zero3_on_a_cpu_hides_nothing_and_each_collective_waits_for_late_peers() -> None:
    # FSDP2 overlaps through CUDA streams; on a CPU its gathers and reductions block the
    # thread that issues them (torch 2.13 _fsdp_param_group.py: unshard_async_op False;
    # _fsdp_collectives.foreach_reduce: no async_op), so all of it is exposed, and each call
    # waits for its peers after the computation before it: w(c) = 1e-3 + c here.
    # TINY: 4 blocks; m = 8 / (4 x 1) = 2; block forward 10 ms, backward 20 ms, no tp.
    # Calls, in order (w0 = w(0) = 1 ms, wf = w(0.01) = 11 ms, wb = w(0.02) = 21 ms):
    #   each forward: root, block 0 back to back, blocks 1-3 after a block: 2 w0 + 3 wf
    #   first backward: root, block 3 back to back, blocks 2-0 after a block: 2 w0 + 3 wb
    #   last backward: root and block 3 gathered (2 w0); each block reduced after its
    #   backward (4 wb), blocks 2-0 gathered right after (3 w0), the root reduced last (w0)
    # = 2 x 0.035 + 0.065 + (0.006 + 0.084) = 0.225 s
    p = ParallelPlan(dp=4, zero=3, micro_batch=1, global_batch=8, dtype="bf16")
    m = mb(nl=4, block=blk(0.01, 0.02))
    t = dp_terms(TINY, p, _late_peer_cpu(4), m, (4, 1, 4), by_kind, True, True)
    ag, ar = 1.5 * 2 * 36_992 / 1e9, 2 * 4 * 36_992 / 1e9  # gloo: an all-reduce of fp32
    root = 2 * 2 * 1.5 * 2 * 32_832 / 1e9 + 2 * 4 * 32_832 / 1e9  # the root's unit
    assert t.total == pytest.approx(2 * 2 * 4 * ag + 4 * ar + root)
    assert t.exposed == pytest.approx(t.total + 0.225)
    # the same plan on GPUs hides the gathers behind the blocks and pays no wait
    g = dp_terms(TINY, p, GPU, m, (4, 1, 4), by_kind, True, True)
    assert g.exposed < g.total


# GPT, 7 blocks of hidden 448: about 12 x 448^2 = 2.41M parameters, 9.6 MB of fp32 a block,
# so a 25 MiB ZeRO-1/2 unit takes 3 blocks (28.9 MB; 2 make 19.3): 2 units, 1 block left
# to the root.
G7 = gpt(7, 448, 7, V=256, S=256)


@pytest.mark.parametrize("model, nl, zero, waits", [
    # TINY's 4 blocks fill no unit: the root holds them all. Gathered once, opening the
    # step: w0 = 0.001; reduced after all 4 blocks' backward: w(0.08) = 0.081, in both
    # micro-batches (ZeRO-2) or the last (ZeRO-1).
    (TINY, 4, 2, 0.001 + 2 * 0.081),
    (TINY, 4, 1, 0.001 + 0.081),
    # G7: root w0, unit 0 right after (w0), unit 1 after unit 0's 3 blocks w(0.03): 0.033;
    # reductions: unit 1 after the root's block and its own 3 (w(0.08) = 0.081), unit 0
    # after its 3 (w(0.06) = 0.061), the root right after (0.001): 0.143 a reduction pass
    (G7, 7, 2, 0.033 + 2 * 0.143),
    (G7, 7, 1, 0.033 + 0.143),
])
def test_zero12_on_a_cpu_hides_nothing_and_each_collective_waits(model, nl, zero, waits) -> None:  # noqa: ANN001
    from ptd.cost import params as P
    # the unit sizes the arithmetic above assumes
    assert P.zero12_unit_blocks(model, 1, 1) == {4: 178, 7: 3}[nl]
    p = ParallelPlan(dp=4, zero=zero, micro_batch=1, global_batch=8, dtype="bf16")
    t = dp_terms(model, p, _late_peer_cpu(4), mb(nl=nl, block=blk(0.01, 0.02)), (4, 1, 4),
                 by_kind, True, True)
    assert t.exposed == pytest.approx(t.total + waits)


def test_ddp_on_a_cpu_still_overlaps_its_buckets() -> None:
    # DDP's reducer runs its bucket all-reduces asynchronously (gloo's threads), so the
    # CPU path changes nothing for ZeRO-0: the one bucket of the tiny model is exposed, no wait
    p = ParallelPlan(dp=4, zero=0, global_batch=8)
    t = dp_terms(TINY, p, _late_peer_cpu(4), mb(b=10.0), (4, 1, 4), coll, True, True)
    assert t.exposed == pytest.approx(723.2e-6) and t.total == pytest.approx(723.2e-6)


def test_zero2_on_a_cpu_under_a_pipeline_reduces_back_to_back_at_the_end() -> None:
    # G7 over pp 2: the rank's 4 blocks (its share of 7) make 1 unit of 3 and 1 root
    # block. Gathers: root w0, unit 0 right after w0; the schedule defers the root's and the
    # unit's reductions to its end, one after the other: 2 w0. 4 x 1 ms in all.
    p = ParallelPlan(dp=2, pp=2, zero=2, micro_batch=1, global_batch=4, dtype="bf16")
    t = dp_terms(G7, p, _late_peer_cpu(4), mb(nl=4, block=blk(0.01, 0.02)), (2, 1, 2),
                 by_kind, True, True)
    assert t.exposed == pytest.approx(t.total + 0.004)


# ------------------------------------------------------------ FSDP's copies (CPUs)
def _copy_cpu(workers: int = 4) -> "ClusterSpec":  # noqa: F821
    """A CPU whose workers copy at 1 GB/s each (calibrated at that worker count)."""
    import dataclasses
    from ptd.specs.hardware import ClusterSpec
    hw = dataclasses.replace(load_hardware("cpu"), memory_bandwidth_measured={workers: 1e9})
    return ClusterSpec(hw, workers, workers)


@pytest.mark.parametrize("zero, dtype, fwd, bwd", [
    # TINY on dp 4: N = 180,800 parameters a rank before sharding, shards of 45,200; m = 2.
    # fp32: a gather copies the shard in (8 B each: 361,600) and the parameters out
    # (8 B each: 1,446,400) = 1,808,000 B; a reduction copies the gradients in
    # (4 + 4: 1,446,400) and the rank's chunk out (8: 361,600) = 1,808,000 B.
    # ZeRO-3 gathers twice a micro-batch and reduces once: forward 2 gathers, backward 2
    # gathers and the reduction, at 1 GB/s.
    (3, "fp32", 2 * 1.808e-3, 3 * 1.808e-3),
    # bf16 (c = 2): gather 45,200 x (4 + 3 x 2) + 2 x 2 x 180,800 = 452,000 + 723,200 =
    # 1,175,200 B; reduction (2 + 4) x 180,800 + 8 x 45,200 = 1,084,800 + 361,600 =
    # 1,446,400 B. ZeRO-2 gathers once and reduces every micro-batch, ZeRO-1 once.
    (2, "bf16", 1.1752e-3, 2 * 1.4464e-3),
    (1, "bf16", 1.1752e-3, 1.4464e-3),
    (0, "bf16", 0.0, 0.0),
])
def test_fsdp_copies_by_hand(zero: int, dtype: str, fwd: float, bwd: float) -> None:
    from ptd.cost import params as P
    from ptd.cost.dp import fsdp_copy_time
    cl = _copy_cpu()
    assert cl.memory_bandwidth == 1e9 and P.max_local_numel(TINY, ParallelPlan()) == 180_800
    p = ParallelPlan(dp=4, zero=zero, micro_batch=1, global_batch=8, dtype=dtype)
    assert fsdp_copy_time(TINY, p, cl) == pytest.approx((fwd, bwd), rel=1e-12)
    # dp_terms carries them, and a stack whose parameters are views of the gathered
    # buffer (Megatron-LM, DeepSpeed: fsdp_copy_out False) has none
    m = mb(nl=4, block=blk(0.01, 0.02))
    t = dp_terms(TINY, p, cl, m, (4, 1, 4), by_kind, True, True)
    assert (t.copy_forward, t.copy_backward) == pytest.approx((fwd, bwd), rel=1e-12)
    t = dp_terms(TINY, p, cl, m, (4, 1, 4), by_kind, True, True, 0, "unit", False)
    assert (t.copy_forward, t.copy_backward) == (0.0, 0.0)


@pytest.mark.parametrize("zero, passes_f, passes_b", [(3, 2, 2), (2, 1, 0), (1, 1, 0)])
def test_fsdp_copy_out_alone_on_gpus(zero: int, passes_f: int, passes_b: int) -> None:
    # On a GPU only the copy-out runs on the compute stream: 2 x 2 B x 180,800 = 723,200 B
    # a gather in bf16, at the preset's copy bandwidth; ZeRO-3 gathers for the forward and
    # the backward of both micro-batches, ZeRO-1/2 once a step (in the forward)
    from ptd.cost.dp import fsdp_copy_time
    p = ParallelPlan(dp=4, zero=zero, micro_batch=1, global_batch=8, dtype="bf16")
    bw = GPU.memory_bandwidth
    assert fsdp_copy_time(TINY, p, GPU) == pytest.approx(
        (passes_f * 723_200 / bw, passes_b * 723_200 / bw), rel=1e-12)


def test_step_time_counts_fsdp_copies_as_the_forward_and_backward_they_run_in() -> None:
    from ptd.cost.step import micro_batch, step_time
    cl = _copy_cpu()
    p = ParallelPlan(dp=4, zero=3, micro_batch=1, global_batch=8, dtype="fp32", seq_len=64)
    st = step_time(TINY, p, cl)
    mbt = micro_batch(TINY, p, cl, "flash", True, True, "autocast")
    assert st.forward == pytest.approx(2 * mbt.f + 2 * 1.808e-3, rel=1e-9)
    assert st.backward == pytest.approx(2 * mbt.b + 3 * 1.808e-3, rel=1e-9)
    assert st.compute == pytest.approx(st.forward + st.backward + st.recompute, rel=1e-9)


def test_which_stacks_copy_gathered_parameters_out() -> None:
    # FSDP2 (ptd's runtime, torchtitan) copies each gather out into the parameters;
    # Megatron-LM's distributed optimizer and DeepSpeed gather into the parameters' storage
    from ptd.cost.stacks import STACKS, stack_options
    assert {n for n in STACKS if stack_options(n).fsdp_copy_out} == {"ptd", "torchtitan"}


def test_fsdp_copies_under_a_pipeline_reduce_once() -> None:
    # TINY over pp 2 x dp 2, bf16, m = 8 / (2 x 1) = 4. The heavier rank is the last: 2
    # blocks (73,984) + output layer 16,384 + final norm 64 = 90,432 parameters, shards of
    # 45,216. One gather a step: 45,216 x 10 + 4 x 90,432 = 813,888 B; the schedule defers
    # the reduction to its end, once for all 4 micro-batches (ZeRO-2 too): 6 x 90,432 +
    # 8 x 45,216 = 904,320 B.
    from ptd.cost import params as P
    from ptd.cost.dp import fsdp_copy_time
    p = ParallelPlan(dp=2, pp=2, zero=2, micro_batch=1, global_batch=8, dtype="bf16")
    assert P.max_local_numel(TINY, p) == 90_432
    assert fsdp_copy_time(TINY, p, _copy_cpu()) == pytest.approx((813_888e-9, 904_320e-9),
                                                                 rel=1e-12)


def test_zero0_expert_parallel_reduces_dense_over_dp_and_experts_over_their_replicas() -> None:
    # tiny-moe (hidden 64, 4 blocks, 8 SwiGLU experts of 64, 8 heads of 8, 4 kv heads,
    # vocabulary 256, untied, no biases): a block holds attention 64*64*2 + 64*32*2 = 12,288,
    # two norms 128, the router 64*8 = 512 and experts 8 * 3 * 64*64 = 98,304; outside the
    # blocks embedding and output 2 * 256*64 and the final norm 64: 32,832. With ep 2 a rank
    # holds 4 experts a block: dense 4 * (12,288 + 128 + 512) + 32,832 = 84,544 parameters,
    # experts 4 * 4 * 12,288 = 196,608 -- fp32 gradients, 338,176 and 786,432 bytes.
    # EPGradSync: the dense ones over dp 4, the experts over the dp/ep = 2 ranks holding the
    # same experts, ep * tp = 2 ranks apart: on nodes of 2 devices, one on each of 2 nodes
    calls = []

    def record(kind, nbytes, n, hw, nodes=1, per_node=None):  # noqa: ANN001
        calls.append((kind, nbytes, n, nodes, per_node))
        return 1e-3 * n + nbytes / 1e9 if n > 1 else 0.0  # a group of one: nothing moves

    moe = get_preset("tiny-moe")
    plan = ParallelPlan(dp=4, ep=2, micro_batch=2, global_batch=8, seq_len=128)
    t = dp_terms(moe, plan, cluster("h100-sxm", 4, 2), mb(b=1.0), (4, 2, 2), record, False, True)
    assert calls == [("all_reduce", 338_176, 4, 2, 2), ("all_reduce", 786_432, 2, 2, 1)]
    want = 4e-3 + 338_176 / 1e9 + 2e-3 + 786_432 / 1e9
    assert t.total == pytest.approx(want, rel=1e-12)
    assert t.exposed == pytest.approx(want, rel=1e-12)  # after the backward: nothing hidden
    # ep = dp: each rank's experts have no replica, only the dense gradients travel
    calls.clear()
    plan2 = ParallelPlan(dp=2, ep=2, micro_batch=2, global_batch=8, seq_len=128)
    t2 = dp_terms(moe, plan2, cluster("h100-sxm", 2), mb(b=1.0), (2, 1, 2), record, False, True)
    assert calls == [("all_reduce", 338_176, 2, 1, 2), ("all_reduce", 786_432, 1, 1, 1)]
    assert t2.total == pytest.approx(2e-3 + 338_176 / 1e9, rel=1e-12)


def test_zero0_expert_parallel_reductions_on_a_cpu_wait_for_late_peers() -> None:
    # EPGradSync runs after the backward, on the calling thread: the dense all-reduce
    # follows the first block's backward work after its last all-to-all (the block's
    # backward less its routed experts', 2 x routed forward), the experts' all-reduce
    # follows at once. w(c) = 1e-3 + c. Block backward 30 ms, routed experts 5 ms forward:
    # w(0.030 - 0.010) = 21 ms, then w(0) = 1 ms where 2 ranks hold the same experts.
    moe = get_preset("tiny-moe")
    m = mb(b=1.0, block=blk(0.02, 0.03, routed=0.005))
    plan = ParallelPlan(dp=4, ep=2, micro_batch=2, global_batch=8, seq_len=128)
    base = dp_terms(moe, plan, cluster("h100-sxm", 4), m, (4, 1, 4), coll, False, True)
    cpu = dp_terms(moe, plan, _late_peer_cpu(4), m, (4, 1, 4), coll, False, True)
    assert cpu.total - base.total == pytest.approx(0.021 + 0.001, rel=1e-12)
    assert cpu.exposed - base.exposed == pytest.approx(0.022, rel=1e-12)
    # ep = dp: no other rank holds a rank's experts; only the dense all-reduce waits
    plan2 = ParallelPlan(dp=2, ep=2, micro_batch=2, global_batch=8, seq_len=128)
    base2 = dp_terms(moe, plan2, cluster("h100-sxm", 2), m, (2, 1, 2), coll, False, True)
    cpu2 = dp_terms(moe, plan2, _late_peer_cpu(2), m, (2, 1, 2), coll, False, True)
    assert cpu2.total - base2.total == pytest.approx(0.021, rel=1e-12)


def test_fsdp_units_cost_their_calibrated_hooks_per_micro_batch() -> None:
    from ptd.cost.dp import fsdp_unit_time
    from ptd.specs import ClusterSpec
    # calibrated per unit and micro-batch, with 2 workers at once (the cluster's node)
    hw = load_hardware("cpu").replace(overheads_measured={
        "fsdp_unit_forward": {1: 1e-4, 2: 2e-4}, "fsdp_unit_backward": {1: 1e-4, 2: 3e-4},
        "fsdp_unit_keep_forward": {2: 5e-5}, "fsdp_unit_keep_backward": {2: 7e-5}})
    two = ClusterSpec(hw, 2, 2)
    z3 = ParallelPlan(dp=2, zero=3, micro_batch=2, global_batch=8, seq_len=64)  # 2 micro-batches
    # ZeRO-3: tiny's 4 blocks a unit each and the root: 5 units, twice
    assert fsdp_unit_time(TINY, z3, two, 4) == pytest.approx((2 * 5 * 2e-4, 2 * 5 * 3e-4))
    # ZeRO-1/2: a unit holds 25 MiB of blocks (tiny's 148 kB blocks: all 4 join the root):
    # one unit, at the kept units' cost
    z2 = ParallelPlan(dp=2, zero=2, micro_batch=2, global_batch=8, seq_len=64)
    assert fsdp_unit_time(TINY, z2, two, 4) == pytest.approx((2 * 1 * 5e-5, 2 * 1 * 7e-5))
    # a pipeline rank with 2 chunks: 2 roots beside its 2 blocks; 4 micro-batches
    pv = ParallelPlan(pp=2, vpp=2, zero=3, micro_batch=1, global_batch=4, seq_len=64)
    assert fsdp_unit_time(TINY, pv, two, 2) == pytest.approx((4 * 4 * 2e-4, 4 * 4 * 3e-4))
    # expert parallelism: each MoE layer's experts are a unit of their own
    ep = ParallelPlan(dp=2, ep=2, zero=3, micro_batch=2, global_batch=4, seq_len=64)
    assert fsdp_unit_time(get_preset("tiny-moe"), ep, two, 4) == pytest.approx(
        (1 * 9 * 2e-4, 1 * 9 * 3e-4))
    # uncalibrated (GPUs, presets): nothing
    assert fsdp_unit_time(TINY, z3, cluster("h100-sxm", 8), 4) == (0.0, 0.0)
    # dp_terms adds them to FSDP's copies, in the forward and the backward
    plain = ClusterSpec(load_hardware("cpu"), 2, 2)
    m4 = mb(nl=4)
    a = dp_terms(TINY, z3, two, m4, (2, 1, 2), coll, True, True)
    b = dp_terms(TINY, z3, plain, m4, (2, 1, 2), coll, True, True)
    assert a.copy_forward - b.copy_forward == pytest.approx(2e-3)
    assert a.copy_backward - b.copy_backward == pytest.approx(3e-3)

"""Data-parallel communication of a step (cost/dp.py) against hand arithmetic.

The collectives are priced by a stand-in whose times are easy to write out -- every
collective takes ``bytes / 1e9`` seconds, an all-gather 1 ms more -- so each expected value
below is the formula of the module docstring worked by hand. The tiny model holds 180,800
parameters (36,992 per block); with tp 2 a rank holds 90,688 (18,560 per block).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from helpers import cluster
from ptd.cost.dp import dp_terms
from ptd.specs import ParallelPlan, get_preset

TINY = get_preset("tiny")
GPU = cluster("h100-sxm", 8)


def coll(kind, nbytes, n, hw, nodes=1, per_node=None):  # noqa: ANN001
    return nbytes / 1e9 + (1e-3 if kind == "all_gather" else 0.0)


def blk(forward: float, backward: float, recompute: float = 0.0) -> SimpleNamespace:
    return SimpleNamespace(forward=forward, backward=backward,
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


def test_ddp_without_overlap_and_zero1_exchange() -> None:
    t = terms(ParallelPlan(dp=4, zero=1, global_batch=8), mb(b=10.0), overlap=False)
    assert t.exposed == pytest.approx(723.2e-6)
    # ZeRO-1 all-gathers the updated fp32 parameters: 4 * 180,800 B + 1 ms
    assert t.opt_comm == pytest.approx(723.2e-6 + 1e-3)


def test_zero2_with_tp_waits_for_the_end_of_the_backward() -> None:
    p = ParallelPlan(dp=2, tp=2, zero=2, global_batch=8)
    t = terms(p, mb(b=10.0))
    # a rank's gradients: 4 * 90,688 = 362,752 B, all exposed with tp > 1
    assert t.total == pytest.approx(362.752e-6) and t.exposed == pytest.approx(362.752e-6)
    assert t.opt_comm == pytest.approx(362.752e-6 + 1e-3)


def test_zero3_gathers_twice_and_hides_behind_blocks() -> None:
    # m = 2 micro-batches (global batch 8 over dp 4, micro-batch 1), 4 blocks. Per block:
    # gather 2 * 36,992 B (bf16) = 73.984 us + 1 ms = 1.073984 ms; reduce-scatter of fp32
    # gradients 4 * 36,992 = 147.968 us. Block compute: forward 0.5 ms, backward 2 ms,
    # tp all-reduce 0.1 ms and wait 0.05 ms, twice each way.
    p = ParallelPlan(dp=4, zero=3, micro_batch=1, global_batch=8, dtype="bf16")
    m = mb(nl=4, block=blk(0.5e-3, 2e-3), ar=0.1e-3, wait=0.05e-3)
    t = terms(p, m)
    ag, rs = 1.073984e-3, 147.968e-6
    assert t.total == pytest.approx(2 * 2 * 4 * ag + 4 * rs)
    f = 0.5e-3 + 2 * 0.15e-3  # 0.8 ms of forward per block: the gather outlasts it
    b = 2e-3 + 2 * 0.15e-3    # 2.3 ms of backward: gather and reduce-scatter hide
    forward = 2 * (ag + 3 * (ag - f))           # the first gather, then what shows past f
    backward = (2 - 1) * 4 * max(0.0, ag - b)   # earlier micro-batches' backward gathers
    backward += 4 * max(0.0, ag + rs - b) + rs  # the last one: both share the links
    assert t.exposed == pytest.approx(forward + backward)
    assert t.opt_comm == 0.0


def test_zero3_recompute_widens_the_backward_window() -> None:
    p = ParallelPlan(dp=4, zero=3, micro_batch=1, global_batch=8, dtype="bf16", recompute="full")
    ag, rs = 1.073984e-3, 147.968e-6
    # backward 0.9 ms + recompute 0.4 ms = 1.3 ms: the last micro-batch's gather + reduce-
    # scatter (1.221952 ms) hide, the earlier ones' gathers (1.073984 ms) too
    t = terms(p, mb(nl=4, block=blk(2e-3, 0.9e-3, 0.4e-3)))
    assert t.exposed == pytest.approx(2 * ag + rs)  # first gathers (forward hides the rest)
    t2 = terms(p.replace(recompute="none"), mb(nl=4, block=blk(2e-3, 0.9e-3, 0.4e-3)))
    assert t2.exposed == pytest.approx(2 * ag + 4 * (ag - 0.9e-3) + 4 * (ag + rs - 0.9e-3) + rs)

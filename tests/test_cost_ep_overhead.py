"""Expert parallelism's own per-layer work, as ``ptd calibrate`` times it on a one-rank ep
mesh (``overheads_measured``: ``ep_layer_forward`` / ``_backward`` the whole of it,
``ep_all_to_all_forward`` / ``_backward`` one rows' all-to-all call's share), enters every
MoE block once per micro-batch: the calls' share as the all-to-alls' time (where a run's
measurement puts it), the rest as computation. Expected values by hand."""

import pytest

from ptd.cost import step as S
from ptd.specs import ClusterSpec, ParallelPlan, get_preset, load_hardware

MOE = get_preset("tiny-moe")  # 4 blocks, every one a MoE block


def _pair(plan, model=MOE):
    # no late-peer waits (``blocking_wait_measured``): they follow the block's computation,
    # which the overheads change (tested apart, test_ep_waits_follow_the_chunk_before_each_call)
    base = load_hardware("cpu").replace(blocking_wait_measured={})
    plain = ClusterSpec(base, plan.world_size, plan.world_size)
    # per worker count; the cluster's node runs 2 workers, so the 2-worker entries apply
    hw = base.replace(overheads_measured={
        **base.overheads_measured,
        "ep_layer_forward": {1: 1e-4, 2: 1e-3}, "ep_layer_backward": {1: 5e-5, 2: 4e-4},
        "ep_all_to_all_forward": {1: 1e-5, 2: 1e-4}, "ep_all_to_all_backward": {2: 5e-5}})
    cal = ClusterSpec(hw, plan.world_size, plan.world_size)
    return (S.step_time(model, plan, plain), S.step_time(model, plan, cal))


def test_ep_layer_overhead_per_block_and_micro_batch():
    # dp 2 = ep 2, micro-batch 1 of a global batch 4: 2 micro-batches a rank; 4 blocks.
    # A block's forward runs 2 rows' all-to-alls (there and back), its backward 2 more:
    # forward computation 1e-3 - 2 x 1e-4 = 8e-4 a block: 2 x 4 x 8e-4 = 6.4e-3 s more;
    # backward 4e-4 - 2 x 5e-5 = 3e-4: 2 x 4 x 3e-4 = 2.4e-3 s more;
    # the calls: 2 x 4 x (2 x 1e-4 + 2 x 5e-5) = 2.4e-3 s more all-to-all time
    plan = ParallelPlan(dp=2, ep=2, micro_batch=1, global_batch=4, seq_len=64)
    a, b = _pair(plan)
    assert b.forward - a.forward == pytest.approx(6.4e-3, rel=1e-9)
    assert b.backward - a.backward == pytest.approx(2.4e-3, rel=1e-9)
    assert b.ep_comm - a.ep_comm == pytest.approx(2.4e-3, rel=1e-9)
    # the whole measured difference, 2 x 4 x (1e-3 + 4e-4) = 11.2e-3, is in the step once
    assert b.total - a.total == pytest.approx(11.2e-3, rel=1e-9)


def test_ep_layer_overhead_under_full_recompute_repeats_the_forward():
    # a fully recomputed block runs its forward's computation again (all of it but the last
    # product, which carries no ep work): 2 micro-batches x 4 blocks x 8e-4 more recompute
    plan = ParallelPlan(dp=2, ep=2, micro_batch=1, global_batch=4, seq_len=64, recompute="full")
    a, b = _pair(plan)
    assert b.recompute - a.recompute == pytest.approx(6.4e-3, rel=1e-9)


def test_no_ep_layer_overhead_without_ep_or_experts():
    # ep 1 (experts whole on every rank) and a dense model: nothing added anywhere
    for model, plan in ((MOE, ParallelPlan(dp=2, micro_batch=1, global_batch=4, seq_len=64)),
                        (get_preset("tiny"), ParallelPlan(dp=2, micro_batch=1, global_batch=4,
                                                          seq_len=64))):
        a, b = _pair(plan, model)
        assert b.total == a.total and b.ep_comm == a.ep_comm == 0.0


def test_calls_longer_than_the_layer_leave_no_negative_computation():
    # a calibration where the calls read more than the whole layer (noise): the computation
    # part is 0, never negative; the calls are still the all-to-alls' time
    hw = load_hardware("cpu").replace(overheads_measured={
        "ep_layer_forward": {2: 1e-4}, "ep_layer_backward": {2: 1e-4},
        "ep_all_to_all_forward": {2: 1e-4}, "ep_all_to_all_backward": {2: 1e-4}})
    f, b, calls = S.ep_layer_overheads(ClusterSpec(hw, 2, 2))
    assert (f, b) == (0.0, 0.0) and calls == pytest.approx(4e-4, rel=1e-12)


def test_ep_waits_follow_the_chunk_before_each_call():
    """Each of a MoE block's five ep collectives per micro-batch waits ``w(c)`` after the
    computation ``c`` since the previous one: counts after the block's forward less its
    routed experts, dispatch at once, combine after the experts; in the backward the
    combine's gradient after the block's backward less the experts', the dispatch's after
    the experts' backward (twice their forward)."""
    from types import SimpleNamespace
    curve = load_hardware("cpu").replace(blocking_wait_measured={2: ((0.0, 1e-3), (1.0, 1.001))})
    two = ClusterSpec(curve, 2, 2)
    blk = SimpleNamespace(forward=0.010, backward=0.020, routed_forward=0.003)
    # w(c) = 1e-3 + c: (1 + 7) + 1 + (1 + 3) + (1 + 14) + (1 + 6) ms
    assert S.ep_waits(two, blk) == pytest.approx(0.035, rel=1e-12)
    assert S.ep_waits(ClusterSpec(load_hardware("cpu").replace(blocking_wait_measured={}), 2, 2),
                      blk) == 0.0


def test_ep_waits_enter_the_step_per_block_and_micro_batch():
    # dp 2 = ep 2, 2 micro-batches, 4 blocks: 8 x the five waits, in the all-to-alls' time;
    # with a flat curve (1 ms whatever the chunk) 8 x 5 ms = 40 ms, nothing else moves
    plan = ParallelPlan(dp=2, ep=2, micro_batch=1, global_batch=4, seq_len=64)
    base = load_hardware("cpu").replace(blocking_wait_measured={})
    flat = base.replace(blocking_wait_measured={2: ((0.0, 1e-3),)})
    a = S.step_time(MOE, plan, ClusterSpec(base, 2, 2))
    b = S.step_time(MOE, plan, ClusterSpec(flat, 2, 2))
    assert b.ep_comm - a.ep_comm == pytest.approx(0.040, rel=1e-9)
    assert b.compute == a.compute


def test_routed_products_are_the_experts_share_of_the_block():
    from ptd.cost import compute as C
    # tiny-moe, 512 tokens: each token's 2 experts run 3 products of 64 x 64 (SwiGLU):
    # 2 x 2 x 3 x 64 x 64 = 49,152 FLOPs a token, 25,165,824 in all
    assert sum(g.flops for g in C.routed_gemms(MOE, 512)) == 25_165_824
    hw = load_hardware("cpu")
    t = C.block_time(MOE, hw, 128, 4, 1, False, "fp32", hw.peak_flops["fp32"])
    assert 0 < t.routed_forward < t.forward
    dense = C.block_time(get_preset("tiny"), hw, 128, 4, 1, False, "fp32", hw.peak_flops["fp32"])
    assert dense.routed_forward == 0.0

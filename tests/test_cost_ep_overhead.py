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
    plain = ClusterSpec(load_hardware("cpu"), plan.world_size, plan.world_size)
    # per worker count; the cluster's node runs 2 workers, so the 2-worker entries apply
    base = load_hardware("cpu")
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

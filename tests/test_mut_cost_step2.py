"""Tests that bite mutants of ptd.cost.step left alive by the sample of seed 20261129
(``scripts/mutation_sample.py sample ... --n 30 --seed 20261129``): the pipeline's
point-to-point count and its bubble on a CPU whose workers share cores, which rank holds
the output layer under the ZB-V schedule, the DTensor overhead at tp 2, and the words of
``StepBreakdown.bound``.

As in tests/test_mut_cost_step.py, the pricing functions step.py composes are replaced by
stand-ins of known value where that isolates the composition; every expected value is
arithmetic written out in the comments."""

import pytest

from ptd.cost import compute as C
from ptd.cost import step as S
from ptd.specs.hardware import ClusterSpec, load_hardware
from ptd.specs.plan import ParallelPlan

# the same small Llama, GPU preset and stand-in collective
from test_mut_cost_step import GPU, LLAMA, _bytes_as_seconds


def exact(x):
    return pytest.approx(x, rel=1e-12, abs=0)


def _mbt(f, b, rc, tf, tb, nl=1):
    blk = C.BlockTime(forward=f, backward=b, attention_forward=0.0)
    return S.MicroBatch(f=f, b=b, rc=rc, tf=tf, tb=tb, nl=nl, blk=blk, ar=0.0, wait=0.0)


# ------------------------------------------------------------------ pipeline

# Catches: step.py:334 ``2 * (m * v + p - 1) * t_p2p`` -> ``2 * (m * v + p / 1) * t_p2p``
# (one transfer too many each way). By hand: a 1F1B pipeline's critical path runs
# m + p - 1 forward slots and as many backward slots (the schedule of Narayanan et al. 2021,
# fig. 4: the first micro-batch crosses p - 1 stage boundaries, then one per micro-batch),
# each slot ending in one activation (gradient) transfer: 2 (m + p - 1) transfers.
# p 4, m 2 (global batch 2, micro-batch 1, dp 1), v 1: 2 * (2 + 3) = 10 transfers. One
# transfer: fp32 activation of seq 8 x micro-batch 1 x hidden 8 = 256 bytes, priced 256 s by
# the stand-in; 4 ranks on one node of 8: not across nodes. Total 10 * 256 = 2560.
# Interleaved with v chunks a rank, every micro-batch passes each rank v times: m v slots
# plus the p - 1 of the fill each way. pp 2, v 2 (LLAMA's 4 blocks, one a stage), m 2:
# 2 * (2 * 2 + 1) = 10 transfers, 2560 again; m 4: 2 * (4 * 2 + 1) = 18 -> 4608.
def test_pipeline_point_to_point_count_by_hand(monkeypatch):
    calls = []
    monkeypatch.setattr(S, "_coll", _bytes_as_seconds(calls))
    mbt = _mbt(1.0, 2.0, 0.0, 0.0, 0.0)
    plan = ParallelPlan(dp=1, tp=1, pp=4, micro_batch=1, global_batch=2, seq_len=8, dtype="fp32")
    _, p2p = S.pipeline(LLAMA, plan, ClusterSpec(GPU, 4), mbt, 0.0)
    assert p2p == 2560.0
    assert calls == [("send_recv", 256, 2, 1, None)]
    inter = ParallelPlan(dp=1, tp=1, pp=2, vpp=2, schedule="interleaved-1f1b", micro_batch=1,
                         global_batch=2, seq_len=8, dtype="fp32")
    assert S.pipeline(LLAMA, inter, ClusterSpec(GPU, 2), mbt, 0.0)[1] == 2560.0
    m4 = inter.replace(global_batch=4)
    assert S.pipeline(LLAMA, m4, ClusterSpec(GPU, 2), mbt, 0.0)[1] == 4608.0


# A CPU whose 4 workers share cores: per-worker matmul rates measured with 1, 2 and 4 at
# once, 100, 80 and 30 FLOP/s (its cores: N R_N peaks at N = 2); no calibrated blocking wait.
SHARED = load_hardware("cpu").replace(gemm_flops_measured={"fp32": {1: 100.0, 2: 80.0, 4: 30.0}},
                                      blocking_wait_measured={}, overheads_measured={})


# Catches changes of the shared-core bubble (the fill's slots at the rank's own rate k, the
# collectives not sped up). pp 4, m 1, v 1: fill = p - 1 = 3. Without collectives each other
# rank computes in m of the m + fill slots, P = 1/4, X ~ Binomial(3, 1/4) of them beside
# the rank (27/64, 27/64, 9/64, 1/64), each case at R_4 x its mean time per FLOP: 1 busy
# 30/100, 2 busy 30/80, 3 busy (one core holds two at R_4, the other one at R_2)
# 30 (2/30 + 1/80) / 3, 4 busy 1 (tests/test_mut_cost_step.py). c_mb = 1 + 2 + 0.5 = 3.5:
# bubble = fill * c_mb * k. On a GPU (no sharing): fill * (c_mb + tf + tb) = 3 * 3.875.
def test_pipeline_bubble_with_shared_cores_by_hand(monkeypatch):
    monkeypatch.setattr(S, "_coll", _bytes_as_seconds([]))
    cluster = ClusterSpec(SHARED, 4, 4)
    plan = ParallelPlan(dp=1, tp=1, pp=4, micro_batch=1, global_batch=1, seq_len=8, dtype="fp32")
    k = (27 * 0.3 + 27 * 0.375 + 9 * (30 * (2 / 30 + 1 / 80) / 3) + 1.0) / 64
    bubble, _ = S.pipeline(LLAMA, plan, cluster, _mbt(1.0, 2.0, 0.5, 0.0, 0.0), 0.0)
    assert bubble == exact(3 * 3.5 * k)
    assert S.pipeline_rate(plan, cluster, _mbt(1.0, 2.0, 0.5, 0.0, 0.0), 0.0) == exact(k)
    # with collectives the fill's slots hold them at their own time: fill * (c k' + tf + tb)
    # where k' is the fixed point of pipeline_sharing (tested by hand there)
    mbt = _mbt(1.0, 2.0, 0.5, 0.25, 0.125)
    k2 = S.pipeline_sharing(cluster, "fp32", 1, 1, 3.0, 3.5, 0.375)
    assert 0 < k2 < 1
    assert S.pipeline(LLAMA, plan, cluster, mbt, 0.0)[0] == exact(3 * (3.5 * k2 + 0.375))
    gpu_bubble, _ = S.pipeline(LLAMA, plan, ClusterSpec(GPU, 4), mbt, 0.0)
    assert gpu_bubble == exact(3 * 3.875)
    # context parallelism's exposed exchange (0.5 a micro-batch) waits like the collectives:
    # in the fill's slots, and in the time the rank is not computing
    k3 = S.pipeline_sharing(cluster, "fp32", 1, 1, 3.0, 3.5, 0.875)
    assert k3 < k2  # the others wait more, so fewer compute beside the rank
    assert S.pipeline(LLAMA, plan, cluster, mbt, 0.5)[0] == exact(3 * (3.5 * k3 + 0.875))
    # a caller's rate is used as given
    assert S.pipeline(LLAMA, plan, cluster, mbt, 0.0, 0.5)[0] == exact(3 * (3.5 * 0.5 + 0.375))
    # one stage (no pipeline): nothing is lent
    flat = plan.replace(pp=1)
    assert S.pipeline_rate(flat, cluster, mbt, 0.0) == 1.0
    # context parallel ranks compute and wait together, as tp's do: pp 2 x cp 2 on the 4
    # workers is one other group of 2 (m 1, fill 1)
    cp = ParallelPlan(dp=1, tp=1, pp=2, cp=2, micro_batch=1, global_batch=1, seq_len=8,
                      dtype="fp32")
    assert S.pipeline_rate(cp, cluster, mbt, 0.0) == exact(
        S.pipeline_sharing(cluster, "fp32", 2, 1, 1.0, 3.5, 0.375))
    assert S.pipeline_rate(cp, cluster, mbt, 0.0) != S.pipeline_sharing(
        cluster, "fp32", 1, 1, 1.0, 3.5, 0.375)


# The step's computation on shared cores runs at the same rate k (m micro-batches of
# c_mb k), where the GPU's is m c_mb: step_time with micro_batch() replaced by a stand-in.
def test_step_time_computes_a_shared_core_pipeline_at_its_rate(monkeypatch):
    monkeypatch.setattr(S, "_coll", _bytes_as_seconds([]))
    mbt = _mbt(1.0, 2.0, 0.5, 0.0, 0.0)
    monkeypatch.setattr(S, "micro_batch", lambda *a, **kw: mbt)
    plan = ParallelPlan(dp=1, tp=1, pp=4, micro_batch=1, global_batch=2, seq_len=8, dtype="fp32")
    cluster = ClusterSpec(SHARED, 4, 4)
    k = S.pipeline_rate(plan, cluster, mbt, 0.0)
    # m 2, fill 3: each other rank computes with P = 2/5; X ~ Binomial(3, 2/5) of them:
    # 27/125, 54/125, 36/125, 8/125 at ratios 0.3, 0.375, 30 (2/30 + 1/80) / 3, 1
    assert k == exact((27 * 0.3 + 54 * 0.375 + 36 * (30 * (2 / 30 + 1 / 80) / 3) + 8) / 125)
    st = S.step_time(LLAMA, plan, cluster)
    assert st.compute == exact(2 * 3.5 * k)
    assert (st.forward, st.backward, st.recompute) == (exact(2 * 1.0 * k), exact(2 * 2.0 * k),
                                                       exact(2 * 0.5 * k))
    gpu = S.step_time(LLAMA, plan, ClusterSpec(GPU, 4))
    assert gpu.compute == exact(2 * 3.5)


# ------------------------------------------------------------------ micro-batch

# Catches: step.py:256 ``stage_to_rank(plan.n_stages - 1, plan)`` -> ``plan.n_stages | 1``
# (the wrong stage taken as the last). Under ZB-V (zero-bubble, two stages per rank in a V,
# Qi et al. 2023) with pp 2 the 4 stages sit on ranks 0, 1, 1, 0: the last stage -- the
# output layer and loss -- is on rank 0, beside the embedding. LLAMA's 4 blocks: one per
# stage, two per rank. With a block of (3, 5) s, an output layer of (7, 11) s and tp
# collectives of 0.25 s (2 per block forward, 5 backward; the output layer 3 forward,
# 0.75 s), rank 0 is the slowest:
#   f = 2 x 3 + 7 = 13; b = 2 x 5 + 11 = 21; rc = 0 (no recompute)
#   tf = 2 x 2 x 0.25 + 0.25 (embedding output) + 0.75 (output layer) = 2.0
#   tb = 2 x 5 x 0.25 + 0.25 (the output layer's input gradient) = 2.75
def test_micro_batch_zbv_output_layer_on_rank_zero(monkeypatch):
    blk = C.BlockTime(forward=3.0, backward=5.0, attention_forward=1.0)
    monkeypatch.setattr(S, "_block_time", lambda *a, **k: blk)
    monkeypatch.setattr(S, "_output_time", lambda *a, **k: (7.0, 11.0))
    monkeypatch.setattr(S, "_tp_collectives",
                        lambda *a, **k: S.TPCollectives(0.25, 0.25, 0.25, 2, 5, 0, 3, 0.75))
    plan = ParallelPlan(dp=1, tp=1, pp=2, schedule="zero-bubble", micro_batch=1,
                        global_batch=4, seq_len=8, dtype="bf16")
    mb = S.micro_batch(LLAMA, plan, ClusterSpec(GPU, 2), "flash", True, True)
    assert (mb.f, mb.b, mb.rc, mb.tf, mb.tb, mb.nl) == (13.0, 21.0, 0.0, 2.0, 2.75, 2)


# Catches: step.py:248 ``... if plan.tp > 1 else 0.0`` -> ``plan.tp > 2`` (the DTensor
# overhead dropped at tp 2). By hand from ptd.cost.compute's OPS_TP_* counts (checked
# against the runtime in tests/test_cost_vs_runtime.py): LLAMA's block has 7 linears
# (wq, wk, wv, wo, w1, w3, w2), no biases, no sequence parallelism: forward 7 x 4 = 28 and
# backward 7 x 9 = 63 DTensor operators; the output layer OPS_TP_OUTPUT (8, 14). One rank
# holds the 4 blocks and the output layer: forward 4 x 28 + 8 = 120 and backward
# 4 x 63 + 14 = 266 operators, each 1 ms more with a calibrated dtensor_op of 1 ms.
def test_micro_batch_dtensor_overhead_at_tp2():
    hw_dt = GPU.replace(overheads_measured={"dtensor_op": {2: 1e-3}})
    plan = ParallelPlan(dp=1, tp=2, pp=1, micro_batch=1, global_batch=1, seq_len=8,
                        dtype="bf16")
    base = S.micro_batch(LLAMA, plan, ClusterSpec(GPU, 2), "flash", True, True)
    dt = S.micro_batch(LLAMA, plan, ClusterSpec(hw_dt, 2), "flash", True, True)
    assert dt.f - base.f == pytest.approx(120e-3, rel=1e-6)
    assert dt.b - base.b == pytest.approx(266e-3, rel=1e-6)
    assert (dt.tf, dt.tb) == (base.tf, base.tb)  # the collectives are not operators


# A tp rank's work runs slower on DTensors by a calibrated share (``dtensor_compute_share``,
# ptd calibrate): the blocks' and the output layer's whole time, products, attention,
# passes and plain operators alike, a quarter longer here, with the DTensor operators' fixed
# cost (120 forward and 266 backward at 1 ms, above) added beside it, not scaled. The
# collectives are not the rank's work; without tp nothing changes.
def test_micro_batch_dtensor_share_slows_the_work_not_the_operators():
    def hw(**over):
        return ClusterSpec(GPU.replace(overheads_measured=over), 2)
    plan = ParallelPlan(dp=1, tp=2, pp=1, micro_batch=2, global_batch=2, seq_len=8,
                        dtype="bf16")
    base = S.micro_batch(LLAMA, plan, ClusterSpec(GPU, 2), "flash", True, True)
    both = S.micro_batch(LLAMA, plan, hw(dtensor_op={2: 1e-3},
                                         dtensor_compute_share={2: 0.25}),
                         "flash", True, True)
    assert both.f == pytest.approx(1.25 * base.f + 120e-3, rel=1e-9)
    assert both.b == pytest.approx(1.25 * base.b + 266e-3, rel=1e-9)
    assert (both.tf, both.tb) == (base.tf, base.tb)
    one = plan.replace(tp=1, dp=2, global_batch=4)
    assert S.micro_batch(LLAMA, one, hw(dtensor_compute_share={2: 0.25}), "flash", True,
                         True) == S.micro_batch(LLAMA, one, ClusterSpec(GPU, 2), "flash",
                                                True, True)


# The same share inside one block, for what recomputation reads from it: the forward and
# backward (less their DTensor operators: LLAMA's block has 28 and 63 at 1 ms), the
# attention's forward, the op policy's forward (the forward less attention and products,
# plus the products it repeats: all of them the block's work) and the last product's
# forward (less the plain operator cost beside it) are each a quarter longer; the
# operators on DTensors are not. At tp 1 the share does nothing.
def test_block_time_scales_every_part_of_the_work_by_the_share():
    def blk(share, tp=2):
        return C.block_time(LLAMA, GPU, 8, 2, tp, False, "bf16", 1e12, overhead=2e-6,
                            dtensor_overhead=1e-3, dtensor_share=share, selective="op")
    b0, b1 = blk(0.0), blk(0.25)
    assert b1.forward - 28e-3 == pytest.approx(1.25 * (b0.forward - 28e-3), rel=1e-9)
    assert b1.backward - 63e-3 == pytest.approx(1.25 * (b0.backward - 63e-3), rel=1e-9)
    assert b1.attention_forward == pytest.approx(1.25 * b0.attention_forward, rel=1e-9)
    assert b1.op_policy_forward - 28e-3 == \
        pytest.approx(1.25 * (b0.op_policy_forward - 28e-3), rel=1e-9)
    assert b1.last_matmul_forward - 2e-6 == \
        pytest.approx(1.25 * (b0.last_matmul_forward - 2e-6), rel=1e-9)
    assert blk(0.25, tp=1) == blk(0.0, tp=1)


# ------------------------------------------------------------------ words

# Catches: step.py:100 ``share = getattr(self, part) / self.total`` -> ``+`` (or any other
# share). By hand: compute 6 of a 10 s step is the largest part, 60 %; the exposed
# communication 1 + 0.5 = 1.5 s is below the compute: compute-bound. With 7 s of exposed
# data-parallel communication against 2 s of compute: communication-bound, 70 %.
def test_bound_words_and_share():
    b = S.StepBreakdown(total=10.0, compute=6.0, tp_comm=1.0, pp_comm=0.5, dp_comm_exposed=0.0,
                        bubble=1.5, optimizer=1.0)
    assert b.bound() == "compute-bound: the largest part is computation (60% of the step)"
    c = S.StepBreakdown(total=10.0, compute=2.0, tp_comm=0.0, pp_comm=0.0, dp_comm_exposed=7.0,
                        bubble=0.0, optimizer=1.0)
    assert c.bound() == ("communication-bound: the largest part is data-parallel communication "
                         "not hidden (70% of the step)")

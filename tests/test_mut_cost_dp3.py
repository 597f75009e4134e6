"""cost/dp.py: two pieces a sampled mutation run left untested (twenty-ninth session: 40 of
its 2,325 mutants, seed 20261130, 37 killed; docs/testing.md) -- the recomputed forward in
the chunk before a ZeRO-3 backward collective's late-peer wait, and a GPU's FSDP reduction
copies, which run beside the computation and are not charged. Torch-free; expected values
by hand."""

import pytest

from ptd.cost import compute as C
from ptd.cost import dp as DP
from ptd.cost.step import MicroBatch
from ptd.specs import ClusterSpec, ModelSpec, ParallelPlan, load_hardware
from test_mut_cost_step4 import _wait_line

MODEL = ModelSpec(name="t", n_layers=4, hidden=64, n_heads=4, n_kv_heads=4, ffn_hidden=128,
                  vocab_size=256, max_seq_len=64)
H100 = load_hardware("h100-sxm")


def test_a_zero3_backward_gather_waits_after_the_recomputed_forward_too():
    # ZeRO-3 over 2, m = 2, 4 blocks on the rank, tp 1 (no tp collectives), full recompute;
    # a block: forward 10 ms, backward 20 ms, its last product 2 ms, so the recompute repeats
    # 8 ms; late-peer wait w(c) = 1 ms + 0.1 c. Chunks: forward f = 10 ms, backward
    # b = 20 + 8 = 28 ms; w0 = 1, w(f) = 2, w(b) = 3.8 ms.
    # m (2 w0 + 3 w(f)) = 2 x 8 = 16; (m - 1)(2 w0 + 3 w(b)) = 2 + 11.4 = 13.4;
    # (nl + 2) w0 = 6; nl w(b) = 15.2: 50.6 ms
    blk = C.BlockTime(forward=0.010, backward=0.020, attention_forward=0.001,
                      last_matmul_forward=0.002)
    assert blk.recompute("full", True) == pytest.approx(0.008)
    mbt = MicroBatch(f=0.04, b=0.08, rc=0.032, tf=0.0, tb=0.0, nl=4, blk=blk, ar=0.0, wait=0.0)
    plan = ParallelPlan(dp=2, zero=3, micro_batch=1, global_batch=4, seq_len=64,
                        recompute="full")
    assert plan.n_microbatches == 2
    waits = ClusterSpec(H100.replace(blocking_wait_measured=_wait_line(1e-3, 0.1, 2)), 2, 8)
    assert DP._cpu_late_peers(MODEL, plan, waits, mbt, True, 2) == pytest.approx(0.0506, rel=1e-9)


def test_a_gpus_fsdp_reduction_copies_cost_the_step_nothing():
    # On a GPU only the gather's copy-out runs on the compute stream: ZeRO-3's backward copies
    # equal its forward's (a gather each, nothing for the reduction), ZeRO-1's backward none
    cl = ClusterSpec(H100, 2, 8)
    z3 = ParallelPlan(dp=2, zero=3, micro_batch=1, global_batch=4, seq_len=64, dtype="bf16")
    f3, b3 = DP.fsdp_copy_time(MODEL, z3, cl)
    assert f3 > 0 and b3 == f3
    z1 = ParallelPlan(dp=2, zero=1, micro_batch=1, global_batch=4, seq_len=64, dtype="bf16")
    f1, b1 = DP.fsdp_copy_time(MODEL, z1, cl)
    assert f1 == pytest.approx(f3 / 2) and b1 == 0.0

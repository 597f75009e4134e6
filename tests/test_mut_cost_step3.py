"""Two pieces of ``ptd.cost.step`` a sampled mutation run found untested (twenty-first
session, 60 mutants of cost/step.py): the zero-bubble schedule's fill with fewer than 2p
micro-batches, and the output layer's tensor-parallel collectives charged to the last
pipeline rank only. Expected values from the formulas the docs state, by hand."""

import pytest

from ptd.cost import step as S
from ptd.specs import ClusterSpec, ModelSpec, ParallelPlan, load_hardware

# a small vocabulary, so the last stage's output layer is cheap and the first rank, with
# the extra block of an uneven split, is the slowest
MODEL = ModelSpec(name="t", n_layers=8, hidden=1024, n_heads=8, n_kv_heads=8, ffn_hidden=4096,
                  vocab_size=512, max_seq_len=1024)
H100 = load_hardware("h100-sxm")  # a GPU preset: no shared cores, no calibrated waits


def test_zero_bubble_fill_with_fewer_than_2p_micro_batches():
    # ZB-V on pp 4 (two chunks a rank, v = 2) with m = 4 < 2p: the fill is (p - 1)/(2v) =
    # 3/4 of the slowest rank's micro-batch (its compute and tp collectives), half the
    # interleaved schedule's (p - 1)/v; with m = 8 = 2p there is none
    cl = ClusterSpec(H100, 4, 8)
    plan = ParallelPlan(dp=1, pp=4, micro_batch=1, global_batch=4, seq_len=1024,
                        dtype="bf16", schedule="zero-bubble")
    mbt = S.micro_batch(MODEL, plan, cl, "flash", True, True)
    bubble, _ = S.pipeline(MODEL, plan, cl, mbt, 0.0)
    assert bubble == pytest.approx(0.75 * (mbt.f + mbt.b + mbt.rc + mbt.tf + mbt.tb), rel=1e-12)
    full = plan.replace(global_batch=8)
    assert S.pipeline(MODEL, full, cl, S.micro_batch(MODEL, full, cl, "flash", True, True),
                      0.0)[0] == 0.0


def test_the_output_layers_tp_collectives_are_the_last_ranks_only():
    # 5 blocks on pp 2, tp 2: the first rank holds 3 blocks and is the slowest; its tp
    # collectives a micro-batch are its blocks' (2 all-reduces each forward, unfused linears
    # have none extra in the forward) and the embedding's one, none of the output layer's
    model = ModelSpec(name="t5", n_layers=5, hidden=1024, n_heads=8, n_kv_heads=8,
                      ffn_hidden=4096, vocab_size=512, max_seq_len=1024)
    cl = ClusterSpec(H100, 4, 8)
    plan = ParallelPlan(dp=1, tp=2, pp=2, micro_batch=1, global_batch=4, seq_len=1024,
                        dtype="bf16", uneven_stages=True)
    mbt = S.micro_batch(model, plan, cl, "flash", True, True)
    assert mbt.nl == 3
    # (under ptd's autocast the embedding's output is fp32: its all-reduce is ar_end's)
    tpc = S._tp_collectives(model, plan, cl, 1024, True, elementwise="autocast")
    assert mbt.ar == tpc.ar_f and tpc.ar_end > tpc.ar_f
    assert mbt.tf == pytest.approx(3 * 2 * tpc.ar_f + tpc.ar_end, rel=1e-12)

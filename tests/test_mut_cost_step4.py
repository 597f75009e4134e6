"""Six pieces of ``ptd.cost.step`` that a sampled mutation run left untested (twenty-ninth
session: 40 of 3,203 mutants of cost/step.py, seed 20261130; docs/testing.md): the chunk
before a pipeline receive's late-peer wait, the output layer's backward collective charged to
the last pipeline rank only, the gradient norm's expert-data-parallel group, and the
optimizer's DTensor charge for routed experts under expert parallelism alone. Expected
values from the rules the docstrings state, counted by hand."""

import pytest

from ptd.cost import step as S
from ptd.specs import ClusterSpec, ModelSpec, ParallelPlan, load_hardware

H100 = load_hardware("h100-sxm")  # a GPU preset: no shared cores (k = 1), no waits of its own
MODEL = ModelSpec(name="t", n_layers=8, hidden=1024, n_heads=8, n_kv_heads=8, ffn_hidden=4096,
                  vocab_size=512, max_seq_len=1024)
# MoE blocks, SwiGLU experts without biases: three stacked routed tensors a block (w1, w2,
# w3), 4 x 3 x 64 x 128 = 98,304 routed elements a block
MOE = ModelSpec(name="m", n_layers=4, hidden=64, n_heads=4, n_kv_heads=4, ffn_hidden=128,
                vocab_size=256, max_seq_len=64, n_experts=4, top_k=2)


def _wait_line(w0: float, slope: float, workers: int) -> dict:
    """A late-peer wait of ``w0 + slope * chunk`` seconds for chunks of 0 to 1 s."""
    return {workers: ((0.0, w0), (1.0, w0 + slope))}


def test_a_pipeline_receive_waits_after_its_chunk_of_computation():
    # pp 2, v 1, m 4: each rank receives 2v - 1 = 1 tensor a micro-batch after a chunk of
    # (f + b + rc) / 2v of computation, so the bubble grows by 4 x w((f + b + rc) / 2); with
    # w = 1 ms + 0.1 x chunk
    plan = ParallelPlan(dp=1, pp=2, micro_batch=1, global_batch=4, seq_len=1024, dtype="bf16")
    plain = ClusterSpec(H100, 2, 8)
    waits = ClusterSpec(H100.replace(blocking_wait_measured=_wait_line(1e-3, 0.1, 2)), 2, 8)
    mbt = S.micro_batch(MODEL, plan, plain, "flash", True, True)
    assert mbt == S.micro_batch(MODEL, plan, waits, "flash", True, True)  # tp 1: no tp waits
    chunk = (mbt.f + mbt.b + mbt.rc) / 2
    assert 0 < chunk < 1
    grown = S.pipeline(MODEL, plan, waits, mbt, 0.0)[0] - S.pipeline(MODEL, plan, plain, mbt, 0.0)[0]
    assert grown == pytest.approx(4 * (1e-3 + 0.1 * chunk), rel=1e-9)


def test_only_the_last_rank_waits_for_the_output_layers_input_gradient():
    # 5 blocks on pp 2 x tp 2 (uneven: the first rank holds 3 and is the slowest), a flat
    # wait W after every tp collective. The first rank's collectives a micro-batch: forward
    # 3 blocks x 2 + the embedding's 1 = 7; backward 3 blocks x 5 (wq, wk, wv, w1, w3: each
    # column-parallel input gradient on its own) = 15, none for the output layer, whose
    # input-gradient all-reduce is the last rank's
    model = ModelSpec(name="t5", n_layers=5, hidden=1024, n_heads=8, n_kv_heads=8,
                      ffn_hidden=4096, vocab_size=512, max_seq_len=1024)
    plan = ParallelPlan(dp=1, tp=2, pp=2, micro_batch=1, global_batch=4, seq_len=1024,
                        dtype="bf16", uneven_stages=True)
    w = 2e-3
    plain = ClusterSpec(H100, 4, 8)
    waits = ClusterSpec(H100.replace(blocking_wait_measured=_wait_line(w, 0.0, 4)), 4, 8)
    a = S.micro_batch(model, plan, plain, "flash", True, True)
    b = S.micro_batch(model, plan, waits, "flash", True, True)
    assert a.nl == b.nl == 3 and a.wait == 0.0 and b.wait == pytest.approx(w)
    assert b.tf - a.tf == pytest.approx(7 * w, rel=1e-9)
    assert b.tb - a.tb == pytest.approx(15 * w, rel=1e-9)


def test_the_gradient_norm_sums_over_the_expert_data_parallel_group_where_it_has_one():
    # ZeRO-1 over dp 4 with ep 2: the dense shards over dp (4), the routed experts over ep
    # (2) and their shards over edp = dp / ep = 2: three all-reduces; at dp 2, ep 2, edp is
    # 1 and has none
    cl = ClusterSpec(H100, 4, 8)
    four = ParallelPlan(dp=4, ep=2, zero=1, micro_batch=1, global_batch=4, seq_len=64)
    assert [g[0] for g in S.grad_norm_groups(MOE, four, cl)] == [4, 2, 2]
    two = ParallelPlan(dp=2, ep=2, zero=1, micro_batch=1, global_batch=2, seq_len=64)
    assert [g[0] for g in S.grad_norm_groups(MOE, two, ClusterSpec(H100, 2, 8))] == [2, 2]


def _optimizer(plan: ParallelPlan, tensor_dt: float, param_dt: float) -> float:
    """The optimizer phase on a CPU whose plain tensors cost 1 ms and 1 ns a parameter,
    DTensors ``tensor_dt`` and ``param_dt`` (two workers at once, as measured)."""
    over = {"optimizer_tensor": {2: 1e-3}, "optimizer_param": {2: 1e-9},
            "optimizer_tensor_dtensor": {2: tensor_dt}, "optimizer_param_dtensor": {2: param_dt}}
    cl = ClusterSpec(load_hardware("cpu").replace(overheads_measured=over), 2)
    mbt = S.micro_batch(MOE, plan, cl, "flash", True, True)
    assert mbt.nl == 4
    return S.optimizer_time(MOE, plan, cl, mbt)[0]


def test_expert_parallelism_alone_charges_the_routed_experts_as_dtensors():
    # ep 2, tp 1, ZeRO-0: the routed experts are DTensors, the rest plain. Against DTensor
    # costs equal to the plain ones, each routed tensor adds 1 ms more (3 a block x 4 blocks)
    # and each local routed element 1 ns more (98,304 // 2 x 4 blocks = 196,608)
    plan = ParallelPlan(dp=2, ep=2, micro_batch=1, global_batch=2, seq_len=64)
    more = _optimizer(plan, 2e-3, 2e-9) - _optimizer(plan, 1e-3, 1e-9)
    assert more == pytest.approx(12 * 1e-3 + 196_608 * 1e-9, rel=1e-9)


def test_without_expert_parallelism_no_tensor_is_charged_as_a_dtensor():
    # ep 1, tp 1, ZeRO-0: every parameter is a plain tensor; the DTensor costs do not enter
    plan = ParallelPlan(dp=2, micro_batch=1, global_batch=2, seq_len=64)
    assert _optimizer(plan, 5e-3, 5e-9) == _optimizer(plan, 1e-3, 1e-9)

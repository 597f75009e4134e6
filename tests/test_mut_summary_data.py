"""summary/compare.py and runtime/data by hand, from sampled mutation runs (30 mutants of
each, seed 20261129; docs/testing.md) whose survivors the quick tests let through (the
runs' own tests catch some of them, minutes later): the measured step in the cost model's
parts, the rates of a step time, a rank's predicted memory in bytes, the summary file's
text; the validation batches' count and the data's size checks."""

import json
import math

import numpy as np
import pytest

from ptd.errors import PtdError
from ptd.runtime.data.corpus import Sources, TokenStream, check_stream
from ptd.runtime.data.loader import WindowOrder, eval_batches
from ptd.specs import ParallelPlan, get_preset
from ptd.summary import compare as C


# ---------------------------------------------------------------- summary/compare.py
def _plan(**kw):
    base = dict(dp=1, micro_batch=1, global_batch=1, seq_len=16)
    return ParallelPlan(**{**base, **kw})


def test_cost_view_parts_and_missing_parts_are_zero():
    parts = {"forward": 3.0, "backward": 5.0, "backward_w": 1.0, "recompute": 2.0,
             "loss": 0.25, "schedule": 0.5, "other": 0.125}
    cv = C.cost_view(parts, {}, _plan())
    assert cv["compute"] == 3.0 + 5.0 + 1.0 + 2.0
    assert cv["backward"] == 6.0
    assert cv["other"] == 0.25 + 0.5 + 0.125
    # nothing measured for these: zero, not a sentinel
    for k in ("data", "bubble", "optimizer", "dp_comm_exposed", "tp_comm", "pp_comm"):
        assert cv[k] == 0.0, k


@pytest.mark.parametrize("plan, phase, kind, dest", [
    (dict(pp=2), "forward", "send", "pp_comm"),
    (dict(cp=2, seq_len=16), "forward", "recv", "cp_comm"),        # cp's ring, no pipeline
    (dict(cp=2, pp=2, seq_len=16), "backward", "send", "pp_comm"),  # ambiguous: the pipeline's
    (dict(dp=2, zero=3, global_batch=2), "backward", "reduce_scatter", "dp_comm_exposed"),
    (dict(tp=2), "forward", "all_reduce", "tp_comm"),
    (dict(dp=2, global_batch=2), "backward", "all_reduce", "dp_comm_exposed"),
    (dict(dp=2, global_batch=2), "grad_sync", "all_reduce", "dp_comm_exposed"),
    (dict(), "optimizer", "all_reduce", "optimizer"),
    (dict(pp=2), "loss", "all_reduce", "bubble"),   # a finished stage waits for the others
    (dict(), "loss", "all_reduce", "other"),
])
def test_cost_view_routes_each_collective_to_its_part(plan, phase, kind, dest):
    cv = C.cost_view({}, {phase: {kind: 0.5}}, _plan(**plan))
    assert cv[dest] == 0.5
    assert sum(v for k, v in cv.items() if k != dest) == 0.0


def test_rates_of_a_step_time_by_hand():
    class FL:  # 6e9 model FLOPs a token, 8e9 with recompute
        model, hardware = 6e9, 8e9
    plan = _plan(dp=2, global_batch=2)
    r = C._rates(plan, FL, 100e12, 0.5, 1e4, 4.0)
    assert r["tokens_per_s_per_device"] == 5e3
    assert r["samples_per_s_per_device"] == 2.0
    assert r["tflops_per_device"] == pytest.approx(30.0)           # 6e9 x 5e3 / 1e12
    assert r["hardware_tflops_per_device"] == pytest.approx(40.0)  # 8e9 x 5e3 / 1e12
    assert r["mfu"] == pytest.approx(0.3)  # of a 100 TFLOP/s device
    assert r["hfu"] == pytest.approx(0.4)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_one_ranks_predicted_states_are_16_bytes_a_parameter(dtype):
    # ptd's runtime keeps fp32 weights (autocast), fp32 gradients and Adam's two fp32
    # moments: 4 + 4 + 8 bytes a parameter on one unsharded rank
    model = get_preset("tiny")
    n = model.param_count()
    d = C.predicted_rank_memory(model, _plan(dtype=dtype, seq_len=64), 0, 0)
    assert (d["params"], d["grads"], d["optimizer"]) == (4 * n, 4 * n, 8 * n)
    assert d["total"] == 16 * n


def test_ratio_refuses_what_it_cannot_divide():
    assert C.ratio(3.0, 2.0) == 1.5
    for m, p in ((None, 1.0), (1.0, None), (1.0, 0.0), (math.inf, 1.0), (math.nan, 1.0)):
        assert C.ratio(m, p) is None


def test_summary_file_is_indented_json_ending_in_a_newline(tmp_path):
    f = tmp_path / "summary.json"
    C.write_json(f, {"a": 1, "p": f})
    text = f.read_text()
    assert text == '{\n  "a": 1,\n  "p": "%s"\n}\n' % f
    assert json.loads(text)["a"] == 1


# ---------------------------------------------------------------- runtime/data
def _stream(n):
    return TokenStream([np.arange(n, dtype=np.int64) % 251])


def test_validation_batches_are_as_many_whole_global_batches_as_fit():
    # 20 windows of 16 (321 tokens), global batch 8: two whole batches, not the 4 allowed
    s = _stream(16 * 20 + 1)
    a = eval_batches(s, seq_len=16, global_batch=8, micro_batch=2, dp_rank=1, dp_size=2)
    assert len(a) == 2 and [len(b) for b in a] == [2, 2]
    # replica 1 takes windows 4-7 of the first batch and 12-15 of the second, in order
    assert a[0][0].inputs[0].tolist() == s.read(4 * 16, 16).tolist()
    assert a[1][1].inputs[1].tolist() == s.read(15 * 16, 16).tolist()
    assert len(eval_batches(s, seq_len=16, global_batch=8, micro_batch=2, dp_rank=0,
                            dp_size=2, max_steps=1)) == 1
    with pytest.raises(PtdError, match="holds 20 windows, fewer than one global batch .32."):
        eval_batches(s, seq_len=16, global_batch=32, micro_batch=2, dp_rank=0, dp_size=2)


def test_a_stream_needs_one_window_of_seq_len_plus_one_tokens():
    src = Sources(text=(), bins=(), name="d")
    check_stream(_stream(65), src, 256, 64)  # one window and its shifted target
    with pytest.raises(PtdError, match=r"has 64 tokens, fewer than seq_len\+1 = 65"):
        check_stream(_stream(64), src, 256, 64)
    with pytest.raises(PtdError, match=r"has 63 tokens, fewer than seq_len\+1 = 64"):  # odd
        check_stream(_stream(63), src, 256, 63)
    assert WindowOrder(65, 64, 0).n_windows == 1
    with pytest.raises(PtdError, match=r"64 tokens hold no window of seq_len\+1 = 65"):
        WindowOrder(64, 64, 0)
    with pytest.raises(PtdError, match=r"hold no window of seq_len\+1 = 64"):
        WindowOrder(63, 63, 0)


def test_a_rate_that_is_text_is_not_a_number_whatever_the_text():
    from ptd.summary.schema import Rates, problems
    rates = {k: 1.0 for k in Rates.__annotations__}
    s = {"status": "ok", "steps": 1, "plan": {}, "world_size": 1,
         "measured": {**rates, "mfu": "very high"}, "predicted": dict(rates)}  # sorts after "missing"
    assert problems(s) == ["measured.mfu is not a number"]

"""runtime/measure's timeline and run log by hand, from a sampled mutation run (30 of 904
mutants, seed 20261129: 16 killed; docs/testing.md): spans on other threads, a collective
in the schedule that is not a transfer, the mean of the busy time, and the run summary's
loss figures and curve."""

import pytest

from ptd.runtime.measure.runlog import final_words, loss_curve, summarize
from ptd.runtime.measure.timeline import analyse_step, mean_breakdown
from test_measure import GLOO, MAIN, sp

OTHER = 3  # a thread other than the main one and gloo's


def test_ops_on_other_threads_are_skipped_not_the_end_of_the_list():
    # a data-loader thread's op comes first; the main thread's work after it still counts
    spans = [sp("ptd:step", 0, 40), sp("aten::copy_", 0, 40, OTHER),
             sp("ptd:forward", 0, 40), sp("aten::mm", 0, 40)]
    b = analyse_step(spans, MAIN, (0, 40))
    assert b.parts == {"forward": pytest.approx(40e-6)}


def test_spans_outside_the_step_are_skipped_not_the_end_of_the_list():
    # the profile holds the step before this one too, listed first
    spans = [sp("ptd:backward", -50, -10), sp("aten::mm", -50, -10),
             sp("ptd:step", 0, 40), sp("ptd:forward", 0, 40), sp("aten::mm", 0, 40),
             sp("aten::mm", 40, 60)]
    assert analyse_step(spans, MAIN, (0, 40)).parts == {"forward": pytest.approx(40e-6)}


def test_an_all_reduce_in_the_schedule_is_communication_not_bubble():
    # only a point-to-point wait with nothing to run is the pipeline's bubble
    spans = [sp("ptd:step", 0, 100), sp("ptd:schedule", 0, 100),
             sp("ptd:forward", 0, 40), sp("aten::mm", 0, 40),
             sp("gloo:all_reduce", 40, 70, GLOO),
             sp("gloo:send", 70, 100, GLOO)]
    b = analyse_step(spans, MAIN, (0, 100))
    us = {k: round(v * 1e6, 6) for k, v in b.parts.items()}
    assert us == {"forward": 40, "comm:all_reduce": 30, "bubble": 30}


def test_mean_of_the_busy_time_per_kind():
    a = analyse_step([sp("ptd:step", 0, 10), sp("gloo:all_reduce", 0, 4, GLOO)], MAIN, (0, 10))
    b = analyse_step([sp("ptd:step", 0, 10), sp("gloo:all_reduce", 0, 8, GLOO)], MAIN, (0, 10))
    assert mean_breakdown([a, b]).comm_total == {"all_reduce": pytest.approx(6e-6)}


def _records(losses, tokens=100):
    # step 1 takes 9 s (warm-up), step 2 1 s, the rest 0.5 s
    return [{"step": i + 1, "loss": x, "step_time_s": 9.0 if i == 0 else 1.0 if i == 1 else 0.5,
             "step_tokens": tokens, "tokens": tokens * (i + 1)} for i, x in enumerate(losses)]


def test_loss_curve_spaces_its_points_over_the_run():
    r = _records([float(i) for i in range(9)])  # steps 1..9, loss = step - 1
    assert loss_curve(r) == [[1, 0.0], [3, 2.0], [5, 4.0], [7, 6.0], [9, 8.0]]
    assert loss_curve(r, points=3) == [[1, 0.0], [5, 4.0], [9, 8.0]]
    assert loss_curve(r[:2]) == [[1, 0.0], [2, 1.0]]
    assert loss_curve([]) == []


def test_summary_of_a_run_by_hand():
    losses = [10.0, 9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.5, 2.5]
    s = summarize(_records(losses))
    assert s["steps"] == 12 and s["first_loss"] == 10.0 and s["last_loss"] == 2.5
    assert s["min_loss"] == 0.5
    assert s["last10_loss"] == pytest.approx(sum(losses[2:]) / 10)  # 3.9
    # step 1 (the warm-up) alone is left out of the rates: 1 + 10 x 0.5 = 6 s for 11 steps
    # of 100 tokens
    assert s["step_time_s_mean"] == pytest.approx(6.0 / 11)
    assert s["tokens_per_s"] == pytest.approx(1100 / 6.0)
    assert s["train_time_s"] == pytest.approx(9.0 + 6.0)
    one = summarize(_records([3.0]))  # a one-step run has only its first step
    assert one["step_time_s_mean"] == 9.0 and one["last10_loss"] == 3.0


def test_final_words_name_a_status_other_than_ok():
    s = summarize(_records([3.0, 2.0]))
    s.update(wall_time_s=1.0, world_size=1, plan_desc="dp1", model="tiny", dtype="fp32",
             device="cpu")
    assert "ptd: ok" not in final_words(s)
    s["status"] = "stopped: interrupted at step 2"
    assert final_words(s).splitlines()[-1] == "ptd: stopped: interrupted at step 2"
    s["status"] = "aborted"  # sorts before "ok": named all the same
    assert final_words(s).splitlines()[-1] == "ptd: aborted"

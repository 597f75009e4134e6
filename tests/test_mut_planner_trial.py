"""``ptd.planner.trial`` (``ptd plan --try``) without running anything: which plans are tried,
the interleaved repeats with a stand-in for ``ptd train`` and a stand-in clock, the verdict,
Spearman's rank correlation, the rendered table and the JSON.

Written from the mutation survivors of ``src/ptd/planner/trial.py`` (a sample of 25, seed
20261127). Predicted and measured throughputs are made-up round numbers, so that every
expected cell is worked out by hand in the comment beside it."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

import ptd.planner.trial as T
import ptd.trainrun
from helpers import cluster
from ptd.cost.estimate import estimate
from ptd.planner.search import SearchResult
from ptd.specs import ParallelPlan, get_preset, load_config


def P(dp, tp, pp, **kw):
    """A plan of 4 ranks of the tiny model (global batch 8, sequence 64, fp32)."""
    return ParallelPlan(dp=dp, tp=tp, pp=pp, global_batch=8, seq_len=64, dtype="fp32", **kw)


def fake(plan, tokens_per_s):
    """A stand-in estimate: trial reads only its plan and predicted tokens/s (render, verdict)."""
    return SimpleNamespace(plan=plan, tokens_per_s=tokens_per_s)


def result(ranked):
    res = SearchResult(get_preset("tiny"), cluster("cpu", 4), 8, 64, "fp32", "throughput",
                       None, None, {})
    res.ranked = list(ranked)
    return res


# ------------------------------------------------------------------ candidates
def test_candidates_top_k_then_the_first_plan_of_each_other_layout():
    # ranking (1-based): 1 dp2pp2, 2 dp2pp2, 3 dp4, 4 dp2pp2, 5 pp4, 6 dp4
    ranked = [fake(P(2, 1, 2), 0), fake(P(2, 1, 2, micro_batch=2), 0), fake(P(4, 1, 1), 0),
              fake(P(2, 1, 2, zero=1), 0), fake(P(1, 1, 4), 0), fake(P(4, 1, 1, zero=1), 0)]
    res = result(ranked)
    c = T.candidates(res, 2)
    # top 2 = ranks 1, 2; dp2 pp2 is then seen, so the layouts add dp4's first (3) and pp4's (5)
    assert [(x.rank, x.why) for x in c] == [(1, "top 2"), (2, "top 2"),
                                            (3, "best dp4 tp1 pp1"), (5, "best dp1 tp1 pp4")]
    assert [x.estimate for x in c] == [ranked[0], ranked[1], ranked[2], ranked[4]]
    # top 1: rank 2 is dp2 pp2 again, not a new layout
    assert [(x.rank, x.why) for x in T.candidates(res, 1)] == [
        (1, "top 1"), (3, "best dp4 tp1 pp1"), (5, "best dp1 tp1 pp4")]
    # top 0: every layout's best, the first one included
    assert [(x.rank, x.why) for x in T.candidates(res, 0)] == [
        (1, "best dp2 tp1 pp2"), (3, "best dp4 tp1 pp1"), (5, "best dp1 tp1 pp4")]
    assert [x.rank for x in T.candidates(res, 3, per_layout=False)] == [1, 2, 3]


def test_candidate_best_and_label():
    c = T.Candidate(4, fake(P(2, 1, 2, zero=1, micro_batch=2, recompute="full"), 0), "top 4")
    assert c.best is None and c.measured == [] and c.errors == []
    c.measured += [30.0, 50.0, 40.0]
    assert c.best == 50.0  # the best repeat, not the last or the first
    # describe() is "dp2 tp1 pp2 zero1 mb2 gb8 rc-full 1f1b"; the label drops " gb8"
    assert c.label == "dp2 tp1 pp2 zero1 mb2 rc-full 1f1b"


# --------------------------------------------------------------------- run_all
class Clock:
    """perf_counter stand-in: 100, 110, 120, ... one step of 10 s per call."""

    def __init__(self):
        self.t = 90.0

    def perf_counter(self):
        self.t += 10.0
        return self.t


def test_run_all_interleaves_repeats_and_records_measurements_and_errors(tmp_path, monkeypatch):
    model, cl = get_preset("tiny"), cluster("cpu", 4)
    a = T.Candidate(1, estimate(model, cl, P(4, 1, 1)), "top 1")
    b = T.Candidate(3, estimate(model, cl, P(2, 1, 2, micro_batch=2)), "best dp2 tp1 pp2")
    calls = []
    # what each run returns, in the order the runs must happen (round 1: a, b; round 2: a, b)
    answers = {"plan0001-r1": {"measured": {"tokens_per_s": 1500}},
               "plan0003-r1": {"error": "RuntimeError: boom"},
               "plan0001-r2": {"measured": {"tokens_per_s": 2500.0}},
               "plan0003-r2": {"measured": {"tokens_per_s": 800.0}}}

    def train(run_dir, args, timeout):
        calls.append((run_dir, args, timeout))
        return answers[run_dir.name]

    monkeypatch.setattr(ptd.trainrun, "train_subprocess", train)
    monkeypatch.setattr(T, "time", Clock())
    logs = []
    wall = T.run_all([a, b], tmp_path, hardware="cpu", steps=6, repeats=2, timeout=33.0,
                     log=logs.append)
    pa, pb = tmp_path / "plans" / "plan0001.toml", tmp_path / "plans" / "plan0003.toml"
    common = ["--profile-steps", "0", "--memory-step", "0"]
    assert calls == [(tmp_path / "runs" / "plan0001-r1", ["--config", str(pa), *common], 33.0),
                     (tmp_path / "runs" / "plan0003-r1", ["--config", str(pb), *common], 33.0),
                     (tmp_path / "runs" / "plan0001-r2", ["--config", str(pa), *common], 33.0),
                     (tmp_path / "runs" / "plan0003-r2", ["--config", str(pb), *common], 33.0)]
    for path, c in ((pa, a), (pb, b)):  # each candidate exported as a ptd config
        cfg = load_config(path)
        assert cfg.plan == c.estimate.plan and cfg.steps == 6 and cfg.hardware == "cpu"
    assert a.measured == [1500.0, 2500.0] and isinstance(a.measured[0], float) and a.errors == []
    assert b.measured == [800.0] and b.errors == ["RuntimeError: boom"]
    # clock: start 100; each run reads it before (t0) and after (log): 110/120, 130/140,
    # 150/160, 170/180, so 10 s each; the end is 190, the wall 190 - 100 = 90
    assert wall == 90.0
    # si(1500) = "1.5 k", si(2500) = "2.5 k", si(800) = "800"; labels without " gb8"
    assert logs == [
        "ptd plan --try: [1/4] #1 dp4 tp1 pp1 zero0 mb1: 1.5 k tokens/s (10 s)",
        "ptd plan --try: [2/4] #3 dp2 tp1 pp2 zero0 mb2 1f1b: failed: RuntimeError: boom (10 s)",
        "ptd plan --try: [3/4] #1 dp4 tp1 pp1 zero0 mb1: 2.5 k tokens/s (10 s)",
        "ptd plan --try: [4/4] #3 dp2 tp1 pp2 zero0 mb2 1f1b: 800 tokens/s (10 s)"]


# -------------------------------------------------------------------- spearman
def test_spearman_by_hand():
    # x ranks [3, 1, 2], y ranks [1, 2, 3]; mean 2; cov = 1*-1 + -1*0 + 0*1 = -1;
    # |x| = |y| = sqrt(2): rho = -1/2
    assert T.spearman([30.0, 10.0, 20.0], [1.0, 2.0, 3.0]) == pytest.approx(-0.5)
    # three-way tie at the top: x ranks [3, 3, 3, 1] ((1+3)/2 + 1 = 3), y ranks [1, 2, 3, 4];
    # means 2.5; cov = .5*-1.5 + .5*-.5 + .5*.5 + -1.5*1.5 = -3; |x| = sqrt(3), |y| = sqrt(5)
    assert T.spearman([5.0, 5.0, 5.0, 1.0], [1.0, 2.0, 3.0, 4.0]) == pytest.approx(
        -3 / math.sqrt(15))
    assert T.spearman([1.0, 2.0, 3.0], [7.0, 7.0, 7.0]) is None  # no spread: undefined
    assert T.spearman([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]) is None
    assert T.spearman([1.0, 2.0], [2.0, 1.0]) is None  # fewer than 3 points


# --------------------------------------------------------------------- verdict
def cands3():
    """#1 predicted 1000 measured 400/500, #2 predicted 900 measured 1000,
    #4 predicted 500 measured 250; given out of rank order."""
    c1 = T.Candidate(1, fake(P(4, 1, 1), 1000.0), "top 2", measured=[400.0, 500.0])
    c2 = T.Candidate(2, fake(P(4, 1, 1, zero=1), 900.0), "top 2", measured=[1000.0])
    c4 = T.Candidate(4, fake(P(1, 1, 4), 500.0), "best dp1 tp1 pp4", measured=[250.0])
    return [c2, c4, c1]


def test_verdict_by_hand():
    c = cands3()
    v = T.verdict(c, 0.5)
    # top = rank 1 (best 500), best measured = rank 2 (1000): 500/1000 = 0.5 >= 1 - 0.5
    # predicted 900, 500, 1000 against measured 1000, 250, 500 (in the order given): x ranks
    # [2, 1, 3], y ranks [3, 1, 2]; cov = 0*1 + -1*-1 + 1*0 = 1; |x| = |y| = sqrt 2: rho 1/2
    assert v == {"top_rank": 1, "top_tokens_per_s": 500.0, "best_rank": 2,
                 "best_tokens_per_s": 1000.0, "top_over_best": 0.5, "tolerance": 0.5,
                 "within_tolerance": True, "rounds_overlap": None,  # #2 ran once
                 "spearman": pytest.approx(0.5)}
    assert T.verdict(c, 0.25)["within_tolerance"] is False  # 0.5 < 0.75
    # the top plan failed: no ratio, its rank still named
    c[2].measured = []
    assert T.verdict(c, 0.1) == {"top_rank": 1, "top_tokens_per_s": None, "best_rank": None,
                                 "best_tokens_per_s": None, "top_over_best": None,
                                 "tolerance": 0.1, "within_tolerance": False,
                                 "rounds_overlap": None, "spearman": None}
    assert T.verdict([], 0.1)["top_rank"] is None


# ---------------------------------------------------------------------- render
def test_render_rows_and_verdict_lines(monkeypatch):
    c = cands3()
    c.append(T.Candidate(7, fake(P(2, 1, 2), 2000.0), "best dp2 tp1 pp2",
                         errors=["first", "x" * 60]))
    seen = {}

    def table(rows, header, align):
        seen.update(rows=rows, header=header, align=align)
        return "<table>"

    monkeypatch.setattr(T, "table", table)
    v = T.verdict(c, 0.1)
    text = T.render(c, v, 2, 12.4)
    # measured ranks by best repeat: #2 (1000) 1st, #1 (500) 2nd, #4 (250) 3rd
    # spreads (max-min)/max: #1 (500-400)/500 = 20%; the others one repeat, 0%
    # measured/predicted: 1000/900 = 1.11, 250/500 = 0.50, 500/1000 = 0.50
    assert seen["rows"] == [
        (2, "dp4 tp1 pp1 zero1 mb1", "900", "1 k", "0%", 1, "1.11", "top 2"),
        (4, "dp1 tp1 pp4 zero0 mb1 1f1b", "500", "250", "0%", 3, "0.50", "best dp1 tp1 pp4"),
        (1, "dp4 tp1 pp1 zero0 mb1", "1 k", "500", "20%", 2, "0.50", "top 2"),
        # a failed plan: its last error, cut at 50 characters
        (7, "dp2 tp1 pp2 zero0 mb1 1f1b", "2 k", "failed: " + "x" * 50, "", "", "", "best dp2 tp1 pp2")]
    assert seen["header"] == ("#", "plan", "predicted tok/s", "measured tok/s", "spread",
                              "measured rank", "measured/predicted", "tried as")
    assert seen["align"] == "rlrrrrrl"
    # gap = 1 - 500/1000 = 50.0% below the best; NOT within 10%; #2 ran once: no overlap verdict; rho over the three measured = 1/2 (above)
    assert text.split("\n") == [
        "tried 4 plans x 2 interleaved repeats on this host in 12 s "
        "(measured: best repeat; spread: (max-min)/max)",
        "<table>",
        "verdict: plan #1 measured 500 tokens/s; the best measured is #2 at 1 k tokens/s, "
        "#1 50.0% below it: NOT within 10%",
        "rank correlation of predicted and measured tokens/s (Spearman): 0.50"]


def test_render_one_repeat_the_top_best_and_no_measurement(monkeypatch):
    monkeypatch.setattr(T, "table", lambda rows, header, align: "<table>")
    top = T.Candidate(1, fake(P(4, 1, 1), 1000.0), "top 1", measured=[1200.0])
    other = T.Candidate(2, fake(P(1, 1, 4), 800.0), "best dp1 tp1 pp4", measured=[600.0])
    v = T.verdict([top, other], 0.1)  # two points: no Spearman line
    assert T.render([top, other], v, 1, 3.0).split("\n") == [
        "tried 2 plans x 1 interleaved repeat on this host in 3 s "
        "(measured: best repeat; spread: (max-min)/max)",
        "<table>",
        "verdict: plan #1 measured 1.2 k tokens/s; it is the best measured: within 10%"]
    top.measured, top.errors = [], ["boom"]
    v = T.verdict([top, other], 0.1)
    assert T.render([top, other], v, 1, 3.0).split("\n")[-1] == \
        "verdict: the planner's plan #1 has no measurement"


def test_to_json():
    c1 = T.Candidate(1, fake(P(4, 1, 1), 1000.0), "top 1", measured=[400.0, 500.0])
    c2 = T.Candidate(3, fake(P(1, 1, 4), 800.0), "best dp1 tp1 pp4", errors=["boom"])
    v = {"top_rank": 1}
    d = T.to_json([c1, c2], v, 2, 9.5)
    assert d["repeats"] == 2 and d["wall_s"] == 9.5 and d["verdict"] is v
    assert d["candidates"] == [
        {"rank": 1, "plan": P(4, 1, 1).to_dict(), "describe": "dp4 tp1 pp1 zero0 mb1 gb8",
         "why": "top 1", "predicted_tokens_per_s": 1000.0, "measured_tokens_per_s": [400.0, 500.0],
         "best_tokens_per_s": 500.0, "errors": []},
        {"rank": 3, "plan": P(1, 1, 4).to_dict(), "describe": "dp1 tp1 pp4 zero0 mb1 gb8 1f1b",
         "why": "best dp1 tp1 pp4", "predicted_tokens_per_s": 800.0, "measured_tokens_per_s": [],
         "best_tokens_per_s": None, "errors": ["boom"]}]


def test_verdict_says_whether_the_rounds_overlap(monkeypatch):
    """Two rounds each: the top plan's fastest round against the best plan's slowest."""
    monkeypatch.setattr(T, "table", lambda rows, header, align: "<table>")
    top = T.Candidate(1, fake(P(2, 1, 2), 1000.0), "top 1", measured=[880.0, 790.0])
    best = T.Candidate(2, fake(P(4, 1, 1), 990.0), "best dp4 tp1 pp1", measured=[1000.0, 870.0])
    v = T.verdict([top, best], 0.1)
    # 880 >= 870: overlap; 880/1000 = 0.88, 12% below, outside 10%
    assert v["rounds_overlap"] is True and v["top_over_best"] == pytest.approx(0.88)
    assert T.render([top, best], v, 2, 5.0).split("\n")[-1] == (
        "verdict: plan #1 measured 880 tokens/s; the best measured is #2 at 1 k tokens/s, "
        "#1 12.0% below it: NOT within 10% (their rounds overlap: a gap this machine's noise "
        "can make)")
    top.measured = [869.0, 790.0]  # 869 < 870: every round of #2 beats every round of #1
    v = T.verdict([top, best], 0.1)
    assert v["rounds_overlap"] is False
    assert T.render([top, best], v, 2, 5.0).endswith(
        "(every round of the best is faster than every round of the top plan)")
    top.measured = [1100.0, 600.0]  # the top plan is the best: nothing to compare
    assert T.verdict([top, best], 0.1)["rounds_overlap"] is None
    top.measured, best.measured = [880.0, 790.0], [1000.0]  # one round of the best: unknown
    assert T.verdict([top, best], 0.1)["rounds_overlap"] is None
    assert T.verdict([], 0.1)["rounds_overlap"] is None

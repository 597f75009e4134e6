"""planner/explain.py by hand: _alone, _schedule_fields, delta, to_json and the ordering of
explain()'s alternatives. The pricing is replaced by a recorder (``estimate`` in the module),
so each test states exactly which plan the module asks to price; every expected value is
worked out in the comments from the rules in explain.py's docstring."""

from collections import Counter
from types import SimpleNamespace

import pytest

from ptd.errors import PtdError
from ptd.planner import explain as X
from ptd.planner.search import NO_FIT
from ptd.specs import ParallelPlan


class E:
    """A stand-in Estimate: a plan, a step time, a memory total, fits or not."""

    def __init__(self, plan, step=1.0, mem=1.0, fits=True):
        self.plan = plan
        self.step = SimpleNamespace(total=step)
        self.memory = SimpleNamespace(total=mem, fits=fits)


@pytest.fixture
def priced(monkeypatch):
    """Record every call to estimate(); answer with a fitting E unless told otherwise."""
    calls = []
    box = {"fits": True, "raise": None}

    def fake(model, cluster, plan, tokens, options):
        calls.append((model, cluster, plan, tokens, options))
        if box["raise"]:
            raise box["raise"]
        return E(plan, fits=box["fits"])

    monkeypatch.setattr(X, "estimate", fake)
    return calls, box


def result(plan, n=8, layers=4, fixed=None, objective="throughput", best_by=None,
           reasons_by=None, least=None):
    return SimpleNamespace(best=E(plan), cluster=SimpleNamespace(n_devices=n),
                           model=SimpleNamespace(n_layers=layers), tokens=123.0,
                           options="OPTS", fixed=fixed or {}, objective=objective,
                           best_by=best_by or {}, reasons_by=reasons_by or {},
                           least_memory_by=least or {})


P = ParallelPlan(dp=4, tp=1, pp=2, schedule="1f1b", vpp=1, global_batch=8)


# ---------------------------------------------------------------- _schedule_fields
def test_schedule_fields_each_label():
    assert X._schedule_fields("none") is None
    assert X._schedule_fields("interleaved-1f1b vpp3") == {"schedule": "interleaved-1f1b", "vpp": 3}
    assert X._schedule_fields("interleaved-1f1b vpp12") == {"schedule": "interleaved-1f1b", "vpp": 12}
    assert X._schedule_fields("zero-bubble ZB-V") == {"schedule": "zero-bubble", "vpp": 1}
    assert X._schedule_fields("zero-bubble vpp4") == {"schedule": "zero-bubble", "vpp": 4}
    assert X._schedule_fields("gpipe") == {"schedule": "gpipe", "vpp": 1}
    assert X._schedule_fields("1f1b") == {"schedule": "1f1b", "vpp": 1}


# ---------------------------------------------------------------- delta, to_json
def test_delta_is_relative_time_and_absolute_memory():
    # step 3 s against 2 s: 3/2 - 1 = 0.5; memory 130 - 100 = 30 bytes
    assert X.delta(E(P, step=3.0, mem=130.0), E(P, step=2.0, mem=100.0)) == {
        "step_time": 0.5, "memory_bytes": 30.0}
    # faster and smaller: 1/4 - 1 = -0.75; 60 - 100 = -40
    assert X.delta(E(P, step=1.0, mem=60.0), E(P, step=4.0, mem=100.0)) == {
        "step_time": -0.75, "memory_bytes": -40.0}


def test_to_json_fields():
    plan = SimpleNamespace(describe=lambda: "plan-A")
    win = E(plan, step=2.0, mem=100.0)
    best = E(plan, step=3.0, mem=130.0, fits=True)
    alone = E(plan, step=1.0, mem=200.0, fits=False)
    dims = [X.Dimension("tp", 2, [X.Alternative(4, best=best, least_memory=50.0, alone=alone,
                                                alone_reason=NO_FIT),
                                  X.Alternative(8, reason="why", alone_reason="no")]),
            X.Dimension("dp", 1, [])]
    assert X.to_json(dims, win) == [
        {"dimension": "tp", "value": 2, "alternatives": [
            {"value": 4,
             "best": {"plan": "plan-A", "step_time_s": 3.0, "memory_bytes": 130.0, "fits": True,
                      "delta_step_time": 0.5, "delta_memory_bytes": 30.0},  # 3/2-1, 130-100
             "reason": None, "least_memory_bytes": 50.0,
             "alone": {"plan": "plan-A", "step_time_s": 1.0, "memory_bytes": 200.0, "fits": False,
                       "delta_step_time": -0.5, "delta_memory_bytes": 100.0},  # 1/2-1, 200-100
             "alone_reason": NO_FIT},
            {"value": 8, "best": None, "reason": "why", "least_memory_bytes": None,
             "alone": None, "alone_reason": "no"}]},
        {"dimension": "dp", "value": 1, "alternatives": []}]


# ---------------------------------------------------------------- _alone
def test_alone_dp_has_no_local_change(priced):
    assert X._alone(result(P), "dp", 2) == (None, None)
    assert priced[0] == []


def test_alone_tp_pp_must_divide_the_devices(priced):
    # 8 devices, pp 2: tp 3 needs 3*2 = 6, 8 % 6 = 2; pp 3 with tp 1: 8 % 3 = 2
    assert X._alone(result(P), "tp", 3) == (None, "8 devices are not divisible by tp*pp")
    assert X._alone(result(P), "pp", 3) == (None, "8 devices are not divisible by tp*pp")
    assert priced[0] == []


def test_alone_tp_dp_absorbs_and_estimate_gets_everything(priced):
    calls, _ = priced
    r = result(P)
    e, why = X._alone(r, "tp", 2)
    # tp 2, pp 2 on 8 devices: dp = 8 // (2*2) = 2; 4 layers on 2 stages: even
    assert why is None
    assert calls == [(r.model, r.cluster, P.replace(tp=2, dp=2), 123.0, "OPTS")]
    assert e.plan == P.replace(tp=2, dp=2)
    # tp 4: 8 // (4*2) = 1
    X._alone(r, "tp", 4)
    assert calls[-1][2] == P.replace(tp=4, dp=1)
    assert type(calls[-1][2].dp) is int  # a whole replica count (8 // 8), not 1.0


def test_alone_tp_1_drops_sp_other_tp_keeps_it(priced):
    calls, _ = priced
    p = P.replace(dp=2, tp=2, sp=True)
    X._alone(result(p), "tp", 1)  # dp = 8 // (1*2) = 4, sp off
    assert calls[-1][2] == p.replace(tp=1, dp=4, sp=False)
    X._alone(result(p), "tp", 4)  # dp = 8 // (4*2) = 1, sp kept
    assert calls[-1][2] == p.replace(tp=4, dp=1, sp=True)


def test_alone_pp(priced):
    calls, _ = priced
    inter = P.replace(dp=4, pp=2, schedule="interleaved-1f1b", vpp=2)
    X._alone(result(inter), "pp", 1)  # pp 1: dp = 8 // (1*1) = 8, vpp 1, 1f1b
    assert calls[-1][2] == inter.replace(pp=1, dp=8, vpp=1, schedule="1f1b")
    X._alone(result(inter, layers=8), "pp", 4)  # dp = 8 // (4*1) = 2, schedule kept
    assert calls[-1][2] == inter.replace(pp=4, dp=2)
    flat = P.replace(dp=8, pp=1, schedule="gpipe")
    X._alone(result(flat), "pp", 2)  # from pp 1: dp = 8 // 2 = 4 and 1f1b
    assert calls[-1][2] == flat.replace(pp=2, dp=4, schedule="1f1b")
    g = P.replace(schedule="gpipe")
    X._alone(result(g), "pp", 4)  # from pp 2: gpipe stays; dp = 8 // 4 = 2
    assert calls[-1][2] == g.replace(pp=4, dp=2)


def test_alone_schedule(priced):
    calls, _ = priced
    flat = P.replace(dp=8, pp=1)
    assert X._alone(result(flat), "schedule", "gpipe") == (None, "no pipeline (pp 1)")
    assert X._alone(result(P), "schedule", "none") == (None, None)
    assert calls == []
    X._alone(result(P, layers=8), "schedule", "interleaved-1f1b vpp2")
    assert calls[-1][2] == P.replace(schedule="interleaved-1f1b", vpp=2)
    X._alone(result(P), "schedule", "gpipe")
    assert calls[-1][2] == P.replace(schedule="gpipe", vpp=1)


def test_alone_other_dimension_sets_the_field(priced):
    calls, _ = priced
    X._alone(result(P), "zero", 3)
    assert calls[-1][2] == P.replace(zero=3)
    X._alone(result(P), "recompute", "full")
    assert calls[-1][2] == P.replace(recompute="full")


def test_alone_uneven_stages(priced):
    calls, _ = priced
    # 5 layers on pp 2 x vpp 1 = 2 stages: 5 % 2 = 1, uneven unless fixed off
    X._alone(result(P, layers=5), "zero", 1)
    assert calls[-1][2].uneven_stages is True
    X._alone(result(P, layers=5, fixed={"uneven_stages": False}), "zero", 1)
    assert calls[-1][2].uneven_stages is False
    X._alone(result(P, layers=5, fixed={"uneven_stages": True}), "zero", 1)
    assert calls[-1][2].uneven_stages is True
    # 4 layers on 2 stages divide: even, even though the winner was uneven
    X._alone(result(P.replace(uneven_stages=True), layers=4), "zero", 1)
    assert calls[-1][2].uneven_stages is False
    # ZB-V holds 2 chunks per rank: pp 2 -> 4 stages; 6 % 4 = 2 -> uneven (6 % 2 would be 0)
    X._alone(result(P, layers=6), "schedule", "zero-bubble ZB-V")
    assert calls[-1][2] == P.replace(schedule="zero-bubble", vpp=1, uneven_stages=True)
    # 4 layers on the new pp 4 (tp 1): 4 stages, even (on the old pp 2 also even; 3 layers
    # on pp 1 -> 1 stage even, but the winner's 2 stages would say uneven)
    X._alone(result(P, layers=3), "pp", 1)
    assert calls[-1][2].uneven_stages is False


def test_alone_fits_or_not_or_refused(priced):
    calls, box = priced
    e, why = X._alone(result(P), "zero", 2)
    assert why is None and e.plan == P.replace(zero=2)
    box["fits"] = False
    e, why = X._alone(result(P), "zero", 2)
    assert why == NO_FIT and e.plan == P.replace(zero=2)
    box["raise"] = PtdError("refused: reason")
    assert X._alone(result(P), "zero", 2) == (None, "refused: reason")


# ---------------------------------------------------------------- explain
def test_explain_alternatives_reasons_and_order(priced):
    win = P  # dp 4 tp 1 pp 2 zero 0
    b3 = E(P.replace(zero=3), step=5.0, mem=10.0)
    b1 = E(P.replace(zero=1), step=3.0, mem=90.0)
    b2 = E(P.replace(zero=2), step=3.0, mem=20.0)  # ties b1 on time, less memory: first
    r = result(win, best_by={("zero", 3): b3, ("zero", 1): b1, ("zero", 2): b2,
                             ("tp", 2): E(P.replace(tp=2, dp=2))},
               reasons_by={("dp", 2): Counter({"a": 1, "b": 3}), ("dp", 1): Counter(),
                           ("dp", 8): Counter({"c": 2}), ("dp", 4): Counter({"x": 1}),
                           ("recompute", "full"): Counter({"r": 1})},
               least={("dp", 2): 50.0, ("dp", 8): 40.0})
    dims = X.explain(r)
    assert [d.name for d in dims] == ["dp", "tp", "pp", "zero", "sp", "schedule",
                                      "micro_batch", "recompute"]
    by = {d.name: d for d in dims}
    assert by["dp"].value == 4 and by["zero"].value == 0 and by["schedule"].value == "1f1b"
    # throughput: by step time, then memory -> b2 (3 s, 20), b1 (3 s, 90), b3 (5 s)
    assert [a.value for a in by["zero"].alternatives] == [2, 1, 3]
    assert [a.best for a in by["zero"].alternatives] == [b2, b1, b3]
    assert all(a.reason is None for a in by["zero"].alternatives)
    # dp: the winner's 4 left out; none fit: by least memory 40 (8) < 50 (2), then
    # unknown memory (1) last; the most common reason, or none recorded
    dp = by["dp"].alternatives
    assert [a.value for a in dp] == [8, 2, 1]
    assert [a.reason for a in dp] == ["c", "b", "not in the search space"]
    assert [a.least_memory for a in dp] == [40.0, 50.0, None]
    assert [a.alone for a in dp] == [None, None, None]  # no local change for dp
    # tp 2: the alone plan is the winner with tp 2 and dp 8 // (2*2) = 2
    (tp2,) = by["tp"].alternatives
    assert tp2.value == 2 and tp2.alone.plan == P.replace(tp=2, dp=2) and tp2.alone_reason is None
    assert [a.value for a in by["recompute"].alternatives] == ["full"]
    assert by["pp"].alternatives == [] and by["sp"].alternatives == []
    # memory objective: by memory first -> b3 (10), b2 (20), b1 (90)
    r.objective = "memory"
    assert [a.value for a in {d.name: d for d in X.explain(r)}["zero"].alternatives] == [3, 2, 1]


def test_explain_unfit_order_falls_back_to_the_value_text(priced):
    r = result(P, reasons_by={("micro_batch", 8): Counter({"m": 1}),
                              ("micro_batch", 2): Counter({"m": 1}),
                              ("micro_batch", 4): Counter({"m": 1})},
               least={("micro_batch", 4): 7.0})
    mb = {d.name: d for d in X.explain(r)}["micro_batch"].alternatives
    # 4 has a memory figure (7 < inf); 2 and 8 have none: "2" < "8"
    assert [a.value for a in mb] == [4, 2, 8]

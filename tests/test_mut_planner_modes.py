"""``ptd.planner.modes``: the best plan of each tensor-parallel mode and why the fastest wins.

Written from the mutation survivors of ``src/ptd/planner/modes.py``. The pricing of a mode
(:func:`ptd.bench.tp_table.mode_delta`, tested in tests/test_tp_table.py) is replaced by a
stand-in table of step times, so what is tested here is the choice and the wording alone:
which plans are tried, with which depth, which one wins, and the lines explaining it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import ptd.planner.modes as modes_mod
from ptd.errors import PtdError
from ptd.planner.modes import best_by_mode, explain_modes

MODEL = object()


def plan(name, tp, total):
    return SimpleNamespace(name=name, plan=SimpleNamespace(tp=tp, describe=lambda: f"plan {name}"),
                           step=SimpleNamespace(total=total))


@pytest.fixture
def priced(monkeypatch):
    """A stand-in ``mode_delta``: step times from ``table[(plan name, mode)]``; a missing
    entry is a shape the mode does not allow (PtdError, as tp_mode_cost raises). Every call
    is recorded as (model, plan name, mode, depth)."""
    table: dict[tuple[str, str], float] = {}
    calls: list[tuple] = []

    def fake(model, e, mode, depth=1):
        calls.append((model, e.name, mode, depth))
        if (e.name, mode) not in table:
            raise PtdError(f"tp {e.plan.tp} is not a {mode} shape")
        t = table[(e.name, mode)]
        return {"mode": mode, "step_time_s": t, "tp_comm_s": t / 4, "tp_comm_1d_s": t / 2}

    monkeypatch.setattr(modes_mod, "mode_delta", fake)
    return table, calls


def test_1d_is_the_plan_as_ranked_the_least_step_time_first_on_ties(priced):
    a, b, c = plan("a", 1, 3.0), plan("b", 1, 2.0), plan("c", 1, 2.0)
    best = best_by_mode(MODEL, [a, b, c], ["1d"])
    assert list(best) == ["1d"]
    assert best["1d"] == {"mode": "1d", "step_time_s": 2.0, "estimate": b}  # b before c
    assert priced[1] == []  # 1d is never re-priced


def test_plans_without_tensor_parallelism_are_not_repriced(priced):
    table, calls = priced
    one, two = plan("one", 1, 1.0), plan("two", 2, 9.0)
    table[("one", "2.5d")] = 0.1  # would win, were a tp=1 plan priced
    table[("two", "2.5d")] = 5.0  # tp 2 = q^2 d with q 1, d 2: a tp of 2 is priced
    best = best_by_mode(MODEL, [one, two], ["2.5d"])
    assert [c[1] for c in calls] == ["two"]
    assert best["2.5d"]["estimate"] is two and best["2.5d"]["step_time_s"] == 5.0


def test_depth_goes_to_2p5d_only_and_the_model_through(priced):
    table, calls = priced
    e = plan("e", 8, 4.0)
    table[("e", "2.5d")] = 3.0
    table[("e", "3d")] = 3.5
    table[("e", "2d")] = 3.9
    best = best_by_mode(MODEL, [e], ["2d", "2.5d", "3d"], depth=4)
    assert calls == [(MODEL, "e", "2d", 1), (MODEL, "e", "2.5d", 4), (MODEL, "e", "3d", 1)]
    assert {m: d["step_time_s"] for m, d in best.items()} == {"2d": 3.9, "2.5d": 3.0, "3d": 3.5}
    assert all(d["estimate"] is e for d in best.values())
    best_by_mode(MODEL, [e], ["2.5d"])  # default depth: 2
    assert calls[-1] == (MODEL, "e", "2.5d", 2)


def test_a_mode_no_plan_allows_is_absent(priced):
    table, _ = priced
    e, f = plan("e", 4, 4.0), plan("f", 8, 5.0)
    table[("e", "2d")] = 3.0  # 4 = 2^2; 8 is no square: f raises
    table[("f", "3d")] = 4.5  # 8 = 2^3
    best = best_by_mode(MODEL, [e, f], ["1d", "2d", "3d", "2.5d"])
    assert set(best) == {"1d", "2d", "3d"}
    assert best["2d"]["estimate"] is e and best["3d"]["estimate"] is f


def test_the_least_step_time_wins_per_mode_first_on_ties(priced):
    table, _ = priced
    e, f, g = plan("e", 4, 4.0), plan("f", 4, 5.0), plan("g", 4, 6.0)
    table[("e", "2d")], table[("f", "2d")], table[("g", "2d")] = 3.0, 2.0, 2.0
    best = best_by_mode(MODEL, [e, f, g], ["2d"])
    assert best["2d"]["estimate"] is f  # 2.0 < 3.0; g ties f and comes later


def test_only_the_first_limit_plans_are_tried(priced):
    table, calls = priced
    ranked = [plan(str(i), 4, 10.0 - i) for i in range(5)]  # later plans faster in 1d
    for i in range(5):
        table[(str(i), "2d")] = 10.0 - i
    best = best_by_mode(MODEL, ranked, ["1d", "2d"], limit=3)
    assert best["1d"]["estimate"] is ranked[2] and best["2d"]["estimate"] is ranked[2]
    assert [c[1] for c in calls] == ["0", "1", "2"]
    calls.clear()
    best_by_mode(MODEL, ranked, ["2d"])  # default limit 2000: all five
    assert len(calls) == 5


def _best(t):
    """A best_by_mode result by hand: mode -> (step time, tp time, 1d tp time or None)."""
    out = {}
    for mode, (step, comm, comm1d) in t.items():
        d = {"mode": mode, "step_time_s": step, "estimate": plan(mode, 4, step)}
        if comm is not None:
            d |= {"tp_comm_s": comm, "tp_comm_1d_s": comm1d}
        out[mode] = d
    return out


def test_explain_nothing():
    assert explain_modes({}) == []


def test_explain_by_hand():
    # 2d 2 s wins; then 1d 3 s (+50 %), then 3d 4 s (+100 %), sorted by step time;
    # the non-1d lines say their tensor-parallel time against 1d's
    best = _best({"1d": (3.0, None, None), "3d": (4.0, 0.5, 0.25), "2d": (2.0, 0.125, 0.25)})
    assert explain_modes(best) == [
        "2d wins: 2 s per step with plan 2d",
        "  1d: 3 s (+50%) with plan 1d",
        "  3d: 4 s (+100%) with plan 3d: its tensor-parallel communication 500 ms against "
        "250 ms in 1d for the same plan",
    ]


def test_explain_when_1d_wins_and_a_mode_lacks_tp_times():
    # 1d 1 s wins; 2d 1.25 s (+25 %) carries no tp_comm_s: no reason appended
    best = {"1d": {"mode": "1d", "step_time_s": 1.0, "estimate": plan("x", 4, 1.0),
                   "tp_comm_s": 0.5, "tp_comm_1d_s": 0.5},
            "2d": {"mode": "2d", "step_time_s": 1.25, "estimate": plan("y", 4, 1.25)}}
    assert explain_modes(best) == ["1d wins: 1 s per step with plan x",
                                   "  2d: 1.25 s (+25%) with plan y"]


def test_explain_a_1d_loser_gets_no_reason_even_with_tp_times():
    best = {"1d": {"mode": "1d", "step_time_s": 2.0, "estimate": plan("x", 4, 2.0),
                   "tp_comm_s": 0.5, "tp_comm_1d_s": 0.5},
            "3d": {"mode": "3d", "step_time_s": 1.0, "estimate": plan("y", 8, 1.0),
                   "tp_comm_s": 0.25, "tp_comm_1d_s": 0.5}}
    assert explain_modes(best) == ["3d wins: 1 s per step with plan y",
                                   "  1d: 2 s (+100%) with plan x"]


def test_the_default_limit_is_2000_plans(priced):
    # 2001 plans, each faster than the one before: the fastest of the first 2000 is the
    # 2000th (index 1999); the 2001st is not tried
    ranked = [plan(str(i), 1, 5000.0 - i) for i in range(2001)]
    best = best_by_mode(MODEL, ranked, ["1d"])
    assert best["1d"]["estimate"] is ranked[1999]


def test_a_plan_without_tp_still_counts_for_a_later_1d(priced):
    # modes in the order 2d, 1d: the tp-1 plan is skipped for 2d, then is 1d's plan
    one = plan("one", 1, 1.0)
    best = best_by_mode(MODEL, [one], ["2d", "1d"])
    assert list(best) == ["1d"] and best["1d"]["estimate"] is one

"""The typed schema of summary.json (ptd.summary.schema): what a reader is told when a
summary lacks a key or holds the wrong type. A real run's summary is held to it in
test_report.py::test_real_run_report."""

from __future__ import annotations

import json

from ptd.summary.schema import Rates, problems

RATES = {k: 1.0 for k in Rates.__annotations__}


def good() -> dict:
    return {"status": "ok", "steps": 3, "plan": {"dp": 1}, "world_size": 1,
            "measured": dict(RATES), "predicted": dict(RATES), "ratio": {}}


def test_a_complete_summary_has_no_problems() -> None:
    assert problems(good()) == []
    stopped = {"status": "stopped: disk full", "steps": 0, "plan": {}, "world_size": 2}
    assert problems(stopped) == []  # nothing measured: no rates, and none required


def test_each_kind_of_problem_is_named() -> None:
    s = good()
    del s["steps"]
    s["world_size"] = True  # JSON true is not a count
    s["measured"]["mfu"] = "high"
    del s["predicted"]["hfu"]
    assert problems(s) == ["steps is missing", "world_size is not an integer",
                           "measured.mfu is not a number", "predicted.hfu is missing"]
    assert problems([1, 2]) == ["not a JSON object"]
    half = good()
    del half["predicted"]
    assert problems(half) == ["measured and predicted come together"]


def test_a_null_rate_is_allowed() -> None:
    s = good()
    s["measured"]["mfu"] = None  # strict JSON writes a NaN as null with its reason
    assert problems(s) == []


def test_report_says_what_the_summary_lacks(ptd_cli, tmp_path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    s = good()
    del s["plan"]
    (run / "summary.json").write_text(json.dumps(s))
    rc, out, err = ptd_cli("report", str(run), "--json")
    assert rc == 0, err
    html = open(json.loads(out)["html"]).read()
    assert "summary.json does not follow the schema: plan is missing" in html

"""Fault-injection parsing and the run summary (no processes started)."""

import pytest

from ptd.errors import PtdError
from ptd.runtime.resilience.fault import FaultInjector, parse
from ptd.runtime.measure.runlog import final_words, loss_curve, summarize


def test_fault_spec_parsing_and_matching():
    f = parse("crash:rank=1:step=3, kill:rank=*:step=5:restart=0")
    assert [(x.action, x.rank, x.step, x.restart) for x in f] == [
        ("crash", 1, 3, None), ("kill", None, 5, 0)]
    assert f[0].matches(1, 3, 7) and not f[0].matches(0, 3, 0) and not f[0].matches(1, 4, 0)
    assert f[1].matches(3, 5, 0) and not f[1].matches(3, 5, 1)
    with pytest.raises(PtdError):
        parse("explode:step=1")
    inj = FaultInjector(rank=1, spec="crash:rank=1:step=2")
    inj.at_step(1)
    with pytest.raises(RuntimeError, match="injected crash on rank 1 at step 2"):
        inj.at_step(2)


def test_summary_excludes_first_step_from_throughput():
    recs = [{"step": s, "loss": 6.0 - s, "step_tokens": 100, "step_time_s": 10.0 if s == 1 else 1.0,
             "tokens": 100 * s} for s in range(1, 6)]
    s = summarize(recs, wall_time_s=20.0, world_size=2, plan_desc="dp2", model="tiny",
                  dtype="fp32", device="cpu")
    assert s["tokens_per_s"] == pytest.approx(100.0)
    assert s["first_loss"] == 5.0 and s["last_loss"] == 1.0 and s["min_loss"] == 1.0
    assert s["loss_curve"] == [[1, 5.0], [2, 4.0], [3, 3.0], [4, 2.0], [5, 1.0]]
    assert "loss 5.000 -> 1.000" in final_words(s)
    assert [p[0] for p in loss_curve(recs * 1, points=2)] == [1, 5]

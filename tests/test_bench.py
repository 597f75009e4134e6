"""`ptd bench scaling` end to end on a reduced grid: real runs at 1 and 2 workers, the
tables (speedup, efficiency, Amdahl's P, memory per ZeRO stage, breakdown) measured beside
predicted, the cluster-scale prediction, CSV/JSON and PNG plots."""

import csv
import json
import os
import subprocess
import sys

import pytest

from ptd.bench.scaling import _speedups, amdahl_fit, layout

pytestmark = pytest.mark.dist


def test_speedup_and_amdahl_from_step_times():
    s = _speedups({1: 1.0, 2: 0.6, 4: 0.4})
    assert s == {1: 1.0, 2: pytest.approx(1 / 0.6), 4: pytest.approx(2.5)}
    # exact Amdahl data with P = 0.8 gives P back
    amdahl = {n: 1 / ((1 - 0.8) + 0.8 / n) for n in (1, 2, 4)}
    assert amdahl_fit(amdahl)[0] == pytest.approx(0.8, abs=1e-6)


def test_strategy_layouts():
    assert (layout("zero2", 4).dp, layout("zero2", 4).zero) == (4, 2)
    assert (layout("tp", 2).tp, layout("pp", 4).pp) == (2, 4)
    assert layout("3d", 8).n == 8 and layout("3d", 4).n == 4
    assert layout("ddp", 1).n == 1


@pytest.mark.timeout(420)
def test_bench_scaling_reduced_grid(tmp_path):
    out = tmp_path / "bench"
    env = dict(os.environ, PTD_HOME=str(tmp_path / "home"), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "ptd", "bench", "scaling", "--model", "tiny",
                        "--workers", "1,2", "--strategies", "ddp,zero3,pp", "--steps", "5",
                        "--seq-len", "64", "--global-batch", "8", "--cluster-gpus", "8,64",
                        "--out", str(out)], env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    data = json.loads((out / "scaling.json").read_text())
    rows = {(x["strategy"], x["n"]): x for x in data["measured"]["speedup"]}
    assert set(rows) == {(s, n) for s in ("ddp", "zero3", "pp") for n in (1, 2)}
    for (s, n), x in rows.items():
        assert x["step_s"] > 0 and x["step_s_pred"] > 0
        assert x["speedup"] == pytest.approx(rows[(s, 1)]["step_s"] / x["step_s"])
        assert x["efficiency"] == pytest.approx(x["speedup"] / n)
    # N = 1 is the same run for every strategy
    assert rows[("ddp", 1)]["step_s"] == rows[("pp", 1)]["step_s"]
    mem = {(x["strategy"], x["n"]): x for x in data["measured"]["memory"]}
    # ZeRO-3 halves every model state at 2 workers, measured from the tensors
    for k in ("params", "grads", "optimizer"):
        assert mem[("zero3", 2)][k] * 2 == pytest.approx(mem[("ddp", 2)][k], rel=0.02)
        assert mem[("zero3", 2)][k] == mem[("zero3", 2)][k + "_pred"]
    assert {a["strategy"] for a in data["measured"]["amdahl"]} == {"ddp", "zero3", "pp"}
    # the agreement line counts 4 layouts (one worker, dp 2, ZeRO-3 over 2, pp 2); its level is
    # the one-worker row's measured / predicted step
    ag = data["measured"]["agreement"]
    assert ag["layouts"] == 4 and 0 <= ag["within"] <= 4 and 0 <= ag["within_after_level"] <= 4
    assert ag["level"] == pytest.approx(rows[("ddp", 1)]["step_s"] / rows[("ddp", 1)]["step_s_pred"])
    assert "of 4 layouts within 15%" in r.stdout
    assert {(x["strategy"], x["n"]) for x in data["cluster"]["speedup"]} >= {("ddp", 8), ("ddp", 64)}
    with open(out / "speedup.csv") as f:
        assert len(list(csv.DictReader(f))) == 6
    for png in ("speedup.png", "memory.png", "breakdown.png", "pipeline_timeline.png",
                "cluster_speedup.png", "cluster_memory.png"):
        assert (out / png).stat().st_size > 5000, png
    # the pipeline timeline has each stage's forward and backward spans
    pp = json.loads((out / "runs" / "n2-dp1-tp1-pp2-z0" / "summary.json").read_text())
    for rank in pp["per_rank"]:
        labels = {span[0] for span in rank["timeline"]}
        assert {"F", "B", "step"} <= labels, labels
    assert "Amdahl" in r.stdout and "measured | predicted" in r.stdout
    # the machine against its profile (the cpu preset here: no calibration in this home),
    # before and after the runs, printed and kept
    drift = data["meta"]["machine_vs_profile"]
    for when in ("before", "after"):
        assert drift[when]["ratio"]["matmul"] > 0 and drift[when]["ratio"]["memory"] > 0
        assert drift[when]["profile"]["matmul_flops"] == 90.8e9  # the preset's, measured 11-23
    assert "this machine against its profile" in r.stdout


def test_rounds_run_the_grid_round_after_round_and_keep_each_rows_median(monkeypatch, tmp_path):
    from ptd.bench import scaling as S
    calls = []
    # measured step per (run folder, round): round 2 is the slow one for n1, round 3 for n2
    steps = {"n1-dp1-tp1-pp1-z0": [1.0, 1.3, 1.1], "n2-dp2-tp1-pp1-z0": [0.6, 0.5, 0.9],
             "n2-dp1-tp1-pp2-z0": [0.7, 0.7, 0.8]}

    def fake(folder, flags, timeout):
        name, rnd = folder.name.rsplit("-r", 1)
        calls.append(folder.name)
        t = steps[name][int(rnd) - 1]
        return {"measured": {"step_time_s": t, "tokens_per_s": 1 / t, "mfu": 0.1},
                "predicted": {"step_time_s": 1.0 if name.startswith("n1") else 0.5,
                              "tokens_per_s": 1.0, "mfu": 0.1}, "plan_desc": name, "round": rnd}
    monkeypatch.setattr(S, "train_subprocess", fake)
    data = S.measure(tmp_path, model="tiny", seq_len=8, global_batch=4, steps=5, workers=[1, 2],
                     strategies=["ddp", "pp"], hardware=None, run_timeout=10, rounds=3,
                     log=lambda *a: None)
    # the whole grid per round; N = 1 is one run for both strategies
    assert calls == [f"{n}-r{r}" for r in (1, 2, 3) for n in
                     ("n1-dp1-tp1-pp1-z0", "n2-dp2-tp1-pp1-z0", "n2-dp1-tp1-pp2-z0")]
    rows = {(r["strategy"], r["n"]): r for r in data["rows"]}
    # medians: n1 of 1.0, 1.3, 1.1 is round 3 (1.1); ddp n2 of 0.6, 0.5, 0.9 is round 1 (0.6);
    # pp n2 of 0.7, 0.7, 0.8 is 0.7 (round 1 or 2)
    assert rows[("ddp", 1)]["summary"]["measured"]["step_time_s"] == 1.1
    assert rows[("pp", 1)]["summary"] is rows[("ddp", 1)]["summary"]
    assert rows[("ddp", 2)]["summary"]["round"] == "1"
    assert rows[("pp", 2)]["summary"]["measured"]["step_time_s"] == 0.7
    res = S.tables(data, ["ddp", "pp"], [1, 2])
    sp = {(r["strategy"], r["n"]): r for r in res["speedup"]}
    assert sp[("ddp", 2)]["ratio_rounds"] == pytest.approx([1.2, 1.0, 1.8])  # / 0.5 predicted
    assert sp[("ddp", 1)]["ratio_rounds"] == pytest.approx([1.0, 1.3, 1.1])
    text = S.render(res, None)
    assert "in each of 3 rounds" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("ddp") and " 2 " in ln
                and "1.80" in ln)
    assert line.split()[-1] == "1.20"  # the median round's ratio, 0.6 / 0.5


def test_agreement_counts_layouts_within_15_percent_before_and_after_the_one_worker_level(
        monkeypatch, tmp_path):
    from ptd.bench import scaling as S
    # (measured, predicted) step per run folder, by hand: one worker 0.6 / 0.5 = 1.2 (the
    # level); dp 2 0.36 / 0.3 = 1.2, tp 2 0.5 / 0.3 = 1.667, pp 2 0.27 / 0.25 = 1.08
    steps = {"n1-dp1-tp1-pp1-z0": (0.6, 0.5), "n2-dp2-tp1-pp1-z0": (0.36, 0.3),
             "n2-dp1-tp2-pp1-z0": (0.5, 0.3), "n2-dp1-tp1-pp2-z0": (0.27, 0.25)}

    def fake(folder, flags, timeout):
        m, p = steps[folder.name]
        return {"measured": {"step_time_s": m, "tokens_per_s": 1 / m, "mfu": 0.1},
                "predicted": {"step_time_s": p, "tokens_per_s": 1 / p, "mfu": 0.1},
                "plan_desc": folder.name}
    monkeypatch.setattr(S, "train_subprocess", fake)
    data = S.measure(tmp_path, model="tiny", seq_len=8, global_batch=4, steps=5, workers=[1, 2],
                     strategies=["ddp", "tp", "pp"], hardware=None, run_timeout=10,
                     log=lambda *a: None)
    ag = S.tables(data, ["ddp", "tp", "pp"], [1, 2])["agreement"]
    # four layouts (one worker once, not once per strategy); within 15%: pp's 1.08 alone.
    # Divided by 1.2: 1.0, 1.0, 1.389, 0.9 -- all but tp's
    assert (ag["layouts"], ag["within"], ag["within_after_level"]) == (4, 1, 3)
    assert ag["level"] == pytest.approx(1.2)
    assert ag["worst"] == pytest.approx(0.5 / 0.3)
    assert ag["worst_after_level"] == pytest.approx(0.5 / 0.3 / 1.2)
    text = S.render(S.tables(data, ["ddp", "tp", "pp"], [1, 2]), None)
    assert "1 of 4 layouts within 15% (worst 1.67); one worker 1.20" in text
    assert "3 of 4 within 15% (worst 1.39)" in text
    # no one-worker row: no level to divide by, and no line
    data["rows"] = [r for r in data["rows"] if r["n"] == 2]
    assert S.agreement(data["rows"]) is None
    assert "layouts within" not in S.render(S.tables(data, ["ddp", "tp", "pp"], [2]), None)


def test_a_failed_round_stands_for_its_row():
    from ptd.bench.scaling import median_run
    ok = [{"measured": {"step_time_s": t}} for t in (3.0, 1.0, 2.0)]
    assert median_run(ok)["measured"]["step_time_s"] == 2.0
    assert median_run(ok[:2])["measured"]["step_time_s"] == 1.0  # lower middle of two
    assert "error" in median_run([*ok, {"error": "timed out"}])

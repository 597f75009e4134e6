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

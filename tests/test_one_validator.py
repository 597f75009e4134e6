"""One validator for plans -- what ``ptd train`` refuses (``runtime.launch.limits``),
``ptd plan`` never ranks, ``ptd estimate`` never picks or prints, and no export writes.
Also the bench's honesty: the Amdahl fit only where it means something, and a bench with a
failed row or an empty table exits non-zero. No processes, no torch."""

import math

import pytest

from ptd.bench.scaling import amdahl_fit
from ptd.commands.bench import bench_status
from ptd.errors import PtdError
from ptd.planner import export as X
from ptd.planner.search import search
from ptd.runtime.launch.limits import plan_problem
from ptd.specs import ClusterSpec, ParallelPlan, get_preset, load_hardware
from ptd.specs.config import load_config


@pytest.mark.parametrize("model,hw,n,gb,seq,fix", [
    ("gpt2", "h100-sxm", 16, 64, 1024, {}),                 # tied embeddings, learned positions
    ("tiny-gpt", "cpu", 4, 32, 256, {"tp": 2}),              # sp would need RoPE
    ("llama3-8b", "h100-sxm", 32, 256, 4096, {"pp": 4}),    # zero-bubble x zero 3
    ("tiny", "cpu", 4, 32, 256, {}),
])
def test_every_ranked_plan_is_one_ptd_train_runs(model, hw, n, gb, seq, fix, tmp_path):
    m = get_preset(model)
    r = search(m, ClusterSpec(load_hardware(hw), n), gb, seq, fixed=fix)
    assert r.ranked, "the case must leave plans to check"
    for e in r.ranked:
        assert plan_problem(m, e.plan) is None, e.plan.describe()
    # the exported config is one the runtime's rules accept, read back from disk
    path = tmp_path / "plan.toml"
    path.write_text(X.export(r.ranked[0], "ptd", hardware=hw, steps=5, out="runs/x"))
    cfg = load_config(path)
    assert plan_problem(cfg.model, cfg.plan) is None


@pytest.mark.parametrize("model,plan,match", [
    ("gpt2", dict(dp=2, pp=2, zero=1, schedule="zero-bubble", global_batch=8), "tied embeddings"),
    ("tiny", dict(dp=1, pp=2, zero=3, schedule="zero-bubble", global_batch=8), "zero-bubble"),
    ("tiny", dict(dp=1, tp=2, grad_compression="fp16", global_batch=8), "compression"),
])
def test_estimate_and_every_export_refuse_what_train_refuses(model, plan, match, ptd_cli):
    m = get_preset(model)
    p = ParallelPlan(seq_len=64, micro_batch=1, **plan)
    assert match in (plan_problem(m, p) or "")
    from ptd.cost.estimate import estimate
    e = estimate(m, ClusterSpec(load_hardware("h100-sxm"), p.world_size), p, validate=False)
    for fmt in X.FORMATS:
        with pytest.raises(PtdError, match="ptd train refuses it"):
            X.export(e, fmt, hardware="h100-sxm")
    flags = {"dp": "--dp", "tp": "--tp", "pp": "--pp", "zero": "--zero", "schedule": "--schedule",
             "global_batch": "--global-batch"}
    argv = ["estimate", "--model", model, "--hardware", "h100-sxm", "--gpus", str(p.world_size),
            "--seq-len", "64", "--micro-batch", "1", "--recompute", "none", "--vpp", "1"]
    argv += [x for k, v in plan.items() if k in flags for x in (flags[k], str(v))]
    argv += ["--sp"] if plan.get("sp") else []
    if "schedule" not in plan:
        argv += ["--schedule", "1f1b"]
    if plan.get("grad_compression"):
        return  # estimate has no --grad-compression flag
    rc, out, err = ptd_cli(*argv)
    assert rc == 2 and match.split()[0] in err and err.count("\n") == 1, err


def test_estimate_picks_only_plans_train_runs(ptd_cli):
    # free knobs: before, choose() picked zero-bubble with zero 3 here (ptd train refuses it)
    import json
    rc, out, err = ptd_cli("estimate", "--model", "llama3-70b", "--hardware", "h100-sxm",
                           "--gpus", "64", "--tp", "8", "--pp", "2", "--json")
    assert rc == 0, err
    p = json.loads(out)["plan"]
    assert not (p["zero"] == 3 and p["schedule"] == "zero-bubble"), p


def test_amdahl_fit_only_when_meaningful():
    # Amdahl with P = 0.9: S(N) = 1 / (0.1 + 0.9/N) -> S(2) = 1/0.55, S(4) = 1/0.325
    p, why = amdahl_fit({1: 1.0, 2: 1 / 0.55, 4: 1 / 0.325})
    assert why is None and p == pytest.approx(0.9, rel=1e-12)
    # one point beyond N = 1 is solved exactly, not fitted: refused
    p, why = amdahl_fit({1: 1.0, 2: 1.5})
    assert p is None and "needs 2" in why
    # slower with more workers: S(2) = 0.5, S(4) = 0.25 -> P < 0 -> n/a, with the value
    p, why = amdahl_fit({1: 1.0, 2: 0.5, 4: 0.25})
    assert p is None and "outside [0, 1]" in why
    # superlinear: S(2) = 3, S(4) = 8 -> P > 1 -> n/a
    p, why = amdahl_fit({1: 1.0, 2: 3.0, 4: 8.0})
    assert p is None and "outside [0, 1]" in why
    # NaN speedups (a failed baseline) are not points
    p, why = amdahl_fit({2: math.nan, 4: math.nan})
    assert p is None


def test_bench_fails_on_a_failed_row_or_an_empty_table(capsys):
    ok = {"strategy": "ddp", "n": 1, "summary": {"measured": {}}}
    bad = {"strategy": "tp", "n": 2, "summary": {"error": "timed out after 5 s"}}
    full = {"speedup": [1], "memory": [1]}
    assert bench_status([ok], full) == 0
    assert bench_status([ok, bad], full) == 1
    err = capsys.readouterr().err
    assert err == "ptd bench: error: 1 of 2 run(s) failed; first tp N=2: timed out after 5 s\n"
    assert bench_status([ok], {"speedup": [], "memory": [1]}) == 1
    assert "empty table(s): speedup" in capsys.readouterr().err

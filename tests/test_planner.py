"""ptd plan: the search, its pruning and ranking, the Pareto front, explain, and the CLI."""

import json
import time

import pytest

from helpers import cluster, gpt
from ptd.runtime.launch.limits import plan_problem

from ptd.cost.estimate import FREE_KNOBS, CostOptions, candidates, choose, estimate
from ptd.cost.flops import megatron_flops_per_iteration
from ptd.errors import PtdError
from ptd.planner import search as S
from ptd.planner.explain import explain
from ptd.planner.pareto import pareto_front, thin
from ptd.planner.search import (DIMENSIONS, dimension_values, objective_key, parse_fix,
                                ranked_plans, search)
from ptd.specs import ParallelPlan, get_preset


@pytest.fixture(scope="module")
def tiny():
    """The tiny model on 4 CPU workers: small enough to check everything by brute force."""
    return search(get_preset("tiny"), cluster("cpu", 4), 32, 256, dtype="fp32")


@pytest.fixture(scope="module")
def llama405():
    """The published Llama 3.1 405B setting: 16,384 H100, global batch 2048 x 8192."""
    return search(get_preset("llama3.1-405b"), cluster("h100-sxm", 16384), 2048, 8192)


# ---------------------------------------------------------------- the space
def test_every_factorisation_is_considered(tiny):
    # (tp, pp) with tp*pp dividing 4: (1,1) (1,2) (1,4) (2,1) (2,2) (4,1)
    assert tiny.layouts_considered == 6 and not tiny.layouts_rejected
    assert {(e.plan.dp, e.plan.tp, e.plan.pp) for e in tiny.ranked} == {
        (4, 1, 1), (2, 1, 2), (1, 1, 4), (2, 2, 1), (1, 2, 2), (1, 4, 1)}
    for e in tiny.ranked:
        e.plan.validate(tiny.model, 4)
        assert e.memory.fits
    kinds = {(e.plan.schedule, e.plan.stages_per_rank) for e in tiny.ranked if e.plan.pp > 1}
    assert {("gpipe", 1), ("1f1b", 1), ("zero-bubble", 2), ("interleaved-1f1b", 2)} <= kinds
    assert {e.plan.zero for e in tiny.ranked} == {0, 1, 2, 3}
    assert {e.plan.recompute for e in tiny.ranked} == {"none", "selective", "full"}
    assert {e.plan.sp for e in tiny.ranked if e.plan.tp > 1} == {False, True}
    assert {e.plan.micro_batch for e in tiny.ranked if e.plan.dp == 1} == {1, 2, 4, 8, 16, 32}


def test_zero_is_not_searched_at_dp_1_unless_fixed(tiny):
    # ZeRO shards over dp: at dp 1 stages 1-3 keep zero 0's states, so they would only repeat
    # the same plan in the table; --fix zero=3 (or offload, which needs stage 3) keeps them
    assert {e.plan.zero for e in tiny.ranked if e.plan.dp == 1} == {0}
    assert {e.plan.zero for e in tiny.ranked if e.plan.dp == 2} == {0, 1, 2, 3}
    assert tiny.plans_rejected[S.ZERO_DP1] > 0
    fixed = search(get_preset("tiny"), cluster("cpu", 4), 32, 256, dtype="fp32",
                   fixed={"zero": 3, "dp": 1})
    assert fixed.ranked and {e.plan.zero for e in fixed.ranked} == {3}
    assert S.ZERO_DP1 not in fixed.plans_rejected
    base = ParallelPlan(dp=1, tp=2, pp=2, global_batch=32, seq_len=256, dtype="fp32")
    assert {p.zero for p in candidates(get_preset("tiny"), base, ["zero"])} == {0}
    assert {p.zero for p in candidates(get_preset("tiny"), base.replace(dp=1, offload=True),
                                       ["zero"])} == {3}


def test_counts_add_up(tiny, llama405):
    for r in (tiny, llama405):
        assert r.plans_fit + sum(r.plans_rejected.values()) == r.plans_considered
    assert llama405.plans_considered > 10_000 and llama405.plans_fit > 100


def test_search_contains_every_candidate_of_choose(tiny):
    # the planner's space includes everything estimate's choose() would try, layout by layout
    ranked = {e.plan for e in tiny.ranked}
    m, c = tiny.model, tiny.cluster
    for dp, tp, pp in {(e.plan.dp, e.plan.tp, e.plan.pp) for e in tiny.ranked}:
        base = ParallelPlan(dp=dp, tp=tp, pp=pp, global_batch=32, seq_len=256, dtype="fp32")
        for p in candidates(m, base, FREE_KNOBS):
            e = estimate(m, c, p, validate=False)
            # the planner also drops what ptd train refuses (runtime.launch.limits.plan_problem)
            if e.memory.fits and plan_problem(m, p) is None:
                key = p.replace(vpp=1) if (p.schedule == "zero-bubble" and p.vpp == 2) else p
                assert key in ranked, p.describe()  # ZB-V is searched once, as vpp 1


def test_prices_are_the_cost_models(tiny, llama405):
    for r in (tiny, llama405):
        for e in r.ranked[:15] + r.ranked[-5:]:
            ref = estimate(r.model, r.cluster, e.plan, r.tokens, r.options)
            assert ref.step.total == e.step.total and ref.memory.total == e.memory.total
            assert ref.mfu == e.mfu and ref.time_to_train_s == e.time_to_train_s


def test_rejection_reasons():
    tiny, gpt4 = get_preset("tiny"), get_preset("tiny-gpt")
    # tp beyond a node
    r = search(tiny, cluster("cpu", 16, 4), 64, 256)
    assert r.layouts_rejected[S.TP_CROSSES_NODES] == 3  # tp 8 (pp 1, 2) and tp 16
    r2 = search(tiny, cluster("cpu", 16, 4), 64, 256, allow_tp_across_nodes=True)
    assert S.TP_CROSSES_NODES not in r2.layouts_rejected
    assert r2.layouts_rejected[S.TP_KV_HEADS] == 2  # tiny: 8 heads, 4 kv heads; tp 8
    assert r2.layouts_rejected[S.TP_HEADS] == 1  # tp 16
    assert any(e.plan.tp == 4 for e in r2.ranked)
    # heads, layers, batch
    assert search(gpt4, cluster("cpu", 8), 64, 256).layouts_rejected[S.TP_HEADS] == 1
    assert search(tiny, cluster("cpu", 8), 64, 256).layouts_rejected[S.PP_LAYERS] == 1
    assert search(tiny, cluster("cpu", 4), 6, 256).layouts_rejected[S.DP_BATCH] == 1
    # plan-level reasons
    r = search(tiny, cluster("cpu", 4), 32, 254, dtype="fp32")
    assert r.plans_rejected[S.SP_SEQ] > 0 and not any(e.plan.sp and e.plan.tp == 4 for e in r.ranked)
    r = search(tiny, cluster("cpu", 4), 8, 256, dtype="fp32")
    assert r.plans_rejected[S.FEW_MICROBATCHES] > 0
    assert r.plans_rejected[S.PP_LAYERS] > 0  # ZB-V on pp 4: 8 stages for 4 layers
    six = tiny.replace(n_layers=6)
    r = search(six, cluster("cpu", 4), 32, 256, fixed={"uneven_stages": False})
    assert r.plans_rejected[S.UNEVEN] > 0 and not any(e.plan.uneven_stages for e in r.ranked)
    r = search(six, cluster("cpu", 4), 32, 256)
    assert any(e.plan.uneven_stages and e.plan.pp == 4 for e in r.ranked)
    r = search(tiny, cluster("cpu", 4), 32, 256, fixed={"offload": True})
    assert r.plans_rejected[S.OFFLOAD_ZERO] > 0 and all(e.plan.zero >= 2 for e in r.ranked)
    # nothing fits: one error that says how much memory the smallest plan needs
    with pytest.raises(PtdError, match=r"no plan fits.*least memory is .* GiB"):
        search(get_preset("llama3.1-405b"), cluster("h100-sxm", 8), 64, 8192).best
    with pytest.raises(PtdError, match="no layout"):
        search(tiny, cluster("cpu", 4), 32, 256, fixed={"tp": 3})
    with pytest.raises(PtdError, match="max_seq_len"):
        search(tiny, cluster("cpu", 4), 32, 4096)


def test_ranking_by_objective(tiny):
    steps = [e.step.total for e in tiny.ranked]
    assert steps == sorted(steps) and tiny.best.step.total == min(steps)
    mem = search(tiny.model, tiny.cluster, 32, 256, dtype="fp32", objective="memory")
    totals = [e.memory.total for e in mem.ranked]
    assert totals == sorted(totals) and mem.plans_fit == tiny.plans_fit
    ttt = search(tiny.model, tiny.cluster, 32, 256, dtype="fp32", objective="time-to-train",
                 tokens=1e9)
    assert [e.plan for e in ttt.ranked] == [e.plan for e in tiny.ranked]
    assert ttt.best.time_to_train_s == pytest.approx(1e9 / ttt.best.tokens_per_s)
    assert ranked_plans(tiny.model, tiny.cluster, 32, 256, dtype="fp32")[0].plan == tiny.best.plan
    with pytest.raises(PtdError, match="objective"):
        search(tiny.model, tiny.cluster, 32, 256, objective="fastest")


def test_fix_pins_fields():
    fixed = parse_fix(["tp=2,mb=2", "rc=full", "sp=on"])
    assert fixed == {"tp": 2, "micro_batch": 2, "recompute": "full", "sp": True}
    r = search(get_preset("tiny"), cluster("cpu", 4), 32, 256, fixed=fixed)
    assert r.ranked and all((e.plan.tp, e.plan.micro_batch, e.plan.recompute, e.plan.sp)
                            == (2, 2, "full", True) for e in r.ranked)
    r = search(get_preset("tiny"), cluster("cpu", 4), 32, 256, fixed=parse_fix(["pp=2,vpp=2"]))
    assert {(e.plan.schedule, e.plan.vpp) for e in r.ranked} == {("interleaved-1f1b", 2)}
    for bad in ["tp=x", "bogus=1", "zero=4", "sp=maybe", "schedule=fast", "tp", "dp=0"]:
        with pytest.raises(PtdError, match="--fix"):
            parse_fix([bad])


@pytest.mark.parametrize("spec, says", [
    # a setting that does nothing without a pipeline: refused, not kept as a label
    ("pp=1,schedule=gpipe", "pp=1 leaves no pipeline: schedule"),
    ("pp=1,uneven=on", "pp=1 leaves no pipeline: uneven_stages"),
    ("pp=1,vpp=2", "pp=1 leaves no pipeline: vpp"),
    # pairs no plan satisfies, named instead of "no plan fits" for an unrelated reason
    ("pp=2,vpp=2,schedule=1f1b", "schedule=1f1b runs one stage per rank"),
    ("pp=2,vpp=2,schedule=gpipe", "schedule=gpipe runs one stage per rank"),
    ("vpp=1,schedule=interleaved-1f1b", "needs vpp > 1"),
    ("pp=2,vpp=2,schedule=zero-bubble", "vpp=1 here"),
    ("offload=on,zero=2", "offload=true needs zero=3"),
    ("grad-compression=powersgd,zero=1", "needs zero=0"),
])
def test_fixed_fields_that_contradict_each_other(spec, says):
    with pytest.raises(PtdError, match=says):
        search(get_preset("tiny"), cluster("cpu", 4), 32, 256, fixed=parse_fix([spec]))


@pytest.mark.parametrize("spec", ["pp=1", "schedule=gpipe", "pp=2,vpp=1,schedule=zero-bubble",
                                  "offload=on", "offload=on,zero=3", "grad-compression=powersgd",
                                  "zero=0,grad-compression=powersgd", "vpp=2"])
def test_fixed_fields_that_go_together_still_search(spec):
    # the edges of the check above: each of these has plans (zero-bubble's V shape is vpp 1)
    r = search(get_preset("tiny"), cluster("cpu", 4), 32, 256, fixed=parse_fix([spec]))
    assert r.ranked


# ------------------------------------------------------------ pareto, explain
def test_pareto_front_is_the_non_dominated_set(tiny):
    front = pareto_front(tiny.ranked)
    assert front[0].memory.total == min(e.memory.total for e in tiny.ranked)
    assert front[-1].step.total == tiny.best.step.total
    for f in front:  # nothing beats a front plan on both
        assert not any(e.memory.total <= f.memory.total and e.step.total < f.step.total
                       or e.memory.total < f.memory.total and e.step.total <= f.step.total
                       for e in tiny.ranked)
    for e in tiny.ranked:  # and every plan is matched or beaten by one on the front
        assert any(f.memory.total <= e.memory.total and f.step.total <= e.step.total for f in front)
    shown = thin(front, 4)
    assert len(shown) == 4 and shown[0] is front[0] and shown[-1] is front[-1]


def test_explain_accounts_for_every_dimension(llama405):
    win = llama405.best
    dims = explain(llama405)
    assert [d.name for d in dims] == list(DIMENSIONS)
    values = dimension_values(win.plan)
    for d in dims:
        assert d.value == values[d.name]
        assert all(a.value != d.value for a in d.alternatives)
        for a in d.alternatives:
            if a.best is not None:  # the best plan with that value, never better than #1
                assert dimension_values(a.best.plan)[d.name] == a.value
                assert objective_key("throughput", a.best) >= objective_key("throughput", win)
            else:
                assert a.reason
            if a.alone is not None:  # the winner with only this dimension changed
                assert dimension_values(a.alone.plan)[d.name] == a.value
    by = {d.name: {a.value: a for a in d.alternatives} for d in dims}
    assert by["tp"][16].reason == S.TP_CROSSES_NODES
    zero = by["zero"][(win.plan.zero + 1) % 4].alone
    assert zero.plan.replace(zero=win.plan.zero) == win.plan


# ----------------------------------------------------- known good layouts
# Narayanan et al. 2021 (SC21), Table 1, on A100 80GB: fp16, full recompute, seq 2048, vocab
# 51200, described as Megatron-LM ran it (unfused attention storing the scores, dropout 0.1,
# gradient all-reduce after backward), as in tests/test_cost.py::MEGATRON_ROWS.
MEGATRON_ROWS = [  # (layers, hidden, heads, global batch, gpus, tp)
    (24, 2304, 24, 512, 32, 1),
    (40, 6144, 48, 1024, 256, 8),
]
MEGATRON_OPTIONS = CostOptions(attention="scores", dp_overlap=False, tp_grad_per_linear=False)


@pytest.mark.parametrize("L,h,a,gb,n,tp", MEGATRON_ROWS)
def test_never_worse_than_megatron_table1(L, h, a, gb, n, tp):
    m = gpt(L, h, a, dropout=0.1)
    c = cluster("a100-80g", n)
    published = choose(m, c, ParallelPlan(dp=n // tp, tp=tp, global_batch=gb, seq_len=2048,
                                          dtype="fp16", recompute="full"),
                       ["micro_batch"], options=MEGATRON_OPTIONS)
    assert published.memory.fits
    best = search(m, c, gb, 2048, dtype="fp16", options=MEGATRON_OPTIONS).best
    assert best.step.total <= published.step.total
    # the search covers the published plan itself: held to its settings it finds it
    held = search(m, c, gb, 2048, dtype="fp16", options=MEGATRON_OPTIONS,
                  fixed=dict(dp=n // tp, tp=tp, pp=1, zero=0, sp=False, recompute="full"))
    assert held.best.plan == published.plan and held.best.step.total == published.step.total
    tflops = megatron_flops_per_iteration(m, gb, 2048) / best.step.total / n / 1e12
    assert tflops > 0


def test_never_worse_than_llama3_405b_layout(llama405):
    # Dubey et al. 2024 (Llama 3), Table 4: tp 8, pp 16, dp 128 on 16,384 H100, seq 8192,
    # 16M tokens per batch (2048 sequences), bf16; 126 layers on 16 stages (uneven).
    m, c = llama405.model, llama405.cluster
    published = choose(m, c, ParallelPlan(dp=128, tp=8, pp=16, global_batch=2048, seq_len=8192,
                                          dtype="bf16", uneven_stages=True), FREE_KNOBS)
    assert published.memory.fits
    assert llama405.best.step.total <= published.step.total
    held = search(m, c, 2048, 8192, fixed={"tp": 8, "pp": 16})
    assert held.best.step.total <= published.step.total
    match = [e for e in held.ranked if e.plan == published.plan]  # the published region is searched
    assert match and match[0].step.total == published.step.total


def test_405b_search_counts_plans(llama405):
    # (its speed is measured by benchmarks/speed.py, not asserted: no absolute wall time here)
    t = time.perf_counter()
    r = search(llama405.model, llama405.cluster, 2048, 8192)
    wall = time.perf_counter() - t
    assert r.elapsed_s <= wall  # the reported search time is part of the call's
    assert r.plans_considered == llama405.plans_considered > 10_000


# ------------------------------------------------------------------- CLI
ARGS_405 = ["plan", "--model", "llama3.1-405b", "--hardware", "h100-sxm", "--gpus", "16384",
            "--global-batch", "2048", "--seq-len", "8192"]
ARGS_TINY = ["plan", "--model", "tiny", "--hardware", "cpu", "--gpus", "4", "--seq-len", "256",
             "--global-batch", "32", "--dtype", "fp32"]


def test_plan_table(ptd_cli):
    rc, out, _ = ptd_cli(*ARGS_405, "--top", "3", "--tokens", "15e12")
    assert rc == 0
    # 16384 = 2^14 devices: layouts tp = 2^a, pp = 2^b with a + b <= 14: 15*16/2 = 120.
    # Plans, counted over the layouts the search does not reject first (tp <= 8 inside a
    # node; pp <= 126 layers, so b <= 6; dp = 2^(14-a-b) divides the batch 2048 = 2^11, so
    # a + b >= 3): schedules S(pp) x micro-batches (divisors of 2^(a+b-3): a+b-2 of them)
    # x zero (4) x sp (1 if tp = 1 else 2) x recompute (3). S(1) = 1; for pp > 1, gpipe,
    # 1f1b and ZB-V, interleaved vpp v in 2..126/pp with 126 % (pp v) == 0 or v <= 8, and
    # zero-bubble for those v > 2: S(2) = 3+10+9 = 22 (v in 2..9, 21, 63), S(4) = S(8) =
    # 3+7+6 = 16, S(16) = 3+6+5 = 14, S(32) = 3+2+1 = 6, S(64) = 3. The sum over
    # a in 0..3, b in 0..6, a+b >= 3 of S(2^b) (a+b-2) 4 sp(a) 3 is 15744.
    assert "searched 15744 plans in 120 layouts" in out
    for s in ("top 3 of", "memory/device", "step time", "tokens/s", "MFU", "time to train 15 T tok",
              "Pareto front", "rejected", "tp crosses nodes [layouts]", "does not fit in memory"):
        assert s in out, s
    first = next(l for l in out.splitlines() if l.lstrip().startswith("1 "))
    assert "tp8" in first and "GiB (" in first and "s (" in first


def test_plan_json(ptd_cli):
    rc, out, _ = ptd_cli(*ARGS_TINY, "--json", "--top", "4", "--explain")
    assert rc == 0
    d = json.loads(out)
    s = d["search"]
    assert s["plans_fit"] + sum(s["plans_rejected"].values()) == s["plans_considered"]
    assert len(d["top"]) == 4 and d["top"][0]["fits"]
    steps = [t["step_time_s"]["total"] for t in d["top"]]
    assert steps == sorted(steps)
    assert d["pareto"] and all({"plan", "memory_bytes", "step_time_s"} <= set(p) for p in d["pareto"])
    assert [x["dimension"] for x in d["explain"]] == list(DIMENSIONS)


def test_plan_explain_text(ptd_cli):
    rc, out, _ = ptd_cli(*ARGS_TINY, "--explain", "--top", "2")
    assert rc == 0 and "why plan #1" in out
    for dim in DIMENSIONS:
        assert f"\n{dim} " in out, dim


def test_plan_fix_and_objective(ptd_cli):
    rc, out, _ = ptd_cli(*ARGS_TINY, "--fix", "tp=2", "--fix", "zero=1", "--objective", "memory",
                         "--json")
    assert rc == 0
    d = json.loads(out)
    assert d["fixed"] == {"tp": 2, "zero": 1} and d["objective"] == "memory"
    assert all(t["plan"]["tp"] == 2 and t["plan"]["zero"] == 1 for t in d["top"])
    mem = [t["memory_per_device_bytes"]["total"] for t in d["top"]]
    assert mem == sorted(mem)


@pytest.mark.parametrize("argv", [
    ["plan", "--model", "nope"],
    ["plan", "--fix", "tp=x"],
    ["plan", "--fix", "bogus=1"],
    ["plan", "--top", "0"],
    ["plan", "--gpus", "-1"],
    ["plan", "--objective", "fastest"],
    ["plan", "--gpus", "8", "--fix", "tp=3"],
    ["plan", "--model", "llama3.1-405b", "--gpus", "8"],
    ["plan", "--model", "tiny", "--seq-len", "100000"],
    ["plan", "--gpus", "12", "--gpus-per-node", "8"],
    ["plan", "--export", "jax"],
])
def test_plan_bad_input(ptd_cli, argv):
    rc, out, err = ptd_cli(*argv)
    assert rc == 2 and err.count("\n") == 1 and err.startswith(f"ptd {argv[0]}: error:"), err


def test_run_refuses_other_exports(ptd_cli):
    rc, _, err = ptd_cli(*ARGS_TINY, "--run", "--export", "megatron")
    assert rc == 2 and "--run writes a ptd config" in err and err.count("\n") == 1


SMALL_RUN = ["--model", "tiny", "--hardware", "cpu", "--gpus", "2", "--seq-len", "32",
             "--global-batch", "4", "--dtype", "fp32", "--steps", "2"]


def _ptd(*args, cwd):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "ptd", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=240)


@pytest.mark.dist
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fix", ["zero=0,tp=1,pp=1", "zero=3,tp=1,pp=1", "tp=2", "pp=2"])
def test_exported_ptd_config_trains(tmp_path, fix):
    from ptd.specs import load_config
    plan_file = tmp_path / "plan.toml"
    r = _ptd("plan", *SMALL_RUN, "--fix", fix, "--export", "ptd", "-o", str(plan_file), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    exported = load_config(plan_file)
    r = _ptd("train", "--config", str(plan_file), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["status"] == "ok"
    assert load_config(tmp_path / "out" / "config.toml").plan == exported.plan


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_run_trains_the_winner(tmp_path):
    from ptd.specs import load_config
    r = _ptd("plan", *SMALL_RUN, "--run", "-o", str(tmp_path / "p" / "plan.toml"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "running: -m ptd train --config" in r.stdout
    winner = load_config(tmp_path / "p" / "plan.toml").plan
    ran = load_config(tmp_path / "p" / "run" / "config.toml").plan
    assert ran == winner
    assert json.loads((tmp_path / "p" / "run" / "summary.json").read_text())["steps"] == 2

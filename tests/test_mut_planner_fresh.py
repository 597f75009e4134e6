"""planner: single-process tests for the real survivors of the fresh sample of the whole
package (seed 20261209, docs/testing.md, seventh session). Expected values by hand."""

from __future__ import annotations

from types import SimpleNamespace

import ptd.planner.trial as T
import ptd.trainrun
from helpers import cluster
from ptd.cost.estimate import estimate
from ptd.planner import export_megatron as MG
from ptd.specs import ParallelPlan, get_preset, load_config, load_model
from ptd.specs.config import TrainConfig


def test_megatron_export_of_a_model_read_from_toml(tmp_path):
    # A model file's strings are built by tomllib at run time, so they are equal to the
    # literals "rmsnorm", "swiglu", "rope" but not the same objects (`is` is False for them;
    # the presets' values are the interned literals themselves). The file describes tiny
    # exactly, so its Megatron-LM arguments are tiny's: RMSNorm, SwiGLU, RoPE.
    f = tmp_path / "mine.toml"
    f.write_text('[model]\npreset = "tiny"\nnorm = "rmsnorm"\nmlp = "swiglu"\n'
                 'position = "rope"\n')
    mine, tiny = load_model(str(f)), get_preset("tiny")
    assert mine.norm == tiny.norm == "rmsnorm" and mine.norm is not tiny.norm  # the point
    plan = ParallelPlan(global_batch=8, seq_len=64, dtype="bf16")

    def args(model):
        e = SimpleNamespace(model=model, plan=plan, cluster=cluster("cpu", 1, 0))
        return MG.arguments(e, (4,), None, TrainConfig())

    got, notes = args(mine)
    assert ("--normalization", "RMSNorm") in got and ("--swiglu", None) in got
    assert ("--position-embedding-type", "rope") in got
    assert (got, notes) == args(tiny)


def test_try_creates_a_try_dir_whose_parents_do_not_exist(tmp_path, monkeypatch):
    # `ptd plan --try --try-dir a/b/c`: run_all makes c/plans with its parents, writes the
    # one candidate's config there as plan0001.toml and runs it once (a stand-in train).
    plan = ParallelPlan(dp=1, global_batch=8, seq_len=64, dtype="fp32")
    c = T.Candidate(1, estimate(get_preset("tiny"), cluster("cpu", 1), plan), "top 1")
    runs = []

    def train(run_dir, args, timeout):
        runs.append(run_dir)
        return {"measured": {"tokens_per_s": 100.0}}

    monkeypatch.setattr(ptd.trainrun, "train_subprocess", train)
    out = tmp_path / "a" / "b" / "c"
    T.run_all([c], out, hardware="cpu", steps=3, repeats=1, timeout=10.0, log=lambda m: None)
    assert load_config(out / "plans" / "plan0001.toml").plan == plan
    assert runs == [out / "runs" / "plan0001-r1"] and c.measured == [100.0]


def test_megatron_export_of_many_heads_without_gqa_has_no_query_groups():
    # 512 heads and 512 kv heads, read as separate int objects (as tomllib reads a file):
    # equal but not identical above CPython's small-int cache (256). Multi-head attention
    # exports --num-attention-heads 512 and no --group-query-attention/--num-query-groups.
    many = load_model({"preset": "tiny", "n_heads": int("512"), "n_kv_heads": int("512"),
                       "hidden": 4096, "head_dim": 8})
    assert many.n_heads == many.n_kv_heads == 512 and many.n_heads is not many.n_kv_heads
    plan = ParallelPlan(global_batch=8, seq_len=64, dtype="bf16")
    e = SimpleNamespace(model=many, plan=plan, cluster=cluster("cpu", 1, 0))
    flags = dict(MG.arguments(e, (4,), None, TrainConfig())[0])
    assert flags["--num-attention-heads"] == 512
    assert "--group-query-attention" not in flags and "--num-query-groups" not in flags

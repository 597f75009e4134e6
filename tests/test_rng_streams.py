"""Random streams (dropout masks) per rank: one per data-parallel replica, pipeline rank and
context-parallel slice, the same for tensor-parallel peers -- at the start of a run and after
a resume onto another layout (both call ``ParallelDims.seed_rng``); and an exact resume with
dropout, where the saved RNG states are restored.

Wrong versions these catch: seeding with the global rank (tp peers would draw different
masks for the residual stream they share), seeding every rank alike (replicas would drop the
same units), restoring nothing (a resume with dropout would not replay the run).
"""

from __future__ import annotations

import json

import pytest
import torch

from ptd.cli import main
from ptd.runtime.parallel.mesh import ParallelDims
from ptd.specs import ParallelPlan
from ptd.specs.layout import coords


def draws(plan: ParallelPlan, seed: int = 7, step: int = 0) -> list[tuple]:
    """``torch.rand(8)`` of every rank after seeding its stream, as tuples (by rank)."""
    out = []
    for r in range(plan.world_size):
        dims = ParallelDims(plan, r, plan.world_size, r, torch.device("cpu"), None)  # type: ignore[arg-type]
        dims.seed_rng(seed, step)
        out.append(tuple(torch.rand(8).tolist()))
    return out


def test_tensor_parallel_peers_share_a_stream_and_nobody_else_does() -> None:
    plan = ParallelPlan(dp=2, tp=2, pp=2, cp=2, global_batch=4, seq_len=64)  # 16 ranks
    d = draws(plan)
    for a in range(plan.world_size):
        for b in range(a + 1, plan.world_size):
            ca, cb = coords(a, plan), coords(b, plan)
            same_stream = all(ca[k] == cb[k] for k in ("pp", "dp", "cp"))
            assert (d[a] == d[b]) == same_stream, (ca, cb)


def test_a_reseed_at_another_step_draws_another_stream_and_repeats_itself() -> None:
    plan = ParallelPlan(dp=2, tp=2, global_batch=4)
    assert draws(plan, step=5) != draws(plan, step=0)
    assert draws(plan, step=5) == draws(plan, step=5)
    assert draws(plan, seed=8) != draws(plan, seed=7)


@pytest.mark.timeout(180)
def test_resume_with_dropout_replays_the_run(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PTD_HOME", str(tmp_path / "home"))
    model = tmp_path / "drop.toml"
    model.write_text('[model]\npreset = "tiny"\nname = "tiny-dropout"\ndropout = 0.2\n')
    run = ["--model", str(model), "--nproc", "1", "--steps", "4", "--global-batch", "4",
           "--micro-batch", "4", "--seq-len", "32", "--warmup", "1", "--checkpoint-every", "2"]
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert main(["train", *run, "--out", str(a)]) == 0
    nodrop = tmp_path / "nodrop.toml"
    nodrop.write_text('[model]\npreset = "tiny"\nname = "tiny-dropout"\ndropout = 0.0\n')
    assert main(["train", *run, "--model", str(nodrop), "--out", str(c)]) == 0
    assert main(["train", "--resume", str(a / "checkpoints" / "step_00000002"), "--out", str(b)]) == 0

    def losses(out):
        return [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert losses(b) == losses(a)  # steps 3-4 draw the masks the uninterrupted run drew
    assert losses(c)[0] != losses(a)[0]  # (dropout is on: without it, step 1 differs)

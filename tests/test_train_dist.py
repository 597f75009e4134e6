"""Real training runs through ``ptd train`` (torchrun, gloo, 2 workers): loss parity of the
data-parallel family with one process, bf16, activation checkpointing, a crashing worker.

Every run is its own ``ptd train`` process with its own world. ``PTD_DUMP_PARAMS=1`` makes
rank 0 save the consolidated parameters before the first and after the last step.
"""

import functools
import json
import math

import pytest
import torch

import helpers
from helpers import assert_same_run, losses, params

pytestmark = pytest.mark.dist

# tiny Llama-style model (GQA, RoPE, SwiGLU), 8 sequences of 64 tokens per step, 10 steps.
# (no torch.profiler steps: they cost ~1-2 s a run, and these tests compare losses)
COMMON = ["--model", "tiny", "--steps", "10", "--global-batch", "8", "--seq-len", "64",
          "--warmup", "3", "--timeout", "60", "--profile-steps", "0"]
RUN_TIMEOUT = 150


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("ptd_home")


# every run saves its parameters before the first and after the last step
train = functools.partial(helpers.ptd_train, common=COMMON, dump_params=True, timeout=RUN_TIMEOUT)
trained = functools.partial(helpers.trained, common=COMMON, dump_params=True, timeout=RUN_TIMEOUT)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, home):
    """One process, fp32, the whole global batch in one micro-batch."""
    return trained(tmp_path_factory.mktemp("ref") / "run", "--nproc", "1", "--micro-batch", "8",
                   home=home)


@pytest.mark.timeout(2 * RUN_TIMEOUT + 60)
# (ZeRO-1/2 parity on dp 2: test_zero12_one_block_per_unit, one block per unit)
@pytest.mark.parametrize("zero", [0, 3], ids=["ddp", "zero3"])
def test_loss_parity_with_single_process(reference, home, tmp_path, zero):
    # 2 workers x micro-batch 4: no accumulation; micro-batch 2: accumulation over 2.
    for mb in (4, 2):
        run = trained(tmp_path / f"mb{mb}", "--nproc", "2", "--zero", str(zero),
                      "--micro-batch", str(mb), home=home)
        assert_same_run(run, reference)
        summary = json.loads((run / "summary.json").read_text())
        assert summary["world_size"] == 2 and summary["plan"]["zero"] == zero
        assert summary["runtime_params"] == summary["param_count"]
        # parameters, gradients and optimizer states counted from the tensors on each rank
        # are the cost model's per-rank numbers exactly (ZeRO-2: gradients of owned
        # parameters only)
        assert summary["measured"]["memory"]["model_states_equal_per_rank"] is True


@pytest.mark.timeout(2 * RUN_TIMEOUT + 60)
@pytest.mark.parametrize("zero", [1, 2], ids=["zero1", "zero2"])
def test_zero12_one_block_per_unit(reference, home, tmp_path, zero):
    # The tiny model's blocks (148 kB each) are far under the 25 MiB that closes a ZeRO-1/2
    # FSDP unit, so the runs above hold one unit; a unit size of 1 byte makes every block a
    # unit of its own, as a block of a billion-parameter model is: 5 gathers and
    # reduce-scatters a step, with accumulation over 2 micro-batches
    run = trained(tmp_path / "run", "--nproc", "2", "--zero", str(zero), "--micro-batch", "2",
                  home=home, env={"PTD_FSDP_UNIT_BYTES": "1"})
    assert_same_run(run, reference)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["measured"]["memory"]["model_states_equal_per_rank"] is True


def test_zero12_units_group_blocks_to_the_bucket_size():
    from torch import nn
    from ptd.runtime.parallel.fsdp import bucket_blocks
    blocks = [nn.Linear(10, 10, bias=False) for _ in range(5)]  # 400 bytes of fp32 each
    assert bucket_blocks(blocks, 1) == [[b] for b in blocks]
    assert bucket_blocks(blocks, 800) == [blocks[0:2], blocks[2:4]]  # the fifth: the root's
    assert bucket_blocks(blocks, 801) == [blocks[0:3]]
    assert bucket_blocks(blocks, 2001) == []  # all of them the root's


@pytest.mark.timeout(2 * RUN_TIMEOUT + 60)
def test_gpt_style_tied_embeddings_parity_under_zero3(home, tmp_path):
    common = ["--model", "tiny-gpt", *COMMON[2:]]
    ref = trained(tmp_path / "ref", "--nproc", "1", "--micro-batch", "8", home=home, common=common)
    run = trained(tmp_path / "z3", "--nproc", "2", "--zero", "3", "--micro-batch", "2",
                  home=home, common=common)
    assert_same_run(run, ref)
    p = params(run)
    assert torch.equal(p["output.weight"], p["tok_embeddings.weight"])


@pytest.mark.timeout(2 * RUN_TIMEOUT + 60)
@pytest.mark.parametrize("mode", ["selective", "full"])
def test_activation_checkpointing_same_losses(reference, home, tmp_path, mode):
    run = trained(tmp_path / mode, "--nproc", "1", "--micro-batch", "8", "--recompute", mode,
                  home=home)
    assert losses(run) == pytest.approx(losses(reference), rel=1e-6, abs=0)


@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_activation_checkpointing_under_zero3(reference, home, tmp_path):
    run = trained(tmp_path / "z3full", "--nproc", "2", "--zero", "3", "--micro-batch", "2",
                  "--recompute", "full", home=home)
    assert_same_run(run, reference)


@pytest.mark.timeout(2 * RUN_TIMEOUT + 60)
@pytest.mark.parametrize("zero", [0, 3], ids=["ddp-autocast", "fsdp-mixed-precision"])
def test_bf16_trains(reference, home, tmp_path, zero):
    flags = ["--steps", "20", "--nproc", "2", "--zero", str(zero), "--micro-batch", "4"]
    run = trained(tmp_path / "bf16", *flags, "--dtype", "bf16", home=home)
    lb = losses(run)
    assert all(math.isfinite(x) for x in lb)
    assert sum(lb[-5:]) / 5 < lb[0] - 1.0, lb
    # bf16 really ran: the losses are close to, but not the same as, fp32's.
    ref = losses(reference)
    assert lb[:10] != ref
    assert abs(lb[0] - ref[0]) < 0.01


@pytest.mark.timeout(RUN_TIMEOUT + 30)
@pytest.mark.parametrize("launch", ["fork", "torchrun"])
def test_crashing_worker_fails_the_run_with_its_error(home, tmp_path, launch):
    # fork: CPU workers forked from ptd train's own elastic agent (the default here);
    # torchrun: fresh worker interpreters under a torchrun process (GPU hosts)
    r = train(tmp_path / "crash", "--nproc", "2", "--micro-batch", "4", home=home,
              env={"PTD_FAULT": "crash:rank=1:step=3", "PTD_LAUNCH": launch})
    assert r.returncode != 0
    assert "PTD_FAULT: injected crash on rank 1 at step 3" in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ptd train: error: training failed") and "rank 1" in last
    metrics = losses(tmp_path / "crash")
    assert len(metrics) == 2  # steps 1 and 2 ran; nothing after the crash


@pytest.mark.timeout(RUN_TIMEOUT + 30)
def test_hanging_worker_becomes_an_error_after_the_timeout(home, tmp_path):
    # Rank 1 stops answering at step 2; rank 0's collective gives up after --timeout 5.
    r = train(tmp_path / "hang", "--nproc", "2", "--micro-batch", "4", "--timeout", "5",
              home=home, env={"PTD_FAULT": "hang:rank=1:step=2"})
    assert r.returncode != 0
    assert "Timed out" in r.stderr or "timed out" in r.stderr.lower()
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ptd train: error: training failed")
    # The error names the rank that gave up, the collective, the step, and the stuck peer.
    assert ("rank 0: DDP gradient all-reduce (forward_backward) at step 2 timed out after 5 s; "
            "rank 1 is stuck at step 2 in 'start of step'") in last, last

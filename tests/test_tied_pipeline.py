"""Tied embeddings across pipeline stages, and fp16 loss scaling in the pipeline schedules.

A GPT-style model (``tiny-gpt``: tied embeddings, learned positions) split over pipeline
stages holds the embedding on the first stage and a copy of it as the output layer on the
last; the copies start equal (seeded by the embedding's name) and sum their gradients, so
the run must train exactly as one process does -- losses, gradient norms (the copy counted
once) and every parameter, initial and final. The copy's AdamW states are checkpointed
under the embedding's name, so a one-process checkpoint resumes on the pipeline. In fp16
every rank (pipeline stages, tensor-parallel shards) must agree on each overflow.

Each run is its own ``ptd train`` process (gloo); the parity harness as in
``test_train_tppp.py``.
"""

import functools
import json

import pytest

import helpers
from helpers import assert_same_params, grad_norms, losses

pytestmark = pytest.mark.dist

# (no torch.profiler steps: they cost ~1-2 s a run, and these tests compare losses)
COMMON = ["--model", "tiny-gpt", "--steps", "10", "--global-batch", "8", "--seq-len", "64",
          "--warmup", "3", "--timeout", "60", "--val-fraction", "0.05", "--profile-steps", "0"]
RUN_TIMEOUT = 150
trained = functools.partial(helpers.trained, dump_params=True, timeout=RUN_TIMEOUT,
                            common=COMMON)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, module_home):
    """One process, fp32, one micro-batch, a checkpoint at step 5 (the resume's source)."""
    return trained(tmp_path_factory.mktemp("ref") / "run", "--nproc", "1", "--micro-batch", "8",
                   "--checkpoint-every", "5", "--eval-every", "5", home=module_home)


def assert_losses(run, ref, rel, steps=range(1, 11)):
    la = {r["step"]: r["loss"] for r in helpers.records(run)}
    lb = {r["step"]: r["loss"] for r in helpers.records(ref)}
    for step in steps:
        assert abs(la[step] - lb[step]) <= rel * abs(lb[step]), f"step {step}: {la[step]} vs {lb[step]}"


@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_tied_embeddings_on_two_stages_train_as_one_process(reference, module_home, tmp_path):
    run = trained(tmp_path / "pp2", "--nproc", "2", "--pp", "2", "--schedule", "1f1b",
                  "--micro-batch", "2", home=module_home)
    assert_losses(run, reference, 1e-5)
    # the copy is left out of the norm: counted twice, the norm would exceed the reference
    assert grad_norms(run) == pytest.approx(grad_norms(reference), rel=1e-4)
    assert grad_norms(reference)[0] > 1.0  # clipping (at 1.0) is exercised
    # initial parameters bit-identical (the copy seeded as the embedding), final within 1e-5,
    # output.weight included: without the gradient sum the copies drift apart
    assert_same_params(run, reference, 1e-5)
    final = helpers.params(run)
    assert final["output.weight"].equal(final["tok_embeddings.weight"])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["runtime_params"] == summary["param_count"]  # the copy counted once
    assert losses(reference)[-1] < losses(reference)[0] - 0.3


@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_tied_and_learned_positions_on_pp2_tp2_sp_train_as_one_process(reference, module_home,
                                                                        tmp_path):
    # tp: the copies are Shard(0) over the padded vocabulary, summed shard by shard; sp with
    # learned positions: the embedding stays whole (all-reduced, positions added) and block 0
    # takes its sequence shard -- which a refusal used to stand in for
    run = trained(tmp_path / "pp2tp2sp", "--nproc", "4", "--pp", "2", "--tp", "2", "--sp",
                  "--micro-batch", "2", "--eval-every", "5", home=module_home)
    assert_losses(run, reference, 1e-4)  # (tp: matmuls split, sums in another order)
    assert grad_norms(run) == pytest.approx(grad_norms(reference), rel=1e-4)
    assert_same_params(run, reference, 1e-5)
    assert [r["val_loss"] for r in helpers.records(run) if "val_loss" in r] == pytest.approx(
        [r["val_loss"] for r in helpers.records(reference) if "val_loss" in r], rel=1e-4)


@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_one_process_checkpoint_resumes_on_the_pipeline(reference, module_home, tmp_path):
    # the last stage's copy reads the AdamW states a one-process run keeps under the
    # embedding's name; steps 6-10 then continue the uninterrupted run
    ckpt = reference / "checkpoints" / "step_00000005"
    out = tmp_path / "resumed"
    helpers.ok(helpers.ptd_train(out, "--resume", str(ckpt), "--nproc", "2", "--pp", "2",
                                 "--micro-batch", "2", home=module_home, timeout=RUN_TIMEOUT))
    assert_losses(out, reference, 1e-5, steps=range(6, 11))


@pytest.mark.timeout(2 * RUN_TIMEOUT + 60)
def test_fp16_loss_scaling_on_pipeline_and_tensor_parallel(module_home, tmp_path):
    # fp16 on a CPU: torch's autocast and GradScaler (emulated fp16 matmuls, slow but small).
    # The last stage scales its loss inside the schedule and the inner stage's gradients
    # arrive scaled; every rank unscales by the same scale. tp shards sum in another order
    # (1e-4 in fp32 elsewhere); fp16's rounding of those sums gives ~2e-4 here (measured).
    ref = trained(tmp_path / "ref16", "--nproc", "1", "--micro-batch", "8", "--dtype", "fp16",
                  home=module_home)
    run = trained(tmp_path / "pp2tp2", "--nproc", "4", "--pp", "2", "--tp", "2",
                  "--micro-batch", "2", "--dtype", "fp16", home=module_home)
    assert_losses(run, ref, 1e-3)
    assert grad_norms(run) == pytest.approx(grad_norms(ref), rel=1e-2)
    assert losses(ref)[-1] < losses(ref)[0] - 0.3

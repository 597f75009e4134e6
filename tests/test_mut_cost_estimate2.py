"""cost/estimate.py: two rules a sampled mutation run left untested (twenty-ninth session: 30
of its 626 mutants, seed 20261130, 26 killed; docs/testing.md): which plans take ptd's
autocast activation count, and when zero-0 gradient reduction stops overlapping the backward
because of model parallelism. Expected values from the rules as the docstrings state them."""

import dataclasses

import pytest

from ptd.cost.estimate import CostOptions, autocast, dp_overlap
from ptd.specs import ParallelPlan

PTD = CostOptions()  # ptd's runtime: autocast elementwise kind, ptd's byte convention


def test_autocast_activations_are_ptds_zero_0_runs_only():
    # torch.autocast runs under ZeRO-0 only (FSDP casts the parameters instead), and only
    # ptd's byte convention counts its copies
    bf16 = ParallelPlan(dp=2, micro_batch=1, global_batch=2, seq_len=64, dtype="bf16")
    assert autocast(PTD, bf16) is True
    assert autocast(PTD, dataclasses.replace(bf16, zero=1)) is False
    for other in ("megatron", "zero"):
        assert autocast(dataclasses.replace(PTD, convention=other), bf16) is False


@pytest.mark.parametrize("axis", ["tp", "pp", "cp", "ep"])
def test_model_parallelism_of_any_kind_reduces_zero_0_gradients_after_the_backward(axis):
    # dp_overlap_model_parallel False (ptd's runtime): with any of tp, pp, cp or ep above 1 the
    # zero-0 gradients are reduced after the backward, whatever the pipeline rule says
    # (dp_overlap_pipeline True); with none of them they overlap it
    opts = dataclasses.replace(PTD, dp_overlap_model_parallel=False, dp_overlap_pipeline=True)
    base = dict(dp=2, micro_batch=1, global_batch=4, seq_len=64)
    assert dp_overlap(opts, ParallelPlan(**base)) is True
    assert dp_overlap(opts, ParallelPlan(**base, **{axis: 2})) is False

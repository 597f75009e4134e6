"""cost/stacks.py: each named stack's behaviours, read off the sources each one cites
(written from the survivors of a mutation run, docs/testing.md). Torch-free."""

import dataclasses

import pytest

from ptd.cost.estimate import CostOptions
from ptd.cost.stacks import STACKS, Stack, stack_options
from ptd.errors import PtdError

ALL4 = ("1f1b", "interleaved-1f1b", "zero-bubble", "gpipe")
MEGATRON2 = ("1f1b", "interleaved-1f1b")  # Narayanan et al. 2021, section 2.2

# (attention, dp_overlap, recompute_early_stop, tp_grad_per_linear, schedules), from the
# citations in stacks.py:
EXPECTED = {
    # PyTorch SDPA (flash), DDP/FSDP2 reduce during backward, non-reentrant checkpoint
    # (early stop), DTensor per-linear input-gradient reduction, all four schedules
    "ptd": ("flash", True, True, True, ALL4),
    # SC21: unfused attention (scores), all-reduce after backward (overlap came in 2023),
    # full recompute re-runs the forward, fused QKV/MLP projections; 1F1B and interleaved
    "megatron-2021": ("scores", False, False, False, MEGATRON2),
    # Megatron-Core: TE fused attention, --overlap-grad-reduce, fused projections
    "megatron-core": ("flash", True, False, False, MEGATRON2),
    # torchtitan: the same PyTorch pieces as ptd
    "torchtitan": ("flash", True, True, True, ALL4),
    # Megatron-DeepSpeed: Megatron 2021 kernels, ZeRO overlap_comm, 1F1B only
    "deepspeed": ("scores", True, False, False, ("1f1b",)),
    # DeepSpeed of 2021: the same, its ZeRO-3 gathering tensor by tensor (below)
    "deepspeed-2021": ("scores", True, False, False, ("1f1b",)),
}
# ZeRO-3 gathers: per block and prefetched (FSDP, and DeepSpeed since its per-module
# coalescing, #1188) except DeepSpeed 2021's one synchronous all-gather per tensor (#1069)
ZERO3_GATHER = {name: "unit" for name in EXPECTED} | {"deepspeed-2021": "param-sync"}


def test_the_six_stacks_and_nothing_else():
    assert set(STACKS) == set(EXPECTED)
    for name, s in STACKS.items():
        assert s.name == name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_stack_options_carry_each_behaviour(name):
    attention, overlap, early, per_linear, schedules = EXPECTED[name]
    o = stack_options(name)
    assert isinstance(o, CostOptions)
    assert o.attention == attention
    assert o.dp_overlap is overlap
    assert o.recompute_early_stop is early
    assert o.tp_grad_per_linear is per_linear
    assert o.schedules == schedules
    assert o.zero3_gather == ZERO3_GATHER[name]
    # Megatron-Core's memory is Megatron-LM's layout (2 + 4 + 12 bytes, distributed optimizer
    # over dp x cp) with the fused SwiGLU; every other stack keeps ptd's runtime's
    megatron = name == "megatron-core"
    assert o.convention == ("megatron" if megatron else "ptd")
    assert o.fused_swiglu is megatron
    # what a stack does not name keeps CostOptions' defaults
    d = CostOptions()
    assert (o.gqa_expanded, o.fused_norm, o.moe_imbalance, o.ps_servers) == \
        (d.gqa_expanded, d.fused_norm, d.moe_imbalance, d.ps_servers)


def test_unknown_stack_is_a_ptd_error_naming_the_known_ones():
    with pytest.raises(PtdError) as e:
        stack_options("nemo")
    msg = str(e.value)
    assert "unknown stack 'nemo'" in msg
    assert "known: ptd, megatron-2021, megatron-core, torchtitan, deepspeed, deepspeed-2021" in msg
    # raised "from None": the KeyError is not chained
    assert e.value.__cause__ is None and e.value.__suppress_context__


def test_stack_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        STACKS["ptd"].dp_overlap = False  # type: ignore[misc]
    assert dataclasses.is_dataclass(Stack)


def test_deepspeed_pipelines_reduce_after_the_schedule():
    # deepspeed/runtime/pipe/schedule.py, TrainSchedule: ReduceGrads after the last backward
    from ptd.cost.estimate import dp_overlap, estimate
    from ptd.specs import ClusterSpec, ParallelPlan, get_preset
    from ptd.specs.hardware import get_hardware_preset
    pipe = ParallelPlan(dp=2, pp=2, zero=1, micro_batch=1, global_batch=8, seq_len=512,
                        dtype="bf16")
    flat = pipe.replace(pp=1, dp=4)
    for name in STACKS:
        o = stack_options(name)
        assert o.dp_overlap_pipeline is (not name.startswith("deepspeed"))
        assert dp_overlap(o, flat) is o.dp_overlap
        if name.startswith("deepspeed"):
            assert dp_overlap(o, pipe) is False
    # priced so: every byte of the reduction exposed on the pipeline, not on the flat plan
    m, cl = get_preset("gpt2"), ClusterSpec(get_hardware_preset("a100-80g"), 4)
    st = estimate(m, cl, pipe, options=stack_options("deepspeed")).step
    assert st.dp_comm_total > 0 and st.dp_comm_exposed == pytest.approx(st.dp_comm_total)
    st = estimate(m, cl, flat, options=stack_options("deepspeed")).step
    assert st.dp_comm_exposed < st.dp_comm_total

"""cost/stacks.py: the two behaviours test_mut_cost_stacks.py does not check -- how each stack
runs its memory-bound operators and whether its zero-0 gradient reduction overlaps the
backward under model parallelism -- read off the sources each stack cites (written from the
survivors of a sampled mutation run, seed 20261130). Torch-free."""

import pytest

from test_mut_cost_stacks import EXPECTED

from ptd.cost.stacks import STACKS, stack_options

# Memory-bound operators, from each stack's citation in stacks.py:
ELEMENTWISE = {
    # ptd's runtime: fp32 weights under torch.autocast, norms / rotary / activation / loss as
    # eager PyTorch operators (src/ptd/runtime)
    "ptd": "autocast",
    # torchtitan: the reference Llama model's eager RMSNorm (x.float()...type_as), eager
    # rotary embedding and SwiGLU, repeat_kv copies (torchtitan/models/llama/model.py)
    "torchtitan": "llama-ref",
    # Megatron's fused kernels (fused scale-mask-softmax, 2021) and Transformer Engine
    # (Megatron-Core); Megatron-DeepSpeed and DeepSpeed 2021 run Megatron's 2021 kernels
    "megatron-2021": "fused",
    "megatron-core": "fused",
    "deepspeed": "fused",
    "deepspeed-2021": "fused",
}
# Zero-0 gradient reduction with tp, pp, cp or ep > 1: only ptd's runtime reduces after the
# backward (runtime/parallel/ddp.py GradAllReduce: DDP holds no DTensors); Megatron overlaps
# with --overlap-grad-reduce, DeepSpeed with overlap_comm, torchtitan's FSDP2 during backward.
# (Megatron 2021 does not overlap at all: its dp_overlap is False, test_mut_cost_stacks.py.)
OVERLAP_MODEL_PARALLEL = {name: name != "ptd" for name in EXPECTED}


# Kills: stacks.py:60 ReplaceFalseWithTrue (ptd's dp_overlap_model_parallel=True) and
# stacks.py:41 ReplaceTrueWithFalse (the Stack default dp_overlap_model_parallel False for the
# five other stacks); expected values from the stacks' citations (table above), not the code.
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_zero0_overlap_under_model_parallelism(name):
    assert STACKS[name].dp_overlap_model_parallel is OVERLAP_MODEL_PARALLEL[name]
    assert stack_options(name).dp_overlap_model_parallel is OVERLAP_MODEL_PARALLEL[name]


# Kills: mutants of the elementwise strings (ptd's "autocast", torchtitan's "llama-ref", the
# Stack default "fused") and of their passing through stack_options; expected values from
# the citations (table above).
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_elementwise_operators_per_stack(name):
    assert STACKS[name].elementwise == ELEMENTWISE[name]
    assert stack_options(name).elementwise == ELEMENTWISE[name]

"""The cost model's picture of the model equals the runtime model, tensor for tensor.

This is what lets predicted model-state memory equal measured memory exactly: the cost
model (torch-free) enumerates the same parameters, with the same shapes and the same
weight-decay groups (which decide ZeRO-1's partition), as ``named_parameters()``.
"""

import pytest

from ptd.cost import params as P
from ptd.specs import ParallelPlan, get_preset


@pytest.mark.parametrize("name", ["tiny", "tiny-gpt", "small", "gpt2", "llama3-8b", "mixtral-8x7b"])
def test_cost_params_equal_runtime_parameters(name):
    from ptd.runtime.model.transformer import build_model
    from ptd.runtime.optim import param_groups

    spec = get_preset(name)
    model = build_model(spec, "meta")
    runtime = {n: tuple(p.shape) for n, p in model.named_parameters()}
    decay_ids = {id(p) for p in param_groups(model, 0.1)[0]["params"]}
    runtime_decay = {n for n, p in model.named_parameters() if id(p) in decay_ids}

    plan = ParallelPlan()
    cost = {}
    for p in P.first_stage_params(spec):
        cost[p.name] = p
    for i in range(spec.n_layers):
        for p in P.layer_params(spec):
            cost[f"layers.{i}.{p.name}"] = p
    for p in P.last_stage_params(spec, not spec.tied_embeddings):
        cost[p.name] = p
    assert {n: p.local_shape(1) for n, p in cost.items()} == runtime
    assert {n for n, p in cost.items() if p.decay} == runtime_decay
    # the runtime holds the model's parameters plus the vocabulary's padding rows (a
    # multiple of 128: GPT-2's 50257 becomes 50304, byte vocabularies of 256 stay)
    pad = {"gpt2": 50304 - 50257}.get(name, 0)
    tensors = 1 if spec.tied_embeddings else 2
    assert P.local_numel(spec, plan, 0) == spec.param_count() + tensors * pad * spec.hidden
    assert sum(p.numel() for p in model.parameters()) == P.local_numel(spec, plan, 0)


# The operator counts the cost model prices at ``op_overhead`` each (ptd.cost.compute's
# OPS_* constants), against a dispatch-mode count of the runtime model, one feature at a time.
_BASE = dict(mlp="gelu", norm="layernorm", position="learned", bias=False, dropout=0.0)
_VARIANTS = {
    "base": {}, "swiglu": {"mlp": "swiglu"}, "rope": {"position": "rope"},
    "rmsnorm": {"norm": "rmsnorm"}, "bias": {"bias": True}, "dropout": {"dropout": 0.1},
    "llama": {"mlp": "swiglu", "norm": "rmsnorm", "position": "rope"},
}


@pytest.mark.parametrize("variant", list(_VARIANTS))
def test_operator_constants_equal_the_runtime_count(variant):
    from ptd.cost.compute import block_ops, output_ops
    from ptd.runtime.measure.opcount import count_ops
    spec = get_preset("tiny").replace(**{**_BASE, **_VARIANTS[variant]})
    got = count_ops(spec)
    assert (got["block_fwd"], got["block_bwd"]) == block_ops(spec)
    assert (got["output_fwd"], got["output_bwd"]) == output_ops(spec)


@pytest.mark.parametrize("sp", [False, True])
def test_dtensor_operator_constants_equal_the_runtime_count(sp, tmp_path):
    import torch.distributed as dist
    from ptd.cost.compute import tp_dtensor_ops
    from ptd.runtime.measure.opcount import count_tp_ops
    spec = get_preset("tiny")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        got = count_tp_ops(spec, sp=sp)
    finally:
        dist.destroy_process_group()
    block, output = tp_dtensor_ops(spec, sp)
    assert (got["block_fwd"], got["block_bwd"]) == block
    assert (got["output_fwd"], got["output_bwd"]) == output

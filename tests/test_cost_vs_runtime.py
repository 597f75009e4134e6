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
    assert {n: p.shape for n, p in cost.items()} == runtime
    assert {n for n, p in cost.items() if p.decay} == runtime_decay
    assert P.local_numel(spec, plan, 0) == spec.param_count()

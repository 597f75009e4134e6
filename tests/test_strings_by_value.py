"""ptd compares strings by value, never by identity.

A spec read from a TOML file or a flag from the command line holds strings that are equal
to ptd's literals (``"gelu"``, ``"bf16"``, ``"megatron"``) but are other objects: CPython
interns the literals of the source, not the strings a parser builds. So ``mlp is "gelu"``
agrees with ``mlp == "gelu"`` in every test that takes its specs from presets (their
literals are interned too) and disagrees for every user. Mutation testing found one such
comparison (the Megatron-LM export's ``norm == "rmsnorm"`` as ``is`` exported RMSNorm
models as LayerNorm; docs/testing.md). Here every string field of the model, plan,
hardware and options is replaced by an equal copy that is not the same object, and the
estimate and every export must not change."""

import dataclasses

import pytest

from ptd.cost.estimate import CostOptions, estimate
from ptd.errors import PtdError
from ptd.planner.export import FORMATS, export
from ptd.specs import ClusterSpec, ParallelPlan, get_preset, load_hardware


def fresh(s: str) -> str:
    out = "".join(list(s))  # built at run time: equal, never the interned literal
    assert out == s and (out is not s or len(s) < 2)
    return out


def freshen(obj):
    """A copy of the dataclass ``obj`` whose string fields (and tuples of strings) are equal
    but new objects."""
    changes = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, str):
            changes[f.name] = fresh(v)
        elif isinstance(v, tuple) and v and all(isinstance(x, str) for x in v):
            changes[f.name] = tuple(fresh(x) for x in v)
    return dataclasses.replace(obj, **changes)


def test_fresh_strings_are_other_objects():
    gelu, bf16 = "gelu", "bf16"
    assert fresh(gelu) is not gelu
    p = freshen(ParallelPlan(dtype=bf16, recompute="full"))
    assert p.dtype == bf16 and p.dtype is not bf16
    assert p == ParallelPlan(dtype="bf16", recompute="full")


# (model preset, plan fields, hardware): every string-valued kind the specs allow at least
# once -- mlp gelu/swiglu, norm layernorm/rmsnorm, position learned/rope, dtype fp32/bf16/
# fp16, recompute none/selective/full, each schedule, tp_mode 1d/2d, MoE, ZeRO 0-3, a CPU
CASES = [
    ("tiny-gpt", dict(dp=2, tp=2, pp=2, zero=1, micro_batch=1, global_batch=8, seq_len=128,
                      dtype="fp16", recompute="selective", schedule="gpipe"), "a100-80g"),
    ("tiny", dict(dp=1, tp=2, pp=2, vpp=2, sp=True, micro_batch=1, global_batch=8, seq_len=128,
                  dtype="bf16", recompute="full", schedule="interleaved-1f1b"), "h100-sxm"),
    ("tiny", dict(dp=2, pp=2, zero=1, micro_batch=1, global_batch=8, seq_len=128, dtype="bf16",
                  schedule="zero-bubble"), "h100-sxm"),
    ("tiny", dict(dp=2, tp=4, tp_mode="2d", micro_batch=2, global_batch=8, seq_len=128,
                  dtype="bf16"), "h100-sxm"),
    ("tiny-moe", dict(dp=4, ep=2, zero=3, micro_batch=1, global_batch=8, seq_len=128,
                      dtype="bf16", recompute="full"), "h100-sxm"),
    ("tiny-moe", dict(dp=2, ep=2, micro_batch=1, global_batch=4, seq_len=128), "cpu"),
    ("tiny", dict(dp=2, zero=2, micro_batch=2, global_batch=8, seq_len=128), "cpu"),
    # a GELU MoE with routing imbalance, priced with fused elementwise passes
    ("tiny-moe:gelu", dict(dp=4, ep=2, micro_batch=1, global_batch=8, seq_len=128, dtype="bf16"),
     "h100-sxm"),
    # a model large enough that memory traffic, not kernel launches, bounds its elementwise
    # passes (the tiny ones are launch-bound on a GPU), priced fused
    ("llama3-8b", dict(dp=8, zero=3, micro_batch=1, global_batch=8, seq_len=4096, dtype="bf16",
                       recompute="selective"), "h100-sxm"),
    ("mixtral-8x7b", dict(dp=8, ep=8, zero=1, micro_batch=1, global_batch=8, seq_len=4096,
                          dtype="bf16", recompute="full"), "h100-sxm"),
    # SwiGLU with biases on a CPU, whose operators are priced one by one
    ("tiny:bias", dict(dp=2, micro_batch=2, global_batch=8, seq_len=128), "cpu"),
]
# (the changes are literals of this file, interned as ptd's are: a value built at run time
# here would make the reference itself a fresh string)
MODEL_CHANGES = {"tiny-moe:gelu": dict(mlp="gelu"), "tiny:bias": dict(bias=True)}
OPTIONS = {"tiny-moe:gelu": CostOptions(moe_imbalance=1.5, elementwise="fused"),
           "llama3-8b": CostOptions(elementwise="fused"),
           "mixtral-8x7b": CostOptions(elementwise="fused")}


@pytest.mark.parametrize("case", range(len(CASES)))
def test_estimate_and_exports_compare_strings_by_value(case):
    name, fields, hw_name = CASES[case]
    model = get_preset(name.split(":")[0]).replace(**MODEL_CHANGES.get(name, {}))
    plan = ParallelPlan(**fields)
    hw = load_hardware(hw_name)
    n = plan.world_size
    opts = OPTIONS.get(name, CostOptions())
    base = estimate(model, ClusterSpec(hw, n, min(n, hw.devices_per_node)), plan, options=opts)
    other = estimate(freshen(model), ClusterSpec(freshen(hw), n, min(n, hw.devices_per_node)),
                     freshen(plan), options=freshen(opts))
    assert other.to_json() == base.to_json()
    for fmt in FORMATS:
        try:
            want = export(base, fmt)
        except PtdError as e:  # a format that cannot express the plan: the same refusal
            with pytest.raises(PtdError) as got:
                export(other, fresh(fmt))
            assert str(got.value) == str(e)
            continue
        assert export(other, fresh(fmt)) == want, fmt

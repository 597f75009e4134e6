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
    # mixture of experts (a routed MLP instead of the dense one), feature by feature
    "moe": {"n_experts": 8, "top_k": 2}, "moe-swiglu": {"n_experts": 4, "top_k": 1, "mlp": "swiglu"},
    "moe-bias": {"n_experts": 8, "top_k": 2, "bias": True},
    "moe-shared": {"n_experts": 8, "top_k": 2, "n_shared_experts": 2},
    "moe-capacity": {"n_experts": 8, "top_k": 2, "capacity_factor": 1.25},
    "moe-all": {"n_experts": 16, "top_k": 4, "mlp": "swiglu", "norm": "rmsnorm", "position": "rope",
                "bias": True, "n_shared_experts": 1, "capacity_factor": 1.5, "dropout": 0.1},
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


def _saved_bytes(spec, seq_len=64, batch=2):
    """Bytes of the tensors block 0 saves for its backward (parameters and its input left
    out), counted once per storage with saved-tensor hooks."""
    import torch
    from ptd.runtime.model.init import materialize
    from ptd.runtime.model.transformer import build_model
    model = build_model(spec, "meta")
    materialize(model, torch.device("cpu"), seed=0)
    rope = (model.rope_cos, model.rope_sin) if model.rope_cos is not None else None
    x = torch.randn(batch, seq_len, spec.hidden, requires_grad=True)
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()} | {x.untyped_storage().data_ptr()}
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in skip:
            seen[st.data_ptr()] = st.nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.layers["0"](x, rope)
    return sum(seen.values())


@pytest.mark.parametrize("moe", [{}, {"mlp": "gelu", "norm": "layernorm", "position": "learned"},
                                 {"n_shared_experts": 2}, {"top_k": 3, "n_experts": 4}])
def test_moe_activations_equal_the_saved_tensors(moe):
    # What a MoE layer keeps beyond the dense block it replaces, priced by cost/memory.py,
    # against the tensors the runtime's layer really saves (fp32, 128 tokens). By hand for
    # tiny-moe (h = F = 64, E = 8, k = 2, SwiGLU): per assignment (3h + 4F + 1) x 4 bytes plus
    # three int64 indices and an fp32 weight = 1,824; per token 8E + 4 = 68; the dense MLP's
    # 4F x 4 = 1,024 no longer kept; per micro-batch 4E (1 + 3) = 128. So 128 tokens:
    # 128 (2 x 1824 + 68 - 1024) + 128 = 344,704 bytes.
    from ptd.cost.memory import activation_bytes_per_layer
    spec = get_preset("tiny-moe").replace(**moe)
    dense = spec.replace(n_experts=0, top_k=0, n_shared_experts=0)
    got = _saved_bytes(spec) - _saved_bytes(dense)
    want = (activation_bytes_per_layer(spec, 64, 2, act_bytes=4)
            - activation_bytes_per_layer(dense, 64, 2, act_bytes=4))
    assert got == want
    if not moe:
        assert got == 128 * (2 * 1824 + 68 - 1024) + 128 == 344_704


@pytest.mark.parametrize("autocast", [False, True])
def test_block_activations_equal_the_saved_tensors_under_autocast(autocast):
    """What a Llama block keeps, fp32 and under bf16 autocast with fp32 weights (ptd's
    runtime), against the tensors it saves on this CPU. Activations only: the weights' bf16
    copies (priced as buffers), the rotary tables (sequence x head_dim) and the norms' per-token
    statistics are left out of both sides, and so is the block's input, which the model
    counts as the first norm's input (the previous block's output)."""
    import torch
    from ptd.cost.memory import activation_bytes_per_layer
    from ptd.runtime.model.init import materialize
    from ptd.runtime.model.transformer import build_model
    spec = get_preset("small")  # SwiGLU, RMSNorm, RoPE, 8 heads / 4 kv heads
    s, b = 64, 3  # 192 tokens: no activation shares a weight's shape (wk is 128 x 256)
    model = build_model(spec, "meta")
    materialize(model, torch.device("cpu"), seed=0)
    rope = (model.rope_cos, model.rope_sin)
    x = torch.randn(b, s, spec.hidden, requires_grad=True)
    shapes = {tuple(p.shape) for p in model.parameters()}
    shapes |= {sh[::-1] for sh in shapes}  # the products' transposed weights
    seen = {}

    def pack(t):
        if t is x or tuple(t.shape) in shapes or t.shape[-1] == 1 or t.shape[0] == 1:
            return t  # the input, weights (and their casts), statistics, rotary tables
        seen[t.untyped_storage().data_ptr()] = t.numel() * t.element_size()
        return t
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model.layers["0"](x, rope)
    got = sum(seen.values())
    ab = 2 if autocast else 4
    want = activation_bytes_per_layer(spec, s, b, act_bytes=ab, fused_norm=False,
                                      autocast=autocast) - 4 * s * b * spec.hidden
    assert got == want
    if autocast:  # by hand, 192 tokens of h 256, q 256, kv 128, F 704: bytes per token
        per_token = (4 * 256            # the second norm's fp32 input
                     + 2 * 4 * 256      # the composite RMSNorm's normalised inputs, fp32
                     + 5 * 2 * 256      # wq, wk, wv, w1, w3 each keep their bf16 input
                     + 2 * (256 + 2 * 128) + 2 * 256  # q, k, v after RoPE; attention output
                     + 4 * 2 * 704      # SwiGLU: w1 and w3 outputs, SiLU, the product
                     + 4 * 8)           # the attention's fp32 log-sum-exp, 8 heads
        assert got == 192 * per_token


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_rms_norm_operators_move_the_bytes_the_count_prices(dtype):
    """``F.rms_norm`` on this CPU runs as operators; the bytes they dispatch (inputs and
    outputs of every operator that is not a view, expanded inputs at their storage's size),
    per element of the stream, are what ``ptd.cost.eager`` prices for one norm: in fp32
    ``COMPOSITE_RMSNORM`` passes, up to the per-row and per-channel tensors (1/h and 1/T of a
    pass each); from bf16 the same fp32 passes and four casts of 2 + 4 bytes (by hand: the
    input up, the output down, the output's gradient up, the input's gradient down)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from ptd.cost.eager import COMPOSITE_RMSNORM

    class Bytes(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not any(r.alias_info is not None for r in func._schema.returns):
                for t in tree_flatten((args, kwargs, out))[0]:
                    if isinstance(t, torch.Tensor):
                        stored = t.untyped_storage().nbytes() // t.element_size()
                        self.total += min(t.numel(), stored) * t.element_size()
            return out

    T, h = 4096, 256
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    x = torch.randn(T, h, dtype=torch_dtype, requires_grad=True)
    w = torch.ones(h, dtype=torch_dtype, requires_grad=True)
    with Bytes() as fwd:
        y = torch.nn.functional.rms_norm(x, (h,), w, 1e-5)
    g = torch.randn_like(y)
    with Bytes() as bwd:
        y.backward(g)
    per_elt = (fwd.total / (T * h), bwd.total / (T * h))
    casts = 0 if dtype == "fp32" else 2 * (2 + 4)
    assert per_elt == pytest.approx((4 * 7 + casts, 4 * 23 + casts), abs=0.2)
    assert COMPOSITE_RMSNORM == (7, 23)
    # the count prices exactly that, kernel by kernel
    from ptd.cost.eager import _norm
    from ptd.specs.model import load_model
    priced = _norm(load_model("tiny"), "eager", True, 4 if dtype == "fp32" else 2)
    assert (sum(v[0] for v in priced.values()), sum(v[1] for v in priced.values())) == \
        pytest.approx(per_elt, abs=0.2)


@pytest.mark.parametrize("variant", list(_VARIANTS))
def test_feed_forward_operator_count_equals_the_runtime_layer(variant):
    # ffn_ops is the feed-forward layer's share of block_ops: what a measured MoE layer
    # (moe_layer_measured) replaces. Counted on the runtime block's own layer, in training
    # mode, on a normalised input as the block gives it.
    import torch

    from ptd.cost.compute import ffn_ops
    from ptd.runtime.measure.opcount import OpCounter
    from ptd.runtime.model.init import materialize
    from ptd.runtime.model.moe import prepare
    from ptd.runtime.model.transformer import build_model
    spec = get_preset("tiny").replace(**{**_BASE, **_VARIANTS[variant]})
    model = build_model(spec, "meta")
    materialize(model, torch.device("cpu"), seed=0)
    prepare(model, 64)
    blk = model.layers["0"]
    with torch.no_grad():
        x = blk.ffn_norm(torch.randn(2, 32, spec.hidden)).requires_grad_()
    with OpCounter() as c:
        y = blk.feed_forward(x)
    fwd = c.total
    g = torch.randn_like(y)
    with OpCounter() as c:
        y.backward(g)
    assert (fwd, c.total) == ffn_ops(spec)

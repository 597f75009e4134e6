"""The runtime model: exact parameter counts, meta construction, seeded init, recompute,
and the optimizer helpers (schedule, global norm, decay groups)."""

import math

import pytest
import torch
import torch.nn.functional as F

from ptd.runtime.model.init import canonical_name, init_plan, materialize, param_seed
from ptd.runtime.model.layers import apply_rope, rope_tables
from ptd.runtime.model.transformer import build_model, lm_loss_sum
from ptd.runtime.optim import clip_grads_, global_grad_norm, lr_at, param_groups
from ptd.specs import OptimConfig, get_preset
from ptd.specs.model import PRESETS


@pytest.mark.parametrize("name", list(PRESETS))
def test_param_count_equals_spec_on_meta(name):
    spec = PRESETS[name]
    m = build_model(spec)  # meta: even 405B costs no memory
    params = list(m.parameters())
    assert all(p.is_meta for p in params)
    # plus the vocabulary's padding rows: up to a multiple of 128 (tp 1), zero for the
    # byte vocabularies (256) and Llama 3's 128256 (= 1002 x 128), 47 rows for GPT-2's 50257
    pad = -(-spec.vocab_size // 128) * 128 - spec.vocab_size
    assert pad == {50257: 47}.get(spec.vocab_size, pad)
    tensors = 1 if spec.tied_embeddings else 2
    assert sum(p.numel() for p in params) == spec.param_count() + tensors * pad * spec.hidden


def _tiny(name="tiny", seed=0, **changes):
    spec = get_preset(name).replace(**changes) if changes else get_preset(name)
    return materialize(build_model(spec), "cpu", seed)


@pytest.mark.parametrize("name", ["tiny", "tiny-gpt"])
def test_forward_shapes_and_initial_loss(name):
    m = _tiny(name)
    x = torch.randint(0, 256, (2, 33))
    logits = m(x[:, :-1])
    assert logits.shape == (2, 32, 256)
    loss = lm_loss_sum(logits, x[:, 1:]) / x[:, 1:].numel()
    assert abs(loss.item() - math.log(256)) < 0.1  # small init: near-uniform predictions


def test_tied_embeddings_survive_materialisation():
    m = _tiny("tiny-gpt")
    assert m.output.weight is m.tok_embeddings.weight
    untied = _tiny("tiny")
    assert untied.output.weight is not untied.tok_embeddings.weight


def test_moe_model_builds_and_runs():
    m = _tiny(n_experts=4, top_k=2)
    assert sum(p.numel() for p in m.parameters()) == m.spec.param_count()
    assert m(torch.randint(0, 256, (2, 8))).shape == (2, 8, 256)


def test_init_is_seeded_by_name_not_by_layout():
    a, b = _tiny(seed=1), _tiny(seed=1)
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb and torch.equal(pa, pb)
    assert not torch.equal(a.layers["0"].attention.wq.weight, _tiny(seed=2).layers["0"].attention.wq.weight)
    # A pipeline-style stage (layers 2-3 only, no embeddings) gets the same tensors.
    stage = build_model(get_preset("tiny"))
    del stage.layers["0"], stage.layers["1"]
    stage.tok_embeddings = None
    materialize(stage, "cpu", 1)
    for name, p in stage.named_parameters():
        assert torch.equal(p, dict(a.named_parameters())[name]), name
    # Different names, different draws; norms ones; wrappers do not change the seed.
    assert not torch.equal(a.layers["0"].attention.wq.weight, a.layers["1"].attention.wq.weight)
    assert torch.equal(a.norm.weight, torch.ones(64))
    assert canonical_name("module.layers.0._orig_mod.attention.wq.weight") == "layers.0.attention.wq.weight"
    assert param_seed(1, "module.norm.weight") == param_seed(1, "norm.weight")


def test_residual_projections_scaled():
    kinds = {n: k for n, _, k in init_plan(build_model(get_preset("tiny")))}
    assert kinds["layers.0.attention.wo.weight"] == "normal_residual"
    assert kinds["layers.0.feed_forward.w2.weight"] == "normal_residual"
    assert kinds["layers.0.attention.wq.weight"] == "normal"
    m = _tiny()
    std = m.layers["0"].feed_forward.w2.weight.std().item()
    assert abs(std / (0.02 / math.sqrt(8)) - 1) < 0.1


def test_rope_rotates_pairs_and_keeps_norm():
    cos, sin = rope_tables(8, 16, 10000.0)
    x = torch.randn(1, 16, 2, 8)
    y = apply_rope(x, cos, sin)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    assert torch.equal(y[:, 0], x[:, 0])  # position 0 is not rotated


def test_gqa_matches_expanded_heads():
    q, k, v = torch.randn(2, 8, 16, 4), torch.randn(2, 4, 16, 4), torch.randn(2, 4, 16, 4)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    b = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                       is_causal=True)
    assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_recompute_gives_identical_gradients(mode):
    x = torch.randint(0, 256, (2, 33))
    grads = []
    for rc in ("none", mode):
        m = _tiny()
        for block in m.layers.values():
            block.set_recompute(rc)
        loss = lm_loss_sum(m(x[:, :-1]), x[:, 1:])
        loss.backward()
        grads.append([p.grad.clone() for p in m.parameters()])
    for g0, g1 in zip(*grads):
        assert torch.allclose(g0, g1, rtol=0, atol=1e-6)


def test_lr_schedule_warmup_then_cosine():
    c = OptimConfig(lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(1, c, 100) == pytest.approx(0.1)
    assert lr_at(10, c, 100) == pytest.approx(1.0)
    assert lr_at(55, c, 100) == pytest.approx(0.55)
    assert lr_at(100, c, 100) == pytest.approx(0.1)
    lrs = [lr_at(s, c, 100) for s in range(10, 101)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_global_norm_and_clipping_plain_tensors():
    ps = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(2))]
    ps[0].grad = torch.tensor([3.0, 0.0, 0.0])
    ps[1].grad = torch.tensor([0.0, 4.0, 0.0, 0.0])  # ps[2] has no gradient
    n = global_grad_norm(ps, torch.device("cpu"))
    assert n.item() == pytest.approx(5.0)
    clip_grads_(ps, 1.0, n)
    assert global_grad_norm(ps, torch.device("cpu")).item() == pytest.approx(1.0, rel=1e-5)


def test_weight_decay_groups():
    m = _tiny("tiny-gpt")
    groups = param_groups(m, 0.1)
    decay = {id(p) for p in groups[0]["params"]}
    assert id(m.layers["0"].attention.wq.weight) in decay
    for p in (m.tok_embeddings.weight, m.pos_embeddings.weight, m.norm.weight,
              m.layers["0"].attention.wq.bias):
        assert id(p) not in decay
    assert groups[1]["weight_decay"] == 0.0


def test_foreach_squared_norm_equals_the_per_tensor_sum():
    # The GPU path (one _foreach_norm per dtype) must give what the per-tensor loop gives:
    # the sum of squares of every element, here written out with math.fsum in float64.
    import math

    from ptd.runtime.optim import squared_norm
    g = torch.Generator().manual_seed(3)
    grads = [torch.randn(7, 5, generator=g), torch.randn(11, generator=g),
             torch.randn(3, 4, generator=g).to(torch.bfloat16)]
    exact = math.fsum(float(x) ** 2 for t in grads for x in t.double().flatten())
    for foreach in (True, False):
        got = float(squared_norm(grads, torch.device("cpu"), foreach=foreach))
        assert got == pytest.approx(exact, rel=1e-5)
    assert float(squared_norm([], torch.device("cpu"), foreach=True)) == 0.0


def test_fused_adamw_only_for_plain_cuda_parameters():
    from ptd.runtime.optim import _fused_ok
    assert not _fused_ok([torch.nn.Parameter(torch.ones(2))])  # CPU keeps the default
    assert not _fused_ok([])

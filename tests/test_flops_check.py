"""The cost model's FLOPs per token equal what FlopCounterMode counts on the runtime model.

Attention is counted: on CPU tensors through formulas registered for the fused CPU kernel
(FlopCounterMode has none and would count 0), on meta tensors through the math path. A
check that attention really is in the count keeps this from passing without it.
"""

import pytest

from ptd.cost.flops import flops_per_token
from ptd.specs import get_preset


@pytest.mark.parametrize("name,device,batch,seq", [
    ("tiny", "cpu", 2, 64),          # real tensors: the fused CPU attention kernel
    ("tiny-gpt", "cpu", 2, 64),
    ("tiny", "meta", 2, 64),         # meta: the math path
    ("llama3-8b", "meta", 1, 4096),  # shapes only, nothing allocated
    ("gpt3-175b", "meta", 1, 2048),
])
def test_cost_model_flops_equal_flop_counter(name, device, batch, seq):
    from ptd.runtime.measure.flop_count import training_flops

    spec = get_preset(name)
    fwd, total = training_flops(spec, batch, seq, device)
    tokens = batch * seq
    expected = flops_per_token(spec, seq)
    # The runtime's output layer has the padded vocabulary's rows (GPT-3's 50257 -> 50304 =
    # 393 x 128): the counter sees 2 h per padding row per token forward, 6 h in all; the
    # model FLOPs (MFU's numerator) count the real vocabulary only.
    pad = {"gpt3-175b": 50304 - 50257}.get(name, 0)
    assert total / tokens == pytest.approx(expected.model + 6 * pad * spec.hidden, rel=1e-9)
    assert fwd / tokens == pytest.approx(expected.forward + 2 * pad * spec.hidden, rel=1e-9)
    # attention is in the count: the model minus its 6N part is exactly 12 L s (H d)
    attention = total / tokens - 6 * spec.matmul_params() - 6 * pad * spec.hidden
    assert attention == pytest.approx(12 * spec.n_layers * seq * spec.q_dim, rel=1e-9)
    assert attention > 0


@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_hardware_flops_with_recompute(recompute):
    from ptd.runtime.measure.flop_count import training_flops

    spec = get_preset("tiny")
    _, total = training_flops(spec, 2, 64, "cpu", recompute=recompute)
    assert total / 128 == pytest.approx(flops_per_token(spec, 64, recompute).hardware, rel=1e-9)


def test_cpu_attention_would_be_missed_without_the_formula():
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from ptd.runtime.measure.flop_count import register_cpu_attention_flops

    q = k = v = torch.randn(1, 2, 16, 8)
    register_cpu_attention_flops()
    with FlopCounterMode(display=False) as counter:
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert counter.get_total_flops() == 2 * 2 * 1 * 2 * 16 * 16 * 8


def test_pytorch_gpu_backward_formula_counts_the_recomputation():
    # Why ptd registers its own backward formula: PyTorch's counts 5 products (it includes
    # the fused kernel recomputing Q K^T), the model needs 4.
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    q = (1, 8, 128, 64)
    kv = (1, 4, 128, 64)
    assert sdpa_backward_flop_count(q, q, kv, kv) == 2.5 * sdpa_flop_count(q, kv, kv)

"""MFU and HFU against worked examples from the papers, numbers written out.

PaLM (Chowdhery et al. 2022, arXiv 2204.02311, App. B): model FLOPs per token
6N + 12 L H Q T; PaLM 540B (N = 540.35e9 parameters, L = 118 layers, H = 48 heads,
Q = 256 head width, T = 2048 tokens) trained at 238.3k tokens/s on 6144 TPU v4 chips of
275 TFLOP/s (bf16 peak): MFU 46.2 %.

Megatron-LM (Narayanan et al. 2021, arXiv 2104.04473, eq. 3): per iteration of a GPT model,
72 B s l h^2 (1 + s/6h + V/12lh) model FLOPs, 96 B s l h^2 (1 + s/6h + V/16lh) with full
recomputation -- so for GPT-3 175B (l 96, h 12288, V 51200 in the paper, s 2048) HFU/MFU is
96 (1 + s/6h + V/16lh) / (72 (1 + s/6h + V/12lh)), written out below.
"""

import pytest

from ptd.cost import metrics as M
from ptd.cost.estimate import estimate
from ptd.cost.flops import flops_per_token
from ptd.specs import ClusterSpec, ParallelPlan, get_preset, load_hardware


def test_palm_540b_mfu_is_46_2_percent():
    # 6N = 6 * 540.35e9 = 3.2421e12; 12 L H Q T = 12*118*48*256*2048 = 3.5635e10
    per_token = 6 * 540.35e9 + 12 * 118 * 48 * 256 * 2048
    assert per_token == pytest.approx(3.27774e12, rel=1e-5)
    # 3.27774e12 * 238.3e3 / (6144 * 275e12) = 7.8108e17 / 1.6896e18 = 0.4623
    assert M.mfu(per_token, 238.3e3, 275e12, 6144) == pytest.approx(0.4623, abs=5e-4)


def test_gpt3_175b_hfu_over_mfu_with_full_recompute():
    # s/6h = 2048/73728 = 0.0277778; V/12lh = 51200/14155776 = 0.0036169;
    # V/16lh = 51200/18874368 = 0.0027127
    model = 72 * (1 + 0.0277778 + 0.0036169)      # 74.26042 (x B s l h^2)
    hardware = 96 * (1 + 0.0277778 + 0.0027127)   # 98.92709
    want = hardware / model                       # 1.33218
    m = get_preset("gpt3-175b").replace(vocab_size=51200)
    fl = flops_per_token(m, 2048, "full", early_stop=False)
    # ptd counts causal-attention and norm FLOPs a little differently: within 1 %
    assert fl.hardware / fl.model == pytest.approx(want, rel=0.01)
    # ... and an estimate's MFU divides the *model* FLOPs, its HFU the hardware FLOPs
    c = ClusterSpec(load_hardware("a100-80g"), 1024)
    p = ParallelPlan(dp=8, tp=8, pp=16, micro_batch=1, global_batch=1536, seq_len=2048,
                     recompute="full", dtype="bf16")
    e = estimate(m, c, p, validate=False)
    peak = c.hardware.peak("bf16") * 1024
    assert e.mfu == pytest.approx(e.flops.model * e.tokens_per_s / peak, rel=1e-12)
    assert e.hfu == pytest.approx(e.flops.hardware * e.tokens_per_s / peak, rel=1e-12)
    # ptd's runtime recomputes with PyTorch's early-stopping checkpoint, which skips each
    # block's MLP down projection (2 * 4h^2 per token per layer, i.e. 8 in units of
    # l h^2): (98.92709 - 8) / 74.26042 = 1.22444. MFU computed as HFU would give 1.
    assert e.hfu / e.mfu == pytest.approx((hardware - 8) / model, rel=0.01)

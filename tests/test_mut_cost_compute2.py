"""Tests that bite mutants of ptd.cost.compute left alive by the sample of seed 20261129
(``scripts/mutation_sample.py sample ... --n 30 --seed 20261129``).

Each expected value is worked out by hand in the comments: operator counts from the OPS_*
constants (the module's specification, themselves checked against the runtime's dispatch
count in tests/test_cost_vs_runtime.py), times from the roofline formulas of the module's
docstring."""

from __future__ import annotations

import pytest

from ptd.cost import compute as C

from test_mut_cost_compute import GELU_LN, _hw, _model  # the same small model and device




# Catches: compute.py:95 ``shared_bias = ... if model.bias else 0`` with the 0 replaced
# (-1 or 1): a shared expert WITHOUT biases must add exactly OPS_MOE_SHARED's backward count,
# no bias-gradient sums. (The existing MoE op-count test only has shared experts with biases.)
# By hand from the constants:
#   swiglu/rope/rmsnorm, no bias: OPS_BLOCK_BASE (39, 76) + SWIGLU (5, 12) + ROPE (24, 14)
#   + RMSNORM (12, 30) = (80, 132); OPS_MOE swiglu (44, 37) -> (124, 169); one shared
#   expert OPS_MOE_SHARED swiglu (9, 26) -> (133, 195).
#   gelu/learned/layernorm, no bias: (39, 76) + OPS_MOE gelu (45, 41) = (84, 117); two
#   shared experts 2 * (6, 16) -> (96, 149).
def test_block_ops_moe_shared_experts_without_bias():
    m = _model(n_experts=4, top_k=2, n_shared_experts=1)
    assert C.block_ops(m) == (133, 195)
    g = _model(**GELU_LN, n_experts=8, top_k=2, n_shared_experts=2)
    assert C.block_ops(g) == (96, 149)
    # and with biases (a control on the other branch): gelu, 6 linears * 3 = 18 backward,
    # routed experts' bias forward 3 * 2 matrices = 6, each shared expert 3 * 2 = 6 more
    # backward: (39, 76 + 18) + (45, 41) = (84, 135); + 6 fwd = (90, 135);
    # + 2 * (6, 16 + 6) = (102, 179)
    assert C.block_ops(g.replace(bias=True)) == (102, 179)


# Catches: compute.py:430 ``2 * io / bw`` -> ``2 // io / bw`` (the flash backward's memory
# term dropped: 2 // io is 0 for io > 2), and any other change of the backward's I/O term.
# A memory-bound block (rate 1e12 FLOP/s, bandwidth 1e6 B/s: every product and the
# attention kernel are bound by bytes). The docstring's rules: each forward product's
# backward is two products (twice its bytes), memory-bound operators move twice the
# forward's bytes, and the fused attention reads Q, K, V and writes O forward, twice that
# backward -- so the whole block's backward is exactly twice its forward.
# Bytes by hand (fp32, h 64, q = kv 64, F 128, gelu, 8 tokens, tp 1):
#   q (8x64)@(64x64): 4*(512 + 4096 + 512) = 20480; k and v: 2 * 20480 = 40960; o: 20480;
#   up (8x64)@(64x128): 4*(512 + 8192 + 1024) = 38912; down (8x128)@(128x64): 38912
#   -> 159744 B = 0.159744 s
#   elementwise (two norms 4h, residuals 6h, transposes 2(q + 2kv) + 2q, GELU 2F per token):
#   (256 + 384 + 512 + 256) * 8 * 4 = 45056 B = 0.045056 s
#   flash I/O 4 * 8 * (2*64 + 2*64) = 8192 B = 0.008192 s (FLOPs 8192 / (1e12 * 0.5): nil)
#   forward 0.159744 + 0.045056 + 0.008192 = 0.212992 s; backward 2 * 0.159744
#   + 2 * 0.045056 + 2 * 0.008192 = 0.425984 s
def test_block_time_flash_backward_memory_bound():
    m = _model(**GELU_LN)
    hw = _hw(attention_efficiency=0.5)
    bt = C.block_time(m, hw, 8, 1, 1, False, "fp32", 1e12, bw=1e6, overhead=0.0)
    assert bt.attention_forward == pytest.approx(0.008192, rel=1e-9)
    assert bt.forward == pytest.approx(0.212992, rel=1e-9)
    assert bt.backward == pytest.approx(0.425984, rel=1e-9)


def test_a_one_column_or_one_row_product_is_still_a_kernel_and_an_empty_one_is_not():
    # On a GPU's shape model a product pays its launch. One output column (a matrix-vector
    # product) or one row (one token) is still a kernel: shape-model time plus the launch,
    # at least its bytes' time plus the launch. No columns at all launches nothing: its
    # bytes alone.
    from ptd.cost.compute import Gemm, gemm_time
    from ptd.specs import load_hardware
    hw = load_hardware("h100-sxm")
    assert hw.kernel_launch > 0 and hw.sm_count
    rate, bw = hw.peak("bf16"), hw.effective_memory_bandwidth
    one = gemm_time(Gemm(4096, 1, 4096), rate, bw, 2, hw, "bf16")
    assert one >= 2 * (4096 * 4096 + 4096 + 4096) / bw + hw.kernel_launch
    row = gemm_time(Gemm(1, 4096, 4096), rate, bw, 2, hw, "bf16")  # one token
    assert row >= 2 * (4096 * 4096 + 4096 + 4096) / bw + hw.kernel_launch
    empty = gemm_time(Gemm(4096, 0, 4096), rate, bw, 2, hw, "bf16")
    assert empty == 2 * 4096 * 4096 / bw

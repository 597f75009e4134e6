"""Tests that bite mutants of ptd.cost.compute (mutation sample seed 20261127).

Every expected value is worked out by hand in the comments from the formulas in
ptd.cost.compute's docstrings and the OPS_* operator counts (constants of the module, taken
as its specification)."""

from __future__ import annotations

import math

import pytest

from ptd.cost import compute as C
from ptd.specs.hardware import HardwareSpec, LinkSpec
from ptd.specs.model import ModelSpec


def _model(**kw) -> ModelSpec:
    base = dict(name="t", n_layers=2, hidden=64, n_heads=4, n_kv_heads=4, ffn_hidden=128,
                vocab_size=1000, max_seq_len=128)
    base.update(kw)
    return ModelSpec(**base)


def _hw(**kw) -> HardwareSpec:
    link = LinkSpec(bandwidth=1e9, latency=1e-6)
    base = dict(name="h", peak_flops={"fp32": 1e12, "bf16": 1e12}, memory_bytes=1e9,
                memory_bandwidth=1e9, intra_node=link, inter_node=link)
    base.update(kw)
    return HardwareSpec(**base)


GELU_LN = dict(mlp="gelu", norm="layernorm", position="learned")


# ------------------------------------------------------------------ operator counts
def test_block_ops_features():
    assert C.block_ops(_model(**GELU_LN)) == (39, 76)  # OPS_BLOCK_BASE
    # swiglu + rope + rmsnorm: 39+5+24+12 = 80, 76+12+14+30 = 132
    assert C.block_ops(_model()) == (80, 132)
    # gelu with biases: 6 linears * 3 backward ops = 18 -> 94
    assert C.block_ops(_model(**GELU_LN, bias=True)) == (39, 94)
    # dropout: +43, +30
    assert C.block_ops(_model(**GELU_LN, dropout=0.1)) == (82, 106)


def test_block_ops_moe():
    m = _model(bias=True, n_experts=4, top_k=2, n_shared_experts=1, capacity_factor=1.25)
    # dense swiglu/rope/rmsnorm (80, 132), biases 7 linears*3 -> b 153
    # OPS_MOE swiglu (44, 37) -> (124, 190); expert bias fwd 3*3 -> f 133
    # one shared expert (9, 26 + 3*3 bias) -> (142, 225); capacity (12, 0) -> (154, 225)
    assert C.block_ops(m) == (154, 225)
    g = _model(**GELU_LN, n_experts=4, top_k=2)
    # (39, 76) + OPS_MOE gelu (45, 41) = (84, 117)
    assert C.block_ops(g) == (84, 117)


def test_tp_dtensor_and_output_ops():
    # swiglu, no bias, no sp: 7 linears: 7*4 = 28, 7*9 = 63; output OPS_TP_OUTPUT
    assert C.tp_dtensor_ops(_model(), False) == ((28, 63), (8, 14))
    # gelu with bias and sp: 6 linears: 24+14 = 38, 6*(9+3)+39 = 111; OPS_TP_SP_OUTPUT
    assert C.tp_dtensor_ops(_model(**GELU_LN, bias=True), True) == ((38, 111), (15, 32))
    assert C.output_ops(_model(**GELU_LN)) == (10, 18)
    # rmsnorm adds half of OPS_RMSNORM: 12//2 = 6, 30//2 = 15
    assert C.output_ops(_model()) == (16, 33)


# ------------------------------------------------------------------ products
def test_gemm_flops():
    assert C.Gemm(2, 3, 4, 5).flops == 240.0  # 2*2*3*4*5


def test_shape_efficiency_tiles_waves_fill():
    # 256x128 on one SM: the 256x128 tile fills it exactly (1.0); k/(k+128) = 128/256
    assert C.shape_efficiency(256, 128, 128, 1) == pytest.approx(0.5)
    # 128x128, 4 SMs: 256x128 tile: 1 tile, 16384/(4*32768) = 0.125; 128x128: 0.93/4 =
    # 0.2325; 128x64: 2 tiles, 1 wave, 0.8*16384/(4*8192) = 0.4 -> best 0.4; * 384/512
    assert C.shape_efficiency(128, 128, 384, 4) == pytest.approx(0.3)
    # a batch of 3 on 2 SMs: 256x128: 3 tiles, 2 waves, 3*32768/(2*2*32768) = 0.75;
    # 128x128: 6 tiles, 3 waves, 0.93*98304/(3*2*16384) = 0.93; 128x64: 12 tiles, 6 waves,
    # 0.8*98304/(6*2*8192) = 0.8 -> 0.93 * 0.5
    assert C.shape_efficiency(256, 128, 128, 2, 3) == pytest.approx(0.465)


def test_gemm_time_roofline_without_hw():
    g = C.Gemm(4, 4, 4)  # flops 128; bytes 2*(16+16+16) = 96
    assert C.gemm_time(g, 1.0, 1.0, 2) == 128.0      # compute bound
    assert C.gemm_time(g, 1.0, 0.5, 2) == 192.0      # 96/0.5: memory bound
    assert C.gemm_time(C.Gemm(4, 4, 4, 2), 1.0, 0.25, 2) == 768.0  # 192 bytes / 0.25


def test_gemm_time_shape_model_and_measured_sweep():
    g = C.Gemm(128, 128, 384)  # flops 2*128*128*384 = 12582912
    hw = _hw(sm_count=4, kernel_launch=1e-6)
    # efficiency 0.3 (above): 12582912/(1e12*0.3) = 4.194304e-5, + launch 1e-6
    assert C.gemm_time(g, 1e12, 1e12, 2, hw, "bf16") == pytest.approx(4.294304e-5)
    # bytes 2*(49152+49152+16384) = 229376 over bw 1e6 = 0.229376 s: memory bound + launch
    assert C.gemm_time(g, 1e12, 1e6, 2, hw, "bf16") == pytest.approx(0.229376 + 1e-6)
    hwm = _hw(sm_count=4, kernel_launch=1e-6, gemm_shapes_measured={"bf16": {"128x128x384": 0.5}})
    # measured fraction 0.5: 12582912/0.5e12 = 2.5165824e-5; the sweep's time already holds
    # the product's launch (timed back to back from Python): none added
    assert C.gemm_time(g, 1e12, 1e12, 2, hwm, "bf16") == pytest.approx(2.5165824e-5)


def test_shape_fraction_idw():
    hw = _hw(gemm_shapes_measured={"bf16": {"2x2x2": 0.2, "8x8x8": 0.8}})
    assert C.shape_fraction(hw, "bf16", 2, 2, 2) == pytest.approx(0.2)   # measured point
    # (4,4,4) -> log2 (2,2,2): squared distance 3 to both -> mean 0.5
    assert C.shape_fraction(hw, "bf16", 4, 4, 4) == pytest.approx(0.5)
    # (2,2,4) -> (1,1,2): d 1 to (1,1,1), 4+4+1 = 9 to (3,3,3): (0.2 + 0.8/9)/(1 + 1/9) = 0.26
    assert C.shape_fraction(hw, "bf16", 2, 2, 4) == pytest.approx(0.26)
    assert C.shape_fraction(hw, "fp32", 2, 2, 2) is None
    assert C.shape_fraction(hw, "bf16", 0.5, 2, 2) is None


def test_attention_fraction_interpolates_in_log_seq():
    hw = _hw(attention_efficiency=0.7, attention_shapes_measured={
        "bf16": {"1x8x128x64": 0.4, "1x8x512x64": 0.6, "1x8x256x32": 0.9}})
    # head 64: points (log2 128 = 7, 0.4), (9, 0.6); s = 256 -> x = 8: 0.4 + 0.2 * 1/2
    assert C.attention_fraction(hw, "bf16", 64, 256) == pytest.approx(0.5)
    assert C.attention_fraction(hw, "bf16", 64, 512) == pytest.approx(0.6)
    assert C.attention_fraction(hw, "bf16", 64, 64) == pytest.approx(0.4)    # below: nearest
    assert C.attention_fraction(hw, "bf16", 64, 4096) == pytest.approx(0.6)  # beyond: nearest
    assert C.attention_fraction(hw, "bf16", 32, 64) == pytest.approx(0.9)
    # head dimensions not measured: linear in log2 d between the nearest measured ones at
    # this length (sqrt(32 * 64): halfway between 0.9 and head 64's 0.5 at s = 256), the
    # nearest measured one beyond them; a dtype without shapes: attention_efficiency
    assert C.attention_fraction(hw, "bf16", math.sqrt(32 * 64), 256) == pytest.approx(0.7)
    assert C.attention_fraction(hw, "bf16", 128, 256) == pytest.approx(0.5)
    assert C.attention_fraction(hw, "bf16", 8, 4096) == pytest.approx(0.9)
    assert C.attention_fraction(hw, "fp32", 64, 256) == 0.7


def test_busy_rate_and_overlap_without_sms():
    # free 4 of 8: 4/8 * shape_efficiency(128,128,384,4) = 0.5 * 0.3
    assert C.busy_rate(C.Gemm(128, 128, 384), 8, 4) == pytest.approx(0.15)
    bt = C.BlockTime(1.0, 2.0, 0.1)
    assert C.overlap_loss(_model(), _hw(), 8, 1, 1, "bf16", 1e12, 1e12, bt) == 0.0
    assert C.overlap_loss(_model(), _hw(sm_count=4), 8, 1, 1, "bf16", 1e12, 1e12, bt) == 0.0


def test_block_gemms_dense_tp2():
    m = _model(n_kv_heads=2)  # head_dim 16, q 64, kv 32, swiglu
    lin, attn = C.block_gemms(m, 10, 5, 2, 2)
    assert lin == [C.Gemm(10, 32, 64), C.Gemm(10, 16, 64, 2), C.Gemm(10, 64, 32),
                   C.Gemm(10, 64, 64, 2), C.Gemm(10, 64, 64)]
    # heads per rank 2*4/2 = 4
    assert attn == [C.Gemm(5, 5, 16, 4), C.Gemm(5, 16, 5, 4)]


def test_block_gemms_moe():
    m = _model(**GELU_LN, n_experts=4, top_k=2, n_shared_experts=1)
    lin, _ = C.block_gemms(m, 8, 8, 1, 1)
    # share 2/4: 4 tokens per expert; 4 experts; one shared gelu MLP
    assert lin == [C.Gemm(8, 64, 64), C.Gemm(8, 64, 64, 2), C.Gemm(8, 64, 64),
                   C.Gemm(8, 4, 64), C.Gemm(4, 128, 64, 4), C.Gemm(4, 64, 128, 4),
                   C.Gemm(8, 128, 64, 1), C.Gemm(8, 64, 128, 1)]


# ------------------------------------------------------------------ memory-bound bytes
def test_elementwise_bytes_dense():
    m = _model(n_kv_heads=2)  # h 64, q 64, kv 32, f 128, swiglu, rope
    # per token: norms+adds 10h = 640; rope 6*96/2 = 288; transposes (2*(64+64)+128)/2 = 192;
    # swiglu 5*128/2 = 320 -> 1440; * 10 tokens * 2 bytes
    assert C.elementwise_bytes_fwd(m, 10, 2, False, 2) == pytest.approx(28800)
    # sp: 640/2 = 320 -> 1120 * 20
    assert C.elementwise_bytes_fwd(m, 10, 2, True, 2) == pytest.approx(22400)
    # dropout: + 2*10*64*(2*2+1) = 6400
    assert C.elementwise_bytes_fwd(m.replace(dropout=0.1), 10, 2, False, 2) == pytest.approx(35200)


def test_elementwise_bytes_moe():
    m = _model(**GELU_LN, n_experts=4, top_k=2, n_shared_experts=1)
    # routed 2*(2*128 + 6*64) = 1280; 640 + transposes 2*(64+128)+128 = 512 + gelu 2*128
    # (one shared expert) = 1408; + 1280 = 2688 per token * 10 * 2
    assert C.elementwise_bytes_fwd(m, 10, 1, False, 2) == pytest.approx(53760)


def test_small_helpers():
    hw = _hw(kernel_launch=0.2)
    assert C.dispatch_floor(1.0, 10, hw) == pytest.approx(2.0)  # 10 * 0.2
    assert C.dispatch_floor(3.0, 10, hw) == 3.0
    m = _model()
    assert C.norm_bytes_fwd(m, 10, 2, True, 2) == 2560.0   # 4*64/2*10*2
    assert C.norm_bytes_fwd(m, 10, 2, False, 2) == 5120.0
    bt = C.BlockTime(10.0, 20.0, 3.0, 2.0)
    assert bt.recompute("full") == 8.0
    assert bt.recompute("full", early_stop=False) == 10.0
    assert bt.recompute("selective") == 3.0
    assert bt.recompute("none") == 0.0
    # 2*4/2 heads * 8*8 = 256 scores; 2*2 bytes each; dropout adds 2*2+1
    assert C.scores_bytes_fwd(m, 8, 2, 2, 2) == 1024.0
    assert C.scores_bytes_fwd(m.replace(dropout=0.1), 8, 2, 2, 2) == 2304.0


def test_optimizer_time():
    hw = _hw(host_bandwidth=8000.0)
    # 32 bytes * 1000 / 1000 = 32 s; 10 tensors * 16 ops * 0.01 = 1.6
    assert C.optimizer_time(1000, 10, hw, bw=1000.0, overhead=0.01) == pytest.approx(33.6)
    assert C.optimizer_time(1000, 10, hw, bw=1000.0, per_tensor=0.5) == pytest.approx(37.0)
    # offload: + 8*1000/8000 = 1
    assert C.optimizer_time(1000, 10, hw, offload=True, bw=1000.0, per_tensor=0.5) == pytest.approx(38.0)
    # a measured cost per parameter replaces the bytes: 1000 * 0.002 = 2 s, + 10 * 0.5
    assert C.optimizer_time(1000, 10, hw, bw=1000.0, per_tensor=0.5, per_param=0.002) == \
        pytest.approx(7.0)


# ------------------------------------------------------------------ whole phases
def test_output_time():
    m = _model(**GELU_LN)
    hw = _hw()
    # V padded to 1024; fp32; Gemm(10, 1024, 64): 1310720 flops / 1e6 = 1.31072 s
    # (bytes 4*(640+65536+10240) = 305664 -> 0.305664 s); Megatron's cross-entropy on
    # 10240 fp32 logits, 32 B each forward (max 4, subtract 8, exp 8, sum 4, divide 8) and
    # 8 backward (product 8): 327680 and 81920 B; norm 2*4*10*64 = 5120 B;
    # fwd 1.31072 + (327680+5120)/1e6; bwd 2.62144 + (81920+10240)/1e6
    f, b = C.output_time(m, hw, 10, 1, "fp32", 1e6, bw=1e6, overhead=0.0)
    assert (f, b) == (pytest.approx(1.64352), pytest.approx(2.7136))
    # ops (10, 18) at 1 ms each
    f, b = C.output_time(m, hw, 10, 1, "fp32", 1e6, bw=1e6, overhead=1e-3)
    assert (f, b) == (pytest.approx(1.65352), pytest.approx(2.7316))
    # tp 2: V padded to a multiple of 256 -> 1024, 512 per rank: gemm 0.65536 s, loss
    # 163840 / 40960 B; fwd 0.65536 + 0.16384 + 0.00512 + 8*0.1; bwd 1.31072 + 0.04096 +
    # 0.01024 + 14*0.1
    f, b = C.output_time(m, hw, 10, 2, "fp32", 1e6, bw=1e6, overhead=0.0, dtensor_overhead=0.1)
    assert (f, b) == (pytest.approx(1.62432), pytest.approx(2.76192))
    # bf16 logits add the casts to and from fp32 (6 B each way): 38 and 14 B a logit;
    # Gemm bytes 2*(640+65536+10240) = 152832, the rate bound still the larger
    f, b = C.output_time(m, hw, 10, 1, "bf16", 1e6, bw=1e6, overhead=0.0)
    assert (f, b) == (pytest.approx(1.31072 + (38 * 10240 + 2560) / 1e6),
                      pytest.approx(2.62144 + (14 * 10240 + 5120) / 1e6))


def test_block_time_flash_and_scores():
    m = _model(**GELU_LN)  # h 64, q=kv 64, f 128, gelu, head_dim 16
    hw = _hw(attention_efficiency=0.5)
    # seq 8, batch 1, fp32, rate = bw = 1e6. Products (all compute bound):
    # q 65536 + kv 131072 + o 65536 + up 131072 + down 131072 flops -> t_lin 0.524288 s
    # elementwise: (640 + 512 + 256) * 8 tokens * 4 B = 45056 B -> 0.045056 s
    # flash: scores products 2 * 2*8*8*16*4 = 16384 flops, half = 8192, at 0.5 -> 0.016384 s
    # (io 4*8*256 = 8192 B -> 0.008192); backward max(2.5 * 0.016384, 0.016384) = 0.04096
    bt = C.block_time(m, hw, 8, 1, 1, False, "fp32", 1e6, bw=1e6, overhead=0.0)
    assert bt.forward == pytest.approx(0.524288 + 0.016384 + 0.045056)
    assert bt.backward == pytest.approx(2 * 0.524288 + 0.04096 + 2 * 0.045056)
    assert bt.attention_forward == pytest.approx(0.016384)
    assert bt.last_matmul_forward == pytest.approx(0.131072)
    # unfused: products 2 * 8192 flops -> 0.016384 s, + scores 256 * 8 B -> 0.002048 s;
    # backward attention twice that; ops (39, 76) at 1 ms; last product + 1 ms
    bt = C.block_time(m, hw, 8, 1, 1, False, "fp32", 1e6, attention="scores", bw=1e6,
                      overhead=1e-3)
    assert bt.forward == pytest.approx(0.524288 + 0.018432 + 0.045056 + 0.039)
    assert bt.backward == pytest.approx(2 * 0.524288 + 0.036864 + 2 * 0.045056 + 0.076)
    assert bt.last_matmul_forward == pytest.approx(0.132072)


def test_block_time_gpu_norms_slower_than_copy():
    m = _model(**GELU_LN)
    # a one-point shape sweep gives every product fraction 1.0 (the nearest point), launch 0:
    # the products cost as above; sm_count > 0 adds the norms' slowdown: norm bytes
    # 4*64*8*4 = 8192 -> 0.008192 s, times (2.98/2.02 - 1) (copy vs rms_norm bandwidth)
    hw = _hw(attention_efficiency=0.5, sm_count=4,
             gemm_shapes_measured={"fp32": {"8x64x64": 1.0}})
    extra = 0.008192 * (2.98 / 2.02 - 1)
    bt = C.block_time(m, hw, 8, 1, 1, False, "fp32", 1e6, bw=1e6, overhead=0.0)
    assert bt.forward == pytest.approx(0.524288 + 0.016384 + 0.045056 + extra)
    assert bt.backward == pytest.approx(2 * 0.524288 + 0.04096 + 2 * (0.045056 + extra))

"""ptd.cost.eager priced by hand where tests/test_cost_eager.py does not reach: GELU and
dropout, learned positions, tensor and sequence parallelism at tp 3 (a lost ``/ tp``
shows), fp16 and fp32, mixture-of-experts with
and without shared experts, the Llama reference norms under sequence parallelism and in fp32,
and the output layer in each dtype.

Every expected value is summed from the module docstring's per-token counts (the forward /
backward bytes of each operator, ``c`` the compute dtype's bytes, ``r`` the residual
stream's), written out term by term; the figures are chosen so that no two terms coincide
(hidden 6 or 8, FFN 12 or 6, tp 2 or 3, tokens 3, 5 or 7); every plan shape is one
``ParallelPlan`` validation accepts (tp divides the heads and the FFN width).

Written from the surviving mutants of ``scripts/mutation src/ptd/cost/eager.py``.
"""
import pytest

from ptd.cost import eager as E
from ptd.specs.model import ModelSpec


def exact(x):
    return pytest.approx(x, rel=1e-12, abs=0)


# GPT-style: GELU, LayerNorm, learned positions, biases, dropout; hidden 6, three heads of 2,
# FFN 12, vocabulary 200 (padded to 256 at tp 1, to 384 at tp 3).
GPT = ModelSpec(name="g", n_layers=1, hidden=6, n_heads=3, n_kv_heads=3, ffn_hidden=12,
                vocab_size=200, max_seq_len=16, mlp="gelu", norm="layernorm",
                position="learned", tied_embeddings=False, bias=True, dropout=0.1)

# Mixture of experts: SwiGLU, rope, GQA (four query heads of 2, two K/V heads: q 8, kv 4),
# hidden 8, FFN 6, 4 experts, top 3, 2 shared experts.
MOE = ModelSpec(name="m", n_layers=1, hidden=8, n_heads=4, n_kv_heads=2, ffn_hidden=6,
                vocab_size=128, max_seq_len=16, mlp="swiglu", norm="rmsnorm", position="rope",
                n_experts=4, top_k=3, n_shared_experts=2)


def test_dtypes_residual_stream_is_fp32_under_autocast_only():
    assert E.dtypes("bf16", "autocast") == (2, 4)
    assert E.dtypes("fp16", "autocast") == (2, 4)
    assert E.dtypes("fp32", "autocast") == (4, 4)
    assert E.dtypes("fp8", "autocast") == (1, 4)
    assert E.dtypes("bf16", "eager") == (2, 2)
    assert E.dtypes("fp16", "llama-ref") == (2, 2)
    assert E.dtypes("fp8", "eager") == (1, 1)
    with pytest.raises(ValueError, match="known: eager, llama-ref, autocast"):
        E.dtypes("fp32", "fused")  # fused kernels are not priced op by op


def test_gelu_dropout_block_fp16_autocast_tp3_sequence_parallel():
    # c = 2 (fp16), r = 4 (autocast), a cast r + c = 6. tp 3 with sequence parallelism: the
    # stream hs = 6 / 3 = 2 wide; q = kv = 6 / 3 = 2; F = 12 / 3 = 4; one linear (w1) reads the
    # second norm, so 3 + 1 = 4 linears cast their (gathered, 6 wide) input.
    # Forward, per token:
    #   norms        2 x (2r) x hs   = 2 x 8 x 2        = 32
    #   residual     2 x (2r + c) x hs = 2 x 10 x 2     = 40
    #   input casts  4 x 6 x h       = 4 x 6 x 6        = 144
    #   output copy  2c x q          = 4 x 2            = 8
    #   rope         none (learned positions)
    #   GELU         2c x F          = 4 x 4            = 16
    #   dropout      2 x hs x (2c + 1) = 2 x 2 x 5      = 20
    #   sum          260
    # Weights cast once per forward, per tp rank: h (2q + 2kv) + 2 h F
    #   = 6 x (4 + 4) + 2 x 6 x 4 = 48 + 48 = 96 elements, x (r + c) = 6: 576 bytes.
    # Backward, per token:
    #   norms        2 x 5r x hs     = 2 x 20 x 2       = 80
    #   residual     2 x (cast + 3r) x hs = 2 x 18 x 2  = 72
    #   input casts  4 x 6 x 6                          = 144
    #   summed grads q+k+v: two sums of 3r over h = 2 x 12 x 6 = 144 (GELU: w1 alone, none)
    #   GELU         3c x F          = 6 x 4            = 24
    #   dropout      2 x 2 x 5                          = 20
    #   sum          484
    assert E.weight_cast_bytes(GPT, 3, "fp16", "autocast") == exact(576)
    f, b = E.block_bytes(GPT, 7, 3, True, "fp16", "autocast")
    assert f == exact(7 * 260 + 576)   # 2396
    assert b == exact(7 * 484 + 576)   # 3964


def test_gelu_dropout_block_bf16_eager_tp1():
    # c = r = 2, no casts; hs = h = 6, q = kv = 6, F = 12.
    # Forward per token: norms 2 x 4 x 6 = 48, residual 2 x 6 x 6 = 72, output copy 4 x 6 = 24,
    #   GELU 4 x 12 = 48, dropout 2 x 6 x 5 = 60: 252.
    # Backward per token: norms 2 x 10 x 6 = 120, residual 2 x (0 + 6) x 6 = 72, q+k+v's two
    #   sums 2 x 3c x h = 2 x 6 x 6 = 72, GELU 6 x 12 = 72, dropout 60: 396.
    assert E.weight_cast_bytes(GPT, 1, "bf16", "eager") == 0
    assert E.block_bytes(GPT, 5, 1, False, "bf16", "eager") == (5 * 252, 5 * 396)


def test_gelu_dropout_block_tp3_without_sequence_parallelism():
    # As the tp 3 case above but the stream is whole (hs = 6), bf16 eager (c = r = 2):
    # forward per token: norms 2 x 4 x 6 = 48, residual 2 x 6 x 6 = 72, copy 4 x 2 = 8,
    #   GELU 4 x 4 = 16, dropout 2 x 6 x 5 = 60: 204;
    # backward: norms 120, residual 72, summed 72 (over the whole h), GELU 6 x 4 = 24,
    #   dropout 60: 348.
    f, b = E.block_bytes(GPT, 3, 3, False, "bf16", "eager")
    assert f == exact(3 * 204)
    assert b == exact(3 * 348)


def test_moe_block_bf16_autocast_tp2():
    # c = 2, r = 4, cast 6; tp 2 without sp: hs = h = 8, q = 8/2 = 4, kv = 4/2 = 2; the dense
    # MLP path is the 2 shared experts, F = 6 x 2 / 2 = 6; SwiGLU: w1 and w3 read the second
    # norm, so 5 linears cast their input.
    # Forward per token:
    #   norms 2 x 8 x 8 = 128; residual 2 x 10 x 8 = 160; casts 5 x 6 x 8 = 240;
    #   output copy 4 x 4 = 16; rope 10c (q + kv) = 20 x 6 = 120; SwiGLU 5c F = 10 x 6 = 60;
    #   routed experts, per assignment the activation over the expert's FFN (5c x 6 = 60) and
    #   6h elements of gather, weighting and index_add (6 x 8 x 2 = 96), top 3: 3 x 156 = 468
    #   sum 1192
    # Backward per token:
    #   norms 2 x 20 x 8 = 320; residual 2 x 18 x 8 = 288; casts 240; summed gradients, q+k+v
    #   two and gate+up one, 3 x 3r x h = 3 x 12 x 8 = 288; rope 120; SwiGLU 9c F = 18 x 6
    #   = 108; routed twice the forward's 936; sum 2300
    # Weights cast: h (2q + 2kv) + 3 h F = 8 x 12 + 3 x 8 x 6 = 96 + 144 = 240, and every
    #   routed expert's three matrices 4 x 3 x 8 x 6 = 576: 816 elements x 6 = 4896 bytes.
    assert E.weight_cast_bytes(MOE, 2, "bf16", "autocast") == 4896
    f, b = E.block_bytes(MOE, 3, 2, False, "bf16", "autocast")
    assert f == 3 * 1192 + 4896
    assert b == 3 * 2300 + 4896


def test_moe_without_shared_experts_llama_ref_sequence_parallel():
    # No shared experts: no dense MLP path (F = 0). llama-ref in bf16: c = r = 2, no casts;
    # tp 2 with sp: hs = 4, q = 4, kv = 2 (repeated to the query heads).
    # Forward per token:
    #   norms 2 x 4 x 4 = 32, replaced by the reference norm's 36 per element: + 2 x (36 - 4)
    #   x 4 = 256; residual 2 x 6 x 4 = 48; output copy 4 x 4 = 16; repeat_kv 2c (kv + q)
    #   = 4 x 6 = 24; rope 20 x 6 = 120; SwiGLU over F = 0: 0; routed 3 x (5 x 2 x 6 + 6 x 8
    #   x 2) = 468; sum 964
    # Backward per token:
    #   norms 2 x 10 x 4 = 80, + 2 x (68 - 10) x 4 = 464; residual 2 x 6 x 4 = 48; summed
    #   gradients 3 x 3c x h = 3 x 6 x 8 = 144; repeat_kv 24; rope 120; routed 936; sum 1816
    one = MOE.replace(n_shared_experts=0)
    assert E.weight_cast_bytes(one, 2, "bf16", "llama-ref") == 0
    assert E.block_bytes(one, 1, 2, True, "bf16", "llama-ref") == (964, 1816)
    # the cast weights of that model under autocast: h (2q + 2kv) = 96 and the routed
    # experts' 576 (no dense MLP), x 6
    assert E.weight_cast_bytes(one, 2, "bf16", "autocast") == (96 + 576) * 6


def test_llama_ref_norms_scale_with_the_dtype():
    # fp32 llama-ref (c = r = 4): the reference norm's bytes per element, 36 and 68 in bf16,
    # double (36 x 4/2 = 72, 68 x 4/2 = 136). Model GPT at tp 1 (MHA, no repeat; learned
    # positions; GELU; dropout), 1 token:
    # forward: norms 2 x 72 x 6 = 864 in place of 2 x 8 x 6; residual 2 x 12 x 6 = 144;
    #   copy 8 x 6 = 48; GELU 8 x 12 = 96; dropout 2 x 6 x 9 = 108: 1260
    # backward: norms 2 x 136 x 6 = 1632; residual 2 x 12 x 6 = 144; summed 2 x 12 x 6 = 144;
    #   GELU 12 x 12 = 144; dropout 108: 2172
    assert E.block_bytes(GPT, 1, 1, False, "fp32", "llama-ref") == (1260, 2172)


def test_output_layer_fp16_autocast_tp3_padded_vocabulary():
    # vocabulary 200 padded to a multiple of 128 x 3 = 384, 128 rows per rank; h = 6;
    # c = 2, r = 4: the logits' fp32 cast c + 4 = 6, the norm output's cast 6.
    # forward per token: norm 2r h = 48, cast 6 x 6 = 36, (6 + 8) x 128 = 1792: 1876
    # backward per token: norm 5r h = 120, cast 36, (4 + 12 + 6) x 128 = 2816: 2972
    # the output weight's cast, once: 6 x 128 x 6 = 4608
    f, b = E.output_bytes(GPT, 7, 3, "fp16", "autocast")
    assert (f, b) == (7 * 1876 + 4608, 7 * 2972 + 4608)


def test_output_layer_fp32_has_no_casts():
    # fp32 (c = r = 4), vocabulary 200 padded to 256 at tp 1, h = 6:
    # forward per token 2 x 4 x 6 + 8 x 256 = 48 + 2048 = 2096;
    # backward 5 x 4 x 6 + 16 x 256 = 120 + 4096 = 4216
    assert E.output_bytes(GPT, 2, 1, "fp32", "autocast") == (2 * 2096, 2 * 4216)
    assert E.output_bytes(GPT, 2, 1, "fp32", "eager") == (2 * 2096, 2 * 4216)


def test_output_layer_bf16_eager_and_fp8():
    # bf16 eager: c = r = 2, the logits' cast to fp32 2 + 4 = 6, no norm cast, no weight cast;
    # tp 1: 256 rows. forward 2 x 2 x 6 + (6 + 8) x 256 = 24 + 3584 = 3608;
    # backward 5 x 2 x 6 + (16 + 6) x 256 = 60 + 5632 = 5692
    assert E.output_bytes(GPT, 3, 1, "bf16", "eager") == (3 * 3608, 3 * 5692)
    # fp8 eager: c = r = 1, cast to fp32 1 + 4 = 5; forward 2 x 6 + 13 x 256 = 3340;
    # backward 5 x 6 + 21 x 256 = 5406
    assert E.output_bytes(GPT, 1, 1, "fp8", "eager") == (3340, 5406)


def _built(s):
    """The same text as a new string object (not the interned literal), as a name read from
    a command line or a TOML file is: a comparison by identity would not find it."""
    return "".join(list(s))


def test_names_read_at_run_time():
    kind = _built("autocast")
    assert kind == "autocast" and kind is not E.KINDS[-1]  # equal, not the same object
    assert E.dtypes("bf16", kind) == (2, 4)
    # the GQA model of test_moe_without_shared_experts..., dense: as a llama-ref block
    # with names built at run time, bf16, tp 1, 1 token, MOE's shapes without experts
    # (q 8, kv 4, F 6, h 8):
    #   forward: norms 2 x 4 x 8 = 64 + reference 2 x 32 x 8 = 512; residual 2 x 6 x 8 = 96;
    #     copy 4 x 8 = 32; repeat_kv 4 x 12 = 48; rope 20 x 12 = 240; SwiGLU 10 x 6 = 60:
    #     1052
    #   backward: norms 2 x 10 x 8 = 160 + reference 2 x 58 x 8 = 928; residual 96;
    #     summed 3 x 6 x 8 = 144; repeat 48; rope 240; SwiGLU 18 x 6 = 108: 1724
    dense = ModelSpec(name="d", n_layers=1, hidden=8, n_heads=4, n_kv_heads=2, ffn_hidden=6,
                      vocab_size=128, max_seq_len=16, mlp=_built("swiglu"),
                      norm=_built("rmsnorm"), position=_built("rope"))
    assert E.block_bytes(dense, 1, 1, False, "bf16", _built("llama-ref")) == (1052, 1724)


def test_llama_ref_repeated_kv_in_fp32():
    # the GQA model dense (q 8, kv 4, h 8, F 6) as llama-ref in fp32 (c = r = 4), tp 1, one
    # token: repeat_kv copies K and V to the query heads, 2c (kv + q) = 8 x 12 = 96 bytes each
    # way -- against the multi-head model with the same q (kv 8), which repeats nothing.
    #   forward:  norms 2 x 72 x 8 = 1152 (the reference norm, 36 x 4/2 bytes per element);
    #     residual 2 x 12 x 8 = 192; copy 8 x 8 = 64; repeat 96; rope 40 x 12 = 480;
    #     SwiGLU 20 x 6 = 120: 2104
    #   backward: norms 2 x 136 x 8 = 2176; residual 192; summed 3 x 12 x 8 = 288;
    #     repeat 96; rope 480; SwiGLU 36 x 6 = 216: 3448
    gqa = ModelSpec(name="d", n_layers=1, hidden=8, n_heads=4, n_kv_heads=2, ffn_hidden=6,
                    vocab_size=128, max_seq_len=16)
    assert E.block_bytes(gqa, 1, 1, False, "fp32", "llama-ref") == (2104, 3448)


def test_sequence_parallel_stream_of_a_width_tp_does_not_divide():
    # hidden 8 with three heads of 2 (q = kv = 6), FFN 12, tp 3 (divides the heads and the
    # FFN, as plans require; the hidden width need not): with sequence parallelism each rank
    # holds a third of the tokens' stream, 8/3 elements per token. bf16 eager (c = r = 2):
    #   forward:  norms 2 x 4 x 8/3 = 64/3; residual 2 x 6 x 8/3 = 32; copy 4 x 2 = 8;
    #     GELU 4 x 4 = 16; dropout 2 x 8/3 x 5 = 80/3: 64/3 + 80/3 + 56 = 104
    #   backward: norms 2 x 10 x 8/3 = 160/3; residual 2 x 6 x 8/3 = 32; q+k+v's two sums
    #     2 x 6 x 8 = 96 (the gathered input); GELU 6 x 4 = 24; dropout 80/3:
    #     240/3 + 152 = 232
    wide = GPT.replace(hidden=8, head_dim=2)
    f, b = E.block_bytes(wide, 3, 3, True, "bf16", "eager")
    assert f == exact(3 * 104)
    assert b == exact(3 * 232)


def test_gelu_moe_block_bf16_autocast_tp2():
    # GELU experts (two matrices each), 4 experts, top 1, one shared expert; the GQA shapes of
    # MOE (h 8, q 8, kv 4, FFN 6). tp 2 without sp: q 4, kv 2, the shared expert's F = 6/2
    # = 3; one linear (w1) reads the second norm: 4 input casts. c = 2, r = 4, cast 6.
    # Weights cast: h (2q + 2kv) + 2 h F = 8 x 12 + 2 x 8 x 3 = 96 + 48 = 144, and the routed
    #   experts' two matrices each, 4 x 2 x 8 x 6 = 384: 528 elements x 6 = 3168 bytes.
    # forward per token: norms 2 x 8 x 8 = 128; residual 2 x 10 x 8 = 160; casts 4 x 6 x 8
    #   = 192; copy 4 x 4 = 16; rope 20 x 6 = 120; GELU 2c F = 4 x 3 = 12; routed, top 1:
    #   (2c x 6 + 6 x 8 x 2) = 24 + 96 = 120; sum 748
    # backward: norms 2 x 20 x 8 = 320; residual 2 x 18 x 8 = 288; casts 192; q+k+v's two sums
    #   2 x 12 x 8 = 192; rope 120; GELU 3c F = 18; routed 240; sum 1370
    gm = MOE.replace(mlp="gelu", top_k=1, n_shared_experts=1)
    assert E.weight_cast_bytes(gm, 2, "bf16", "autocast") == 3168
    assert E.block_bytes(gm, 1, 2, False, "bf16", "autocast") == (748 + 3168, 1370 + 3168)

"""Memory-bound traffic of eager PyTorch blocks (ptd.cost.eager), counted here by hand, pass
by pass, for a model small enough to add up: hidden 4, two heads of two, FFN 8."""
import pytest

from ptd.cost import eager as E
from ptd.cost.compute import block_time, output_time
from ptd.cost.stacks import stack_options
from ptd.specs.hardware import load_hardware
from ptd.specs.model import ModelSpec

TINY = ModelSpec(name="t", n_layers=1, hidden=4, n_heads=2, n_kv_heads=2, ffn_hidden=8,
                 vocab_size=128, max_seq_len=16, mlp="swiglu", norm="rmsnorm",
                 position="rope", tied_embeddings=False, bias=False)


def test_autocast_block_forward_by_hand():
    # per token, bf16 under autocast (stream and norms fp32)
    norms = 2 * (4 * 4 + 4 * 4)                  # read and write 4 fp32 each
    residual = 2 * (4 * 4 + 4 * 2 + 4 * 4)      # fp32 stream + bf16 branch -> fp32
    casts = 5 * (4 * 4 + 4 * 2)                  # wq, wk, wv, w1, w3 each cast their input
    rope_one = (2 * 2 + 2 * 2) + (4 + 4) * 2 + (4 + 4) * 2 * 2 + (8 + 4) * 2  # neg, cat, 2 mul, add
    rope = 2 * rope_one                          # q and k (4 wide each)
    out_copy = (4 + 4) * 2
    swiglu = (8 + 8) * 2 + (16 + 8) * 2          # silu, gate product over F = 8
    per_token = norms + residual + casts + rope + out_copy + swiglu
    weights = 4 * 4 * 4 + 3 * 4 * 8              # q, k, v, o and w1, w2, w3
    fwd, _ = E.block_bytes(TINY, 10, 1, False, "bf16", "autocast")
    assert fwd == 10 * per_token + weights * (4 + 2)
    assert per_token == 520


def test_autocast_block_backward_by_hand():
    norms = 2 * 5 * 4 * 4            # dy, x read twice (input and weight gradients), dx written
    residual = 2 * ((4 + 2) * 4 + 3 * 4 * 4)  # the branch's gradient cast; skip + norm summed
    casts = 5 * (2 + 4) * 4          # each linear's input gradient cast back to fp32
    summed = 3 * 3 * 4 * 4           # q+k+v (two sums), gate+up (one): read 2, write 1, fp32
    rope = 2 * 10 * 2 * 4
    swiglu = (3 + 3 + 3) * 2 * 8     # both products' gradients, SiLU's
    per_token = norms + residual + casts + summed + rope + swiglu
    _, bwd = E.block_bytes(TINY, 10, 1, False, "bf16", "autocast")
    assert bwd == 10 * per_token + (4 * 4 * 4 + 3 * 4 * 8) * 6
    assert per_token == 872


def test_eager_has_no_casts_and_fp32_autocast_is_eager():
    f_e, b_e = E.block_bytes(TINY, 1, 1, False, "bf16", "eager")
    # bf16 throughout: norms 2*(8+8), residual 2*(2+2+2)*4, no casts, rope, copy, swiglu
    assert f_e == 2 * 16 + 2 * 24 + 160 + 16 + 80
    assert E.weight_cast_bytes(TINY, 1, "bf16", "eager") == 0
    # autocast in fp32 casts nothing: the same passes as eager fp32
    assert E.block_bytes(TINY, 3, 1, False, "fp32", "autocast") == \
        E.block_bytes(TINY, 3, 1, False, "fp32", "eager")


def test_llama_reference_norms_and_repeated_kv():
    gqa = TINY.replace(n_kv_heads=1)  # k and v 2 wide, repeated to the 2 query heads
    f_e, b_e = E.block_bytes(gqa, 1, 1, False, "bf16", "eager")
    f_r, b_r = E.block_bytes(gqa, 1, 1, False, "bf16", "llama-ref")
    # two norms: 36 bytes per element forward in place of 4 (read + write bf16), 68 for 10
    # backward; repeat_kv copies K and V (read 2, write 4 wide, bf16) and sums them back
    assert f_r - f_e == 2 * (36 - 4) * 4 + 2 * (2 + 4) * 2
    assert b_r - b_e == 2 * (68 - 10) * 4 + 2 * (4 + 2) * 2
    # multi-head: nothing to repeat
    assert E.block_bytes(TINY, 1, 1, False, "bf16", "llama-ref")[0] - \
        E.block_bytes(TINY, 1, 1, False, "bf16", "eager")[0] == 2 * 32 * 4


def test_tensor_parallel_shards_heads_and_ffn_not_the_stream():
    one = E.block_bytes(TINY, 1, 1, False, "bf16", "eager")[0]
    two = E.block_bytes(TINY, 1, 2, False, "bf16", "eager")[0]
    # rope (160), the output copy (16) and SwiGLU (80) halve; norms and residual adds stay
    assert one - two == (160 + 16 + 80) / 2
    sp = E.block_bytes(TINY, 1, 2, True, "bf16", "eager")[0]
    assert two - sp == (2 * 16 + 2 * 24) / 2  # sequence parallelism shards the stream too


def test_output_layer_by_hand():
    # vocab 128 (already a multiple of 128), hidden 4, bf16 under autocast
    norm, cast = 2 * 4 * 4, (4 + 2) * 4
    loss_f = (2 + 4) * 128 + (4 + 4) * 128           # logits to fp32, log-softmax
    loss_b = 4 * 128 + 12 * 128 + (4 + 2) * 128      # zero fill, log-softmax backward, cast
    w = (4 + 2) * 128 * 4                            # output weight cast / its gradient's
    f, b = E.output_bytes(TINY, 3, 1, "bf16", "autocast")
    assert f == 3 * (norm + cast + loss_f) + w
    assert b == 3 * (5 * 4 * 4 + cast + loss_b) + w


def test_block_time_prices_the_eager_bytes_at_the_bandwidth():
    hw = load_hardware("cpu")  # no GPU kernel adjustments: bytes over bandwidth
    kw = dict(bw=1e6, overhead=0.0)
    fused = block_time(TINY, hw, 8, 1, 1, False, "bf16", 1e30, **kw)
    ac = block_time(TINY, hw, 8, 1, 1, False, "bf16", 1e30, elementwise="autocast", **kw)
    # a CPU has no fused rms_norm kernel: the norms run as operators
    f, b = E.block_bytes(TINY, 8, 1, False, "bf16", "autocast", composite_norm=True)
    # attention's reads (q, k, v, o) are the same in both; the rest is the eager count
    assert ac.forward - fused.forward == pytest.approx((f - fused_bytes(8)) / 1e6)
    assert ac.backward - fused.backward == pytest.approx((b - 2 * fused_bytes(8)) / 1e6)
    of, ob = output_time(TINY, hw, 8, 1, "bf16", 1e30, elementwise="autocast", **kw)
    ff, fb = output_time(TINY, hw, 8, 1, "bf16", 1e30, **kw)
    # the fused count, Megatron-LM's vocab-parallel cross-entropy over the 8 x 128 logits:
    # forward cast to fp32 (2 + 4), max (4), subtract (4 + 4), exp (4 + 4), sum (4), divide
    # (4 + 4) = 38; backward product with the loss gradient (4 + 4), cast back (4 + 2) = 14;
    # the norm's bf16 read and write (twice in the backward)
    loss_f, loss_b, norm = 38 * 8 * 128, 14 * 8 * 128, 2 * 2 * 8 * 4
    ef, eb = E.output_bytes(TINY, 8, 1, "bf16", "autocast", composite_norm=True)
    assert of - ff == pytest.approx((ef - loss_f - norm) / 1e6)
    assert ob - fb == pytest.approx((eb - loss_b - 2 * norm) / 1e6)
    # fp32 logits: no casts, 32 and 8; beside them the output product's own bytes at this
    # unbounded rate (input 8 x 4, weight 4 x 128, logits 8 x 128; twice in the backward)
    of32, ob32 = output_time(TINY, hw, 8, 1, "fp32", 1e30, **kw)
    norm32, mm = 2 * 4 * 8 * 4, 4 * (8 * 4 + 4 * 128 + 8 * 128)
    assert of32 == pytest.approx((32 * 8 * 128 + norm32 + mm) / 1e6)
    assert ob32 == pytest.approx((8 * 8 * 128 + 2 * norm32 + 2 * mm) / 1e6)


def test_rms_norm_run_as_operators_by_hand():
    # F.rms_norm without a fused kernel, per element of the fp32 stream (r = 4 under
    # autocast): forward pow 2, mean 1, two products 2 + 2 = 7 passes against the fused
    # kernel's 2; backward 3 + 2 + 1 (weight product), 3 + 2 + 1 (rsqrt product), 1 (mean),
    # 2 + 2 + 3 (pow), 3 (the paths' sum) = 23 against 5. The passes are fp32 whatever the
    # stream: a bf16 stream (eager) adds the input's cast up (2 + 4) and the output's down
    # (4 + 2), and in the backward the gradients' the same way: 7 x 4 + 12 = 40 bytes an
    # element forward against the fused kernel's 2 x 2, 23 x 4 + 12 = 104 against 5 x 2
    for kind, (fused_f, fused_b, comp_f, comp_b) in (("autocast", (8, 20, 28, 92)),
                                                     ("eager", (4, 10, 40, 104))):
        f0, b0 = E.block_bytes(TINY, 10, 1, False, "bf16", kind)
        f1, b1 = E.block_bytes(TINY, 10, 1, False, "bf16", kind, composite_norm=True)
        assert f1 - f0 == 10 * 2 * (comp_f - fused_f) * 4   # two norms, hidden 4, 10 tokens
        assert b1 - b0 == 10 * 2 * (comp_b - fused_b) * 4
        of0, ob0 = E.output_bytes(TINY, 10, 1, "bf16", kind)
        of1, ob1 = E.output_bytes(TINY, 10, 1, "bf16", kind, composite_norm=True)
        assert (of1 - of0, ob1 - ob0) == (10 * (comp_f - fused_f) * 4,
                                          10 * (comp_b - fused_b) * 4)  # the final norm
    # the casts are cast kernels (their own share of the bandwidth on a GPU), the fp32
    # passes elementwise ones: 10 tokens x 4 wide x 2 norms x (2 + 4) each way
    p = E.block_passes(TINY, 10, 1, False, "bf16", "eager", composite_norm=True)
    p0 = E.block_passes(TINY, 10, 1, False, "bf16", "eager")
    assert p["cast_up"][0] - p0.get("cast_up", [0, 0])[0] == 10 * 4 * 2 * 6
    assert p["cast_down"][1] - p0.get("cast_down", [0, 0])[1] == 10 * 4 * 2 * 6
    assert p["elementwise"][0] - p0["elementwise"][0] == 10 * 4 * 2 * 28
    # LayerNorm has its own kernel on a CPU; the Llama reference counts its norm already
    ln = ModelSpec(name="ln", n_layers=1, hidden=4, n_heads=2, n_kv_heads=2, ffn_hidden=8,
                   vocab_size=128, max_seq_len=16, norm="layernorm", mlp="gelu",
                   position="learned")
    assert E.block_bytes(ln, 10, 1, False, "bf16", "eager", composite_norm=True) == \
        E.block_bytes(ln, 10, 1, False, "bf16", "eager")
    assert E.block_bytes(TINY, 10, 1, False, "bf16", "llama-ref", composite_norm=True) == \
        E.block_bytes(TINY, 10, 1, False, "bf16", "llama-ref")


def test_only_a_device_without_fused_norms_prices_them_as_operators(monkeypatch):
    asked = []
    real_block, real_output = E.block_passes, E.output_passes

    def block(*a, composite_norm=False, **k):
        asked.append(("block", composite_norm))
        return real_block(*a, composite_norm=composite_norm, **k)

    def output(*a, composite_norm=False, **k):
        asked.append(("output", composite_norm))
        return real_output(*a, composite_norm=composite_norm, **k)
    monkeypatch.setattr(E, "block_passes", block)
    monkeypatch.setattr(E, "output_passes", output)
    for name, composite in (("cpu", True), ("h200", False)):
        asked.clear()
        hw = load_hardware(name)
        block_time(TINY, hw, 8, 1, 1, False, "bf16", 1e12, elementwise="autocast")
        output_time(TINY, hw, 8, 1, "bf16", 1e12, elementwise="autocast")
        assert asked == [("block", composite), ("output", composite)], name


def fused_bytes(tokens):
    # compute.elementwise_bytes_fwd by hand, elements per token: norms and residual adds
    # 10h, rope 6(q + kv), the attention layouts 2(q + 2kv) + 2q, SwiGLU 5F; bf16
    return (10 * 4 + 6 * 8 + (2 * 12 + 8) + 5 * 8) * 2 * tokens


def test_stacks_name_their_elementwise_passes():
    assert stack_options("ptd").elementwise == "autocast"
    assert stack_options("torchtitan").elementwise == "llama-ref"
    for s in ("megatron-2021", "megatron-core", "deepspeed", "deepspeed-2021"):
        assert stack_options(s).elementwise == "fused"


# Measured on one H200 (docs/gpu-h100.md, "H200", scripts/gpu_step_breakdown.py): device time
# per training step of ptd's model, bf16 under autocast, of every kernel but the optimizer's
# (two profiled steps, halved). (name, model, micro-batch, sequence, measured ms)
def _measured():
    import dataclasses
    from ptd.cost.validate import case_model, load_cases
    from ptd.specs.model import get_preset
    cases = {c["id"]: c for c in load_cases()}
    return [
        ("llama3-8b, 8 layers", dataclasses.replace(get_preset("llama3-8b"), n_layers=8), 1,
         8192, 147.1 + 31.4 + 60.2),
        ("GPT 1.7B (Megatron-Core table)", case_model(cases["megatron_h100_2024_1.7b"]), 4,
         4096, 178.7 + 49.5 + 107.0),
        ("llama2-7b, 8 layers", dataclasses.replace(case_model(cases["ibm_fsdp2024_7B_h100"]),
                                                    n_layers=8), 2, 4096, 115.2 + 16.4 + 52.1),
    ]


@pytest.mark.parametrize("i", range(3))
def test_ptd_runtime_on_an_h200_within_ten_percent(i):
    """The computation of ptd's runtime as an H200 ran it, against the cost model's ``ptd``
    stack on the h200 preset (no constant here comes from these measurements; the fused
    count left the three 11-15 % short)."""
    from ptd.cost.estimate import estimate
    from ptd.specs.hardware import ClusterSpec
    from ptd.specs.plan import ParallelPlan
    name, model, mb, seq, measured_ms = _measured()[i]
    plan = ParallelPlan(micro_batch=mb, global_batch=mb, seq_len=seq, dtype="bf16")
    est = estimate(model, ClusterSpec(load_hardware("h200"), 1), plan,
                   options=stack_options("ptd"))
    assert abs(est.step.compute * 1e3 / measured_ms - 1) < 0.10, (name, est.step.compute)


def test_gpu_eager_kernels_run_at_their_measured_bandwidth():
    """On a GPU each kind of eager kernel moves its bytes at the rate it was measured at
    beside a 3.86 TB/s copy on the H200 (docs/gpu-h100.md): with the copy bandwidth at
    3.86 TB/s, 2.03 TB of bf16->fp32 casts take 1 s, 1.44 TB of rotary broadcast products
    1 s, 0.96 TB of concatenations 1 s; norms at 2.02 of a 2.98 TB/s copy (the H100's)."""
    from ptd.cost.compute import eager_time
    T = 1e12
    f, b = eager_time({"cast_up": [2.03 * T, 0.0], "broadcast": [0.0, 1.44 * T],
                       "cat": [0.96 * T, 0.0]}, 3.86 * T, gpu=True)
    assert f == pytest.approx(2.0) and b == pytest.approx(1.0)
    f, _ = eager_time({"norm": [2.02 * T, 0.0], "copy": [2.98 * T, 0.0]}, 2.98 * T, gpu=True)
    assert f == pytest.approx(2.0)
    # elsewhere (a CPU) every byte at the copy bandwidth
    f, b = eager_time({"cast_up": [2.0, 1.0], "cat": [1.0, 3.0]}, 1.0, gpu=False)
    assert (f, b) == (3.0, 4.0)


def test_passes_by_kernel_add_up_to_the_counts():
    passes = E.block_passes(TINY, 10, 1, False, "bf16", "autocast")
    assert sum(v[0] for v in passes.values()) == 10 * 520 + 160 * 6  # the forward by hand above
    with pytest.raises(ValueError, match="eager pass kind 'fused'"):
        E.block_passes(TINY, 10, 1, False, "bf16", "fused")
    # by hand, per token: rope's broadcast products 4 passes x 2 bytes x (q + kv = 8 wide)
    # both ways; the linear inputs' casts down (5 x 6 x 4) forward and up backward, each
    # plus the weights' casts (160 parameters x 6 bytes) once per micro-batch
    assert passes["broadcast"] == [10 * 4 * 2 * 8] * 2
    assert passes["cast_up"][1] == 10 * 5 * 6 * 4 + 160 * 6
    assert passes["cast_down"][0] == 10 * 5 * 6 * 4 + 160 * 6


def test_autocast_casts_only_the_rank_s_experts_under_ep():
    """A rank of an ep group holds E / ep routed experts: autocast casts those (found by a
    mutation helper: all E were counted). tiny-moe: h = F = 64, 8 experts, SwiGLU (3
    matrices each), attention h(2q + 2kv) = 64 (128 + 64) = 12288; 6 bytes per element (the
    router's 64 x 8 matrix is left out of the count)."""
    from ptd.specs.model import get_preset
    m = get_preset("tiny-moe")
    assert m.n_shared_experts == 0 and m.q_dim == 64 and m.kv_dim == 32
    attn = 64 * (2 * 64 + 2 * 32)
    casts = lambda e: 6 * (attn + e * 3 * 64 * 64)  # noqa: E731
    assert E.weight_cast_bytes(m, 1, "bf16", "autocast", ep=1) == casts(8)
    assert E.weight_cast_bytes(m, 1, "bf16", "autocast", ep=2) == casts(4)


def test_the_activation_is_a_kind_of_its_own():
    # SwiGLU over F = 8 in bf16 (c = 2), 10 tokens: SiLU reads and writes F (2c), its gradient
    # reads two and writes one (3c); the gate product 3c and its two gradients 6c
    p = E.block_passes(TINY, 10, 1, False, "bf16", "eager")
    assert p["activation"] == [10 * 2 * 2 * 8, 10 * 3 * 2 * 8]
    gelu = ModelSpec(name="g", n_layers=1, hidden=4, n_heads=2, n_kv_heads=2, ffn_hidden=8,
                     vocab_size=128, max_seq_len=16, norm="layernorm", mlp="gelu",
                     position="learned")
    g = E.block_passes(gelu, 10, 1, False, "bf16", "eager")
    assert g["activation"] == [10 * 2 * 2 * 8, 10 * 3 * 2 * 8]  # GELU: all of it
    # routed experts (no shared one): each token's top_k = 2 assignments run SiLU over F = 8:
    # 2 x 8 x 2 bytes read and written forward (x 2), read two and written one backward (x 3)
    moe = ModelSpec(name="m", n_layers=1, hidden=4, n_heads=2, n_kv_heads=2, ffn_hidden=8,
                    vocab_size=128, max_seq_len=16, n_experts=4, top_k=2)
    assert E.block_passes(moe, 10, 1, False, "bf16", "eager")["activation"] == \
        [10 * 2 * (2 * 8 * 2), 10 * 3 * (2 * 8 * 2)]
    # on a GPU it is priced as the other same-shape operators (SiLU was the one measured)
    assert E.BW_FRACTION["activation"] == E.BW_FRACTION["elementwise"]


def test_a_measured_share_of_the_bandwidth_prices_its_kind():
    from ptd.cost.compute import NORM_BW_FRACTION, eager_time
    passes = {"activation": [10.0, 30.0], "copy": [4.0, 0.0], "norm": [2.0, 5.0]}
    # a CPU: every kind at the bandwidth (100 B/s) except the one measured, at a fifth of it
    assert eager_time(passes, 100.0, False, {"activation": 0.2}) == \
        pytest.approx((10 / 20 + 4 / 100 + 2 / 100, 30 / 20 + 5 / 100))
    assert eager_time(passes, 100.0, False) == pytest.approx((16 / 100, 35 / 100))
    # a GPU: the measured kind overrides the table, the others keep it
    a = E.BW_FRACTION["activation"]
    assert eager_time(passes, 100.0, True, {"activation": 0.2}) == pytest.approx(
        (10 / 20 + 4 / 100 + 2 / (100 * NORM_BW_FRACTION), 30 / 20 + 5 / (100 * NORM_BW_FRACTION)))
    assert eager_time(passes, 100.0, True)[0] == pytest.approx(
        10 / (100 * a) + 4 / 100 + 2 / (100 * NORM_BW_FRACTION))


@pytest.mark.parametrize("table, match", [
    ({"activation": 0.0}, r"eager_bandwidth_fraction.activation must be in \(0, 2\]"),
    ({"activation": 2.5}, r"must be in \(0, 2\], got 2.5"),
    ({"silu": 0.2}, "unknown kind 'silu'"),
    ({"activation": "fast"}, "wants kind = number"),
])
def test_bad_eager_bandwidth_fractions_are_refused(table, match):
    from ptd.errors import PtdError
    from ptd.specs.hardware import hardware_from_dict
    with pytest.raises(PtdError, match=match):
        hardware_from_dict({"preset": "cpu", "eager_bandwidth_fraction": table}, "bad")


def test_the_kinds_a_profile_may_name_are_the_kinds_priced():
    from ptd.specs.hardware import EAGER_KERNELS, hardware_from_dict
    assert set(EAGER_KERNELS) == set(E.BW_FRACTION) | {"norm"}
    hw = hardware_from_dict({"preset": "cpu", "eager_bandwidth_fraction": {"activation": 0.25}})
    assert hw.eager_bandwidth_fraction == {"activation": 0.25}

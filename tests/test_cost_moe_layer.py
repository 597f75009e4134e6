"""A MoE layer priced by its measurement (``HardwareSpec.moe_layer_measured``, written by
``ptd calibrate --model`` on a CPU): the lookup, the profile's table, and the block's price
with the measured layer in place of its products, passes and operators. Expected values by
hand."""

import pytest

from ptd.cost import compute as C
from ptd.cost import step as S
from ptd.cost.moe import moe_layer_key
from ptd.errors import PtdError
from ptd.specs import ClusterSpec, ParallelPlan
from ptd.specs.hardware import hardware_from_dict, load_hardware
from ptd.specs.model import get_preset

MOE = get_preset("tiny-moe")
KEY = moe_layer_key(MOE, "fp32")
PTS = ((64.0, 1e-3, 2e-3), (512.0, 2e-3, 4e-3), (2048.0, 5e-3, 9e-3))


def test_the_key_names_every_field_that_shapes_the_layer():
    assert KEY == "h64-f64-e8-k2-swiglu-b0-s0-c0-fp32"
    changes = [dict(hidden=128), dict(ffn_hidden=32), dict(n_experts=4), dict(top_k=1),
               dict(mlp="gelu"), dict(bias=True), dict(n_shared_experts=1),
               dict(capacity_factor=1.25)]
    keys = {moe_layer_key(MOE.replace(**c), "fp32") for c in changes}
    assert len(keys) == len(changes) and KEY not in keys
    assert moe_layer_key(MOE, "bf16") != KEY
    assert moe_layer_key(MOE.replace(capacity_factor=1.25), "fp32").endswith("-c1p25-fp32")


def test_lookup_is_linear_between_points_and_along_the_end_segments():
    hw = load_hardware("cpu").replace(moe_layer_measured={KEY: {1: PTS, 2: PTS}})
    # halfway between 64 and 512 tokens
    assert hw.moe_layer_at(KEY, 288) == pytest.approx((1.5e-3, 3e-3))
    assert hw.moe_layer_at(KEY, 512) == pytest.approx((2e-3, 4e-3))
    # past 2048: the last segment's slope, 3 ms (5 ms) per 1536 tokens
    assert hw.moe_layer_at(KEY, 4096) == pytest.approx((9e-3, 9e-3 + 2048 * 5e-3 / 1536))
    # below 64: the first segment's, 1 ms (2 ms) per 448 tokens, never below 0
    assert hw.moe_layer_at(KEY, 0) == pytest.approx((1e-3 - 64e-3 / 448, 2e-3 - 128e-3 / 448))
    # 4 workers where 2 were the most measured: a time grows as the workers (as _per_worker)
    assert hw.moe_layer_at(KEY, 512, 4) == pytest.approx((4e-3, 8e-3))
    assert hw.moe_layer_at("h1-other", 512) is None
    assert load_hardware("cpu").moe_layer_at(KEY, 512) is None


def test_the_table_loads_from_toml_fields_and_round_trips():
    table = {KEY: {"1": [list(p) for p in PTS]}}
    hw = hardware_from_dict({"preset": "cpu", "moe_layer_measured": table}, "p")
    assert hw.moe_layer_measured == {KEY: {1: PTS}}
    again = hardware_from_dict({"preset": "cpu",
                                "moe_layer_measured": hw.to_dict()["moe_layer_measured"]}, "p")
    assert again.moe_layer_measured == hw.moe_layer_measured
    for bad, words in (({"1": [[64, 1e-3]]}, "moe_layer_measured wants"),
                       ({"1": [[64, -1e-3, 1e-3]]}, "forward must be >= 0"),
                       ({"1": [[64, 1e-3, 1e-3], [64, 2e-3, 2e-3]]}, "each token count once"),
                       ({"0": [[64, 1e-3, 1e-3]]}, "workers (1, 2, ...)")):
        with pytest.raises(PtdError, match=words.replace("(", r"\(").replace(")", r"\)")):
            hardware_from_dict({"preset": "cpu", "moe_layer_measured": {KEY: bad}}, "p")


# A device whose products and passes take no time: what remains of a block is its operators
# at ``OVH`` each, so the operators the measured layer replaces are plain to see.
OVH = 1e-6
FAST = load_hardware("cpu").replace(peak_flops={"fp32": 1e30, "bf16": 1e30},
                                    memory_bandwidth=1e30, op_overhead=OVH,
                                    attention_shapes_measured={}, gemm_shapes_measured={},
                                    gemm_flops_measured={}, memory_bandwidth_measured={},
                                    op_overhead_measured={}, overheads_measured={},
                                    moe_layer_measured={})


def _block(moe_layer=None, hw=FAST):
    return C.block_time(MOE, hw, 128, 4, 1, False, "fp32", 1e30, "flash", 1e30, OVH,
                        elementwise="autocast", moe_layer=moe_layer)


def test_the_measured_layer_replaces_the_layers_operators_in_the_block():
    # tiny-moe's block dispatches 124 operators forward, 169 backward; its MoE layer 58 and
    # 69 of them (both counted on the runtime: tests/test_cost_vs_runtime.py)
    plain = _block()
    assert plain.forward == pytest.approx(124 * OVH, rel=1e-6)
    assert plain.backward == pytest.approx(169 * OVH, rel=1e-6)
    m = _block((0.7e-3, 1.1e-3))
    assert m.forward == pytest.approx((124 - 58) * OVH + 0.7e-3, rel=1e-6)
    assert m.backward == pytest.approx((169 - 69) * OVH + 1.1e-3, rel=1e-6)


def test_the_measured_layer_replaces_its_products_and_passes():
    # at a finite rate and bandwidth the block with a measured layer of (0, 0) is the block
    # without its feed-forward work: the products, passes and operators of the router and
    # the routed experts are gone, attention's are not. By hand: a block of the same
    # attention with a dense MLP of width 0 has the same non-FFN work.
    hw = load_hardware("cpu").replace(attention_shapes_measured={}, gemm_shapes_measured={},
                                      moe_layer_measured={})
    rate, bw = 5e10, 2e10

    def blk(model, moe_layer=None):
        return C.block_time(model, hw, 128, 4, 1, False, "fp32", rate, "flash", bw, 0.0,
                            elementwise="autocast", moe_layer=moe_layer)
    zero = blk(MOE, (0.0, 0.0))
    dense_no_ffn = MOE.replace(n_experts=0, top_k=0, ffn_hidden=1)
    ref = blk(dense_no_ffn)
    # (a width-1 MLP still has three products of 512 x 1 x 64 and an activation over 1)
    lin = [C.Gemm(512, 1, 64, 2), C.Gemm(512, 64, 1)]
    t = sum(C.gemm_time(g, rate, bw, 4, hw, "fp32") for g in lin)
    assert zero.forward == pytest.approx(ref.forward - t, rel=0.02)
    assert zero.backward == pytest.approx(ref.backward - 2 * t, rel=0.02)
    assert zero.forward < blk(MOE).forward
    # what an early-stopping full recompute skips is still the block's last product, the
    # experts' down projection: 8 experts of 512 x 2 / 8 = 128 rows, 64 x 64
    down = C.gemm_time(C.Gemm(128, 64, 64, 8), rate, bw, 4, hw, "fp32")
    assert zero.last_matmul_forward == pytest.approx(down, rel=1e-9)


def test_the_step_reads_the_measured_layer_of_the_runs_shape_and_dtype():
    plan = ParallelPlan(micro_batch=4, global_batch=16, seq_len=128, dtype="fp32")
    with_fp32 = FAST.replace(moe_layer_measured={KEY: {1: PTS}})
    mbt = S.micro_batch(MOE, plan, ClusterSpec(with_fp32, 1), "flash", True, True, "autocast")
    # 512 tokens a micro-batch: the measured (2 ms, 4 ms) in place of the layer's operators
    assert mbt.blk.forward == pytest.approx((124 - 58) * OVH + 2e-3, rel=1e-6)
    assert mbt.blk.backward == pytest.approx((169 - 69) * OVH + 4e-3, rel=1e-6)
    # a bf16 measurement does not price an fp32 run, nor one of another shape
    only_bf16 = FAST.replace(moe_layer_measured={moe_layer_key(MOE, "bf16"): {1: PTS}})
    mbt = S.micro_batch(MOE, plan, ClusterSpec(only_bf16, 1), "flash", True, True, "autocast")
    assert mbt.blk.forward == pytest.approx(124 * OVH, rel=1e-6)
    other = MOE.replace(top_k=1)
    mbt = S.micro_batch(other, plan, ClusterSpec(with_fp32, 1), "flash", True, True, "autocast")
    assert mbt.blk.forward == pytest.approx(C.block_ops(other)[0] * OVH, rel=1e-6)


def test_lookup_never_goes_below_zero():
    # along the first segment past its start: 1 ms at 512, 5 ms at 2048 tokens would read
    # -0.33 ms at 0 tokens; a time is not negative
    hw = load_hardware("cpu").replace(
        moe_layer_measured={KEY: {1: ((512.0, 1e-3, 1e-3), (2048.0, 5e-3, 9e-3))}})
    assert hw.moe_layer_at(KEY, 0) == (0.0, 0.0)


def test_without_the_layer_autocast_casts_only_attentions_inputs_and_weights():
    # bf16 under autocast (c = 2 bytes, the fp32 stream r = 4: a cast reads 4 and writes 2):
    # tiny-moe's q is 64 (8 heads of 8), kv 32. Without its feed-forward layer a block casts
    # the three attention inputs (q, k, v; 3 x 6 x 64 bytes a token), one branch's output
    # gradient (6 x 64), and attention's weights each way, 64 x (2 x 64 + 2 x 32) elements
    # at 6 bytes; the layer's own casts are in its measurement (its shared experts' too).
    from ptd.cost import eager as EAGER
    t = 512
    w = 6 * 64 * (2 * 64 + 2 * 32)
    for model in (MOE, MOE.replace(n_shared_experts=1)):
        p = EAGER.block_passes(model, t, 1, False, "bf16", "autocast", ffn=False)
        assert p["cast_down"] == pytest.approx([3 * 6 * 64 * t + w, 6 * 64 * t])
        assert p["cast_up"] == pytest.approx([0.0, 3 * 6 * 64 * t + w])
        assert p.get("activation", [0.0, 0.0]) == [0.0, 0.0]

"""specs/ by hand: what a sampled mutation run of the package (40 of 5,601 mutants, seed
20261129; docs/testing.md) planted and the specs tests let through. Every expected value
is worked out here from the docstrings, the vendor figures the presets cite, or plain
arithmetic, not read back from the code."""

import dataclasses

import pytest

from ptd.errors import PtdError
from ptd.specs import hardware as H
from ptd.specs.config import OptimConfig, TrainConfig
from ptd.specs.layout import coords, group_of, stride
from ptd.specs.model import get_preset
from ptd.specs.plan import ParallelPlan


def test_bytes_per_element_are_the_formats_widths():
    # IEEE binary32 (tf32 is stored in it), binary16 and bfloat16, and the 8-bit formats
    assert H.DTYPE_BYTES == {"fp32": 32 // 8, "tf32": 32 // 8, "bf16": 16 // 8, "fp16": 16 // 8,
                             "fp8": 8 // 8}


def _moe(points, workers=1):
    hw = dataclasses.replace(H.get_hardware_preset("cpu"),
                             moe_layer_measured={"k": {workers: tuple(points)}})
    return hw


def test_moe_layer_lookup_interpolates_and_extends_the_end_segments():
    hw = _moe([(100, 1.0, 2.0), (200, 2.0, 5.0), (400, 3.0, 6.0)])
    # inside the first segment: halfway from (1, 2) to (2, 5)
    assert hw.moe_layer_at("k", 150) == pytest.approx((1.5, 3.5))
    # inside the second: halfway from (2, 5) to (3, 6)
    assert hw.moe_layer_at("k", 300) == pytest.approx((2.5, 5.5))
    # past the last point the last segment goes on: 600 tokens past 200, slope 1/200 each
    assert hw.moe_layer_at("k", 800) == pytest.approx((5.0, 8.0))
    # before the first, the first segment backwards: (1 - 0.5, 2 - 1.5)
    assert hw.moe_layer_at("k", 50) == pytest.approx((0.5, 0.5))
    # never negative
    assert hw.moe_layer_at("k", 0) == pytest.approx((0.0, 0.0))
    assert hw.moe_layer_at("other", 100) is None


def test_moe_layer_lookup_beyond_the_measured_workers_scales_the_time():
    hw = _moe([(100, 1.0, 2.0), (200, 2.0, 4.0)], workers=2)
    assert hw.moe_layer_at("k", 100, workers_per_node=1) == pytest.approx((1.0, 2.0))
    assert hw.moe_layer_at("k", 100, workers_per_node=2) == pytest.approx((1.0, 2.0))
    # 4 workers where 2 were measured: the two cores' time shared out twice as thin
    assert hw.moe_layer_at("k", 100, workers_per_node=4) == pytest.approx((2.0, 4.0))


@pytest.mark.parametrize("name, figures", [
    # vendor datasheets (dense tensor-core peaks), as the presets' comments cite them
    ("a100-80g", {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12}),
    ("h100-sxm", {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp8": 1978.9e12}),
    ("mi300x", {"fp32": 163.4e12, "tf32": 653.7e12, "bf16": 1307.4e12, "fp8": 2614.9e12}),
])
def test_preset_peaks_are_the_datasheets(name, figures):
    hw = H.get_hardware_preset(name)
    for dtype, flops in figures.items():
        assert hw.peak(dtype) == pytest.approx(flops), dtype
    assert hw.peak("fp16") == hw.peak("bf16")


def test_mi300x_links_and_memory():
    hw = H.get_hardware_preset("mi300x")
    # seven Infinity Fabric links of 64 GB/s each way; 192 GB of HBM3 at 5.3 TB/s
    assert hw.intra_node.bandwidth == pytest.approx(7 * 64e9)
    assert hw.memory_bytes == pytest.approx(192 * 2**30)
    assert hw.memory_bandwidth == pytest.approx(5.3e12)


def test_a100_collective_blocks_are_the_h100_figure_its_source_names():
    a100, h100 = H.get_hardware_preset("a100-80g"), H.get_hardware_preset("h100-sxm")
    assert "H100 figure" in a100.sources["comm_sms"]
    assert a100.comm_sms == h100.comm_sms > 0


def test_nodes_per_leaf_bound_is_inclusive():
    base = H.get_hardware_preset("h100-sxm")
    assert dataclasses.replace(base, nodes_per_leaf=2**20).nodes_per_leaf == 2**20
    for bad in (2**20 + 1, -1, True, 2.0):
        with pytest.raises(PtdError, match="nodes_per_leaf"):
            dataclasses.replace(base, nodes_per_leaf=bad)


def test_spine_view_stays_the_same_object_with_two_hardware_specs_about():
    base = H.get_hardware_preset("h100-sxm")
    a = dataclasses.replace(base, name="a", nodes_per_leaf=4, spine_oversubscription=2.0)
    b = dataclasses.replace(base, name="b", nodes_per_leaf=4, spine_oversubscription=4.0)
    first = a.across_spine(8)
    assert first.inter_node.bandwidth == pytest.approx(base.inter_node.bandwidth / 2)
    assert b.across_spine(8).inter_node.bandwidth == pytest.approx(base.inter_node.bandwidth / 4)
    # the cost model's memos key on the object: b's view must not have evicted a's
    assert a.across_spine(8) is first
    assert a.across_spine(4) is a  # within one leaf: no spine
    many = [dataclasses.replace(a, name=f"x{i}") for i in range(300)]
    for h in many:
        h.across_spine(8)
    assert len(H._SPINE) <= 257  # bounded: cleared past 256 entries


def test_strides_and_groups_of_a_four_axis_grid():
    # (pp, dp, cp, tp) = (2, 2, 2, 2), row-major: tp peers 1 apart, cp 2, dp 4, pp 8
    plan = ParallelPlan(pp=2, dp=2, cp=2, tp=2, micro_batch=1, global_batch=4, seq_len=64)
    assert [stride(a, plan) for a in ("tp", "cp", "dp", "pp")] == [1, 2, 4, 8]
    assert coords(13, plan) == {"pp": 1, "dp": 1, "cp": 0, "tp": 1}  # 13 = 8 + 4 + 1
    assert group_of(13, "pp", plan) == [5, 13]
    assert group_of(13, "dp", plan) == [9, 13]
    assert group_of(13, "cp", plan) == [13, 15]
    # three axes of 3, 2, 2 (tp, dp, pp): pp neighbours 3*2 = 6 apart
    plan = ParallelPlan(pp=2, dp=2, tp=3, micro_batch=1, global_batch=4, seq_len=64)
    assert stride("pp", plan) == 6 and stride("dp", plan) == 3


def test_steps_and_warmup_bounds():
    TrainConfig(steps=1).validate()
    for bad in (0, -3):
        with pytest.raises(PtdError, match="steps must be at least 1"):
            TrainConfig(steps=bad).validate()
    OptimConfig(warmup_steps=0).validate()  # no warm-up is a valid choice
    with pytest.raises(PtdError, match="warmup_steps"):
        OptimConfig(warmup_steps=-1).validate()


def test_the_default_run_is_what_its_docstrings_say():
    c = TrainConfig()
    # "819,200 tokens", "warms up over its first 10% of steps", four workers
    assert c.steps * c.plan.global_batch * c.plan.seq_len == 819_200
    assert c.optim.warmup_steps == c.steps // 10
    assert c.plan.world_size == 4
    c.validate()


@pytest.mark.parametrize("mlp, hidden, ffn, expected", [
    # SwiGLU: gate and up (h x f, bias f each) and down (f x h, bias h)
    ("swiglu", 8, 16, 3 * 8 * 16 + 2 * 16 + 8),
    # GELU: up (h x f, bias f) and down (f x h, bias h)
    ("gelu", 8, 16, 2 * 8 * 16 + 16 + 8),
])
def test_one_mlp_with_biases_counted_by_hand(mlp, hidden, ffn, expected):
    m = dataclasses.replace(get_preset("tiny"), mlp=mlp, hidden=hidden, ffn_hidden=ffn,
                            n_heads=2, n_kv_heads=2, bias=True)
    assert m.expert_params() == expected
    assert dataclasses.replace(m, bias=False).expert_params() == expected - ffn * (
        2 if mlp == "swiglu" else 1) - hidden


# ---- from a second sample (30 of 5,601, seed 20261130), run with the tests above
def test_sequence_parallel_needs_the_sequence_split_over_tp_times_cp():
    ok = dict(dp=1, micro_batch=1, global_batch=1, sp=True)
    ParallelPlan(tp=2, cp=2, seq_len=8, **ok).validate()  # 8 / (2*2) tokens a rank
    with pytest.raises(PtdError, match=r"divisible by tp\*cp = 2\*2"):
        ParallelPlan(tp=2, cp=2, seq_len=12 + 2, **ok).validate()  # 14 = 2 x 7: not by 4
    with pytest.raises(PtdError, match=r"divisible by tp \(4\)"):
        ParallelPlan(tp=4, seq_len=18, **ok).validate()


def test_describe_names_cp_only_when_on():
    base = dict(dp=1, tp=1, micro_batch=1, global_batch=1, seq_len=16)
    assert " cp2 " in f" {ParallelPlan(cp=2, **base).describe()} "
    assert "cp" not in ParallelPlan(cp=1, **base).describe().replace("rc-", "")


def _fit(n):
    return H.CollectiveFit("all_reduce", n, 1e-5 * n, 1e9)


def test_collective_fit_takes_the_nearest_group_and_the_larger_on_a_tie():
    hw = dataclasses.replace(H.get_hardware_preset("cpu"), collectives=(_fit(2), _fit(8)))
    assert hw.collective_fit("all_reduce", 2).group_size == 2
    assert hw.collective_fit("all_reduce", 4).group_size == 2   # 2 away against 4
    assert hw.collective_fit("all_reduce", 6).group_size == 8   # 4 away against 2
    assert hw.collective_fit("all_reduce", 5).group_size == 8   # 3 and 3: the larger
    assert hw.collective_fit("all_reduce", 64).group_size == 8
    assert hw.collective_fit("all_gather", 2) is None


def test_cpu_preset_waits_are_its_pairs_table_for_two_workers():
    cpu = H.get_hardware_preset("cpu")
    # its 2-worker points: (0, 0), (1.08 ms, 0.23 ms), (3.48 ms, 0.30 ms), ...
    assert cpu.blocking_wait_at(0.0, workers_per_node=2) == 0.0
    assert cpu.blocking_wait_at(2.28e-3, workers_per_node=2) == pytest.approx(0.265e-3)
    assert cpu.blocking_wait_at(1.0, workers_per_node=2) == pytest.approx(2.42e-3)
    # 4 workers: its own table; 8: the 4-worker wait, twice (a peer descheduled twice as long)
    assert cpu.blocking_wait_at(0.0, workers_per_node=4) == pytest.approx(0.19e-3)
    assert cpu.blocking_wait_at(0.0, workers_per_node=8) == pytest.approx(0.38e-3)


def test_group_waits_stand_only_for_groups_of_more_than_two():
    cpu = H.get_hardware_preset("cpu")
    hw = dataclasses.replace(cpu, blocking_wait_group_measured={4: ((0.0, 7.0),)})
    assert hw.blocking_wait_at(0.0, 2, group=2) == cpu.blocking_wait_at(0.0, 2)  # pairs' table
    assert hw.blocking_wait_at(0.0, 2, group=3) == cpu.blocking_wait_at(0.0, 2)  # none <= 3
    assert hw.blocking_wait_at(0.0, 2, group=4) == 7.0
    assert hw.blocking_wait_at(0.0, 2, group=8) == 7.0  # the largest measured below it
    with pytest.raises(PtdError, match="group .3, 4"):  # pairs belong to the other table
        dataclasses.replace(cpu, blocking_wait_group_measured={2: ((0.0, 9.0),)})


def test_cpu_preset_peak_is_its_one_worker_measured_rate():
    cpu = H.get_hardware_preset("cpu")
    for dtype in ("fp32", "bf16"):
        assert cpu.peak(dtype) == cpu.gemm_flops_measured[dtype][1]


def test_v100_has_no_tf32_units():
    # Volta's tensor cores take fp16 only: tf32 work runs on the fp32 units (datasheet 15.7)
    v100 = H.get_hardware_preset("v100")
    assert v100.peak("tf32") == v100.peak("fp32") == pytest.approx(15.7e12)
    assert v100.peak("bf16") == pytest.approx(125e12)

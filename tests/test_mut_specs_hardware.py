"""specs/hardware.py: what a sampled mutation run left untested (twenty-ninth session: 40 of
its 2,639 mutants, seed 20261130, 25 killed; docs/testing.md) -- two refusals of bad
values, the A100 presets' datasheet figures, and the cpu preset's measured per-worker tables.
Expected values from NVIDIA's A100 datasheet and by reasoning, not from the code."""

import dataclasses

import pytest

from ptd.errors import PtdError
from ptd.specs.hardware import get_hardware_preset, hardware_from_dict

G, T = 1e9, 1e12


@pytest.mark.parametrize("value", [0, 0.5])
def test_a_spine_that_adds_bandwidth_is_refused(value):
    # oversubscription is downlink over uplink bandwidth: below 1 the spine would be faster
    # than the leaves feed it
    with pytest.raises(PtdError, match="spine_oversubscription must be in"):
        dataclasses.replace(get_hardware_preset("h100-sxm"), spine_oversubscription=value)


def test_a_zero_attention_rate_in_a_profile_is_refused():
    table = {"preset": "cpu", "name": "bad",
             "attention_shapes_measured": {"fp32": {"4x8x256x32": 0}}}
    with pytest.raises(PtdError, match="must be a positive number"):
        hardware_from_dict(table, "bad")


@pytest.mark.parametrize("name,mem_gib,bw", [("a100-40g", 40, 1555 * G), ("a100-80g", 80, 2039 * G)])
def test_the_a100_presets_are_the_datasheet(name, mem_gib, bw):
    # NVIDIA A100 Tensor Core GPU datasheet (SXM): FP32 19.5, TF32 156, BF16 312 TFLOP/s
    # dense; 40 GB HBM2 at 1,555 GB/s or 80 GB HBM2e at 2,039 GB/s; NVLink 600 GB/s, 300 each
    # way; 108 SMs (A100 architecture whitepaper); DGX A100: one 200 Gb/s HDR port a GPU
    hw = get_hardware_preset(name)
    assert hw.peak_flops["fp32"] == pytest.approx(19.5 * T)
    assert hw.peak_flops["tf32"] == pytest.approx(156 * T)
    assert hw.peak_flops["bf16"] == pytest.approx(312 * T)
    assert hw.memory_bytes == mem_gib * 2**30 and hw.memory_bandwidth == pytest.approx(bw)
    assert hw.intra_node.bandwidth == pytest.approx(300 * G)
    assert hw.inter_node.bandwidth == pytest.approx(200 / 8 * G)
    assert hw.sm_count == 108


def test_the_cpu_presets_workers_never_run_faster_for_sharing_the_node():
    # per worker, a rate measured with more workers at once cannot exceed one measured with
    # fewer: they share the same cores and memory
    hw = get_hardware_preset("cpu")
    tables = [*hw.gemm_flops_measured.values(), hw.memory_bandwidth_measured]
    assert len(tables) == 3
    for t in tables:
        rates = [t[n] for n in sorted(t)]
        assert sorted(t) == [1, 2, 4]
        assert all(a >= b > 0 for a, b in zip(rates, rates[1:])), rates

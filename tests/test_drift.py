"""The machine against its profile (``ptd.runtime.calibrate.drift``): which profiles have
figures to compare with, the ratios' direction, and rates checked against independent
timings written here."""

import time

import pytest
import torch

from ptd.runtime.calibrate import drift
from ptd.specs.hardware import HardwareSpec, get_hardware_preset


def _cpu(gemm: float, bw: float) -> HardwareSpec:
    base = get_hardware_preset("cpu")
    return base.replace(gemm_flops_measured={"fp32": {1: gemm, 2: gemm / 3}},
                        memory_bandwidth_measured={1: bw, 2: bw / 5})


def test_reference_is_the_one_worker_fp32_figures():
    assert drift.reference(_cpu(7e10, 2e10)) == {"matmul_flops": 7e10, "memory_bandwidth": 2e10}
    base = get_hardware_preset("cpu")
    assert drift.reference(base.replace(gemm_flops_measured={}, memory_bandwidth_measured={})) is None
    # a rate without a bandwidth (or the reverse): nothing to compare one of them with
    assert drift.reference(base.replace(gemm_flops_measured={"fp32": {1: 7e10}},
                                        memory_bandwidth_measured={})) is None
    assert drift.reference(base.replace(gemm_flops_measured={},
                                        memory_bandwidth_measured={1: 2e10})) is None
    # only bf16 measured: no fp32 rate to compare the fp32 products with
    assert drift.reference(base.replace(gemm_flops_measured={"bf16": {1: 1e11}})) is None
    assert drift.reference(get_hardware_preset("h100-sxm")) is None  # a GPU's figures


def test_ratios_are_now_over_the_profile():
    r = drift.ratios({"matmul_flops": 5e10, "memory_bandwidth": 3e10},
                     {"matmul_flops": 1e11, "memory_bandwidth": 2e10})
    assert r == {"matmul": pytest.approx(0.5), "memory": pytest.approx(1.5)}
    assert drift.describe(None, None) is None
    line = drift.describe({"ratio": {"matmul": 0.5, "memory": 1.5}},
                          {"ratio": {"matmul": 0.93, "memory": 1.02}})
    assert "before the runs matmul 0.50x, memory 1.50x" in line
    assert "after matmul 0.93x, memory 1.02x" in line
    assert "after" not in drift.describe({"ratio": {"matmul": 1.0, "memory": 1.0}}, None)


def test_bandwidth_counts_the_buffers_each_pass_moves():
    # a copy reads one buffer and writes one, an add reads two and writes one: 10 bytes
    # each, in 0.5 and 1 s -> 40 and 30 B/s, reported as their mean
    assert drift.bandwidth(0.5, 1.0, 10) == pytest.approx(35.0)


def _best(fn, calls: int, rounds: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def test_rates_agree_with_independent_timings():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        now = drift.measure_now(window_s=0.05)
        s = drift.SIDE
        a, b = torch.randn(s, s), torch.randn(s, s)
        flops = 2.0 * s**3 / _best(lambda: a @ b, 5)  # one product, 2 s^3 FLOPs
        n = drift.MEM_BYTES // 4
        x, y, z = torch.ones(n), torch.ones(n), torch.empty(n)
        add_bw = 3 * 4 * n / _best(lambda: torch.add(x, y, out=z), 3)  # reads 2, writes 1
    finally:
        torch.set_num_threads(threads)
    # a shared 2-core machine: the same figure timed twice differs by up to ~20%; a FLOP or
    # byte count off by a factor of 2 or 3 falls outside
    assert 0.7 < now["matmul_flops"] / flops < 1.4
    assert 0.6 < now["memory_bandwidth"] / add_bw < 1.6


def test_check_compares_with_the_profile():
    now = drift.measure_now(window_s=0.05)
    # a profile that says the machine was twice as fast in matmuls, half as fast in memory
    hw = _cpu(2 * now["matmul_flops"], now["memory_bandwidth"] / 2)
    got = drift.check(hw)
    assert got["profile"] == drift.reference(hw)
    assert 0.35 < got["ratio"]["matmul"] < 0.7
    assert 1.4 < got["ratio"]["memory"] < 2.9
    assert drift.check(get_hardware_preset("h100-sxm")) is None

"""The machine against its profile (``ptd.runtime.calibrate.drift``): which profiles have
figures to compare with, the ratios' direction, and rates checked against independent
timings written here."""

import time

import pytest
import torch

from helpers import alone
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
    from ptd.runtime.calibrate.profile import memory_bandwidth
    # a copy reads one buffer and writes one, an add reads two and writes one: 10 bytes
    # each, in 0.5 and 1 s -> 40 and 30 B/s, reported as their mean (the activation pass
    # the calibration also times is not a memory figure)
    assert memory_bandwidth({"copy": 0.5, "add": 1.0, "activation": 9.0}, 10) == \
        pytest.approx(35.0)


def _best(fn, calls: int, rounds: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def _independent() -> dict[str, float]:
    """The same two figures timed the plainest way: one ``a @ b`` (2 s^3 FLOPs) and one add
    over buffers of MEM_BYTES (reads 2, writes 1), best of 5 rounds."""
    s, n = drift.SIDE, drift.MEM_BYTES // 4
    a, b = torch.randn(s, s), torch.randn(s, s)
    x, y, z = torch.ones(n), torch.ones(n), torch.empty(n)
    return {"matmul_flops": 2.0 * s**3 / _best(lambda: a @ b, 5),
            "memory_bandwidth": 3 * 4 * n / _best(lambda: torch.add(x, y, out=z), 3)}


def test_rates_agree_with_independent_timings():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ratios = {"matmul_flops": [], "memory_bandwidth": []}
    try:
        with alone():  # (no other test's processes on the cores between the timings)
            for _ in range(3):  # each figure between two independent timings, three times
                before, now, after = (_independent(), drift.measure_now(window_s=0.05),
                                      _independent())
                for k, v in ratios.items():
                    v.append(now[k] / ((before[k] + after[k]) / 2))
    finally:
        torch.set_num_threads(threads)
    # the median of three: a busy spell on a shared machine spoils one, not the verdict; a
    # FLOP or byte count off by a factor of 2 or 3 falls outside
    med = {k: sorted(v)[1] for k, v in ratios.items()}
    assert 0.6 < med["matmul_flops"] < 1.6, ratios
    assert 0.6 < med["memory_bandwidth"] < 1.6, ratios


def test_check_compares_with_the_profile(monkeypatch):
    now = {"matmul_flops": 5e10, "memory_bandwidth": 3e10}
    monkeypatch.setattr(drift, "measure_now", lambda: dict(now))
    # a profile that says the machine was twice as fast in matmuls, half as fast in memory
    hw = _cpu(1e11, 1.5e10)
    got = drift.check(hw)
    assert got["now"] == now and got["profile"] == drift.reference(hw)
    assert got["ratio"] == {"matmul": pytest.approx(0.5), "memory": pytest.approx(2.0)}
    assert drift.check(get_hardware_preset("h100-sxm")) is None

"""runtime/calibrate's fits by hand, from a sampled mutation run (30 of 1,731 mutants of
fit.py, profile.py and drift.py, seed 20261129: 25 killed; docs/testing.md): the median of
an even count, the fit with no size dependence, the link latency a profile derives from
its all-reduce fit, and when a profile can be checked for drift."""

import dataclasses

import pytest

from ptd.runtime.calibrate import drift
from ptd.runtime.calibrate.fit import fit_linear, median
from ptd.runtime.calibrate.profile import profile_table, summarize
from ptd.specs.hardware import get_hardware_preset, hardware_from_dict
from test_calibrate import _synthetic


def test_median():
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5  # the mean of the middle two
    assert median([7.0]) == 7.0


def test_a_fit_with_no_size_dependence_keeps_the_time_fixed():
    # times falling with size (noise): all of it is fixed cost, the mean; the slope a
    # thousandth of the steepest time per unit, 6 / 1
    f = fit_linear([1.0, 2.0, 4.0], [6.0, 5.0, 4.0])
    assert f.clamped
    assert f.intercept == pytest.approx(5.0)
    assert f.slope == pytest.approx(6e-3)


def test_the_profile_link_latency_is_the_fit_alpha_over_the_all_reduce_steps():
    plan, results = _synthetic()  # a 2-rank all-reduce fitted at alpha 100 us, 1 GB/s
    hw = hardware_from_dict(profile_table(summarize(plan, results), get_hardware_preset("cpu"),
                                          "synth", "cpu", 8 * 2**30, "test"), "synth")
    # 2 ranks: a ring pays 2 (n - 1) = 2 alphas, a tree 2 log2(n) = 2
    assert hw.intra_node.latency == pytest.approx(1e-4 / 2)
    assert hw.intra_node.bandwidth == pytest.approx(1e9)


def test_drift_needs_the_one_worker_rates_of_a_cpu_profile():
    cpu = get_hardware_preset("cpu")
    assert drift.reference(cpu) == {"matmul_flops": pytest.approx(90.8e9),
                                    "memory_bandwidth": pytest.approx(19.3e9)}
    no_one = dataclasses.replace(cpu, memory_bandwidth_measured={2: 14e9, 4: 6.45e9})
    assert drift.reference(no_one) is None
    assert drift.reference(get_hardware_preset("h100-sxm")) is None

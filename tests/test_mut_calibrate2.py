"""Three pieces of runtime/calibrate/profile.py that a sampled mutation run left untested
(twenty-ninth session: 40 of its 926 mutants, seed 20261130: 35 killed; docs/testing.md):
the attention stage's FLOP count at a batch above 1, the blocking wait's back-to-back base
where neither a fit nor a chunk of 0 was measured, and a CPU count the OS cannot tell.
Expected values by hand."""

import pytest

from ptd.runtime.calibrate import profile
from ptd.specs.hardware import get_hardware_preset
from test_calibrate import _synthetic


def test_attention_flops_count_every_sequence_of_the_batch():
    # b 2, 4 heads, s 128, d 32: QK^T and PV, 2 x 2 b h s^2 d = 4 x 2 x 4 x 16,384 x 32 =
    # 16,777,216 FLOPs forward without the causal mask; half of them causal (8,388,608), and
    # forward + backward 3.5 times that: 29,360,128
    assert profile.attention_flops("2x4x128x32") == 29_360_128
    assert profile.attention_flops("1x4x128x32") == 29_360_128 / 2


def test_a_blocking_wait_without_a_fit_or_a_back_to_back_point_counts_from_the_fastest_call():
    # One rank's loop after chunks of 4 and 8 products (1 and 2 ms as timed; no matmul rate,
    # so they are priced as timed), all-reduces of 0.5 and 0.8 ms, and no fit nor chunk-0
    # point to say what the call costs back to back: the fastest, 0.5 ms, is the base, so the
    # waits beyond it are 0 and 0.3 ms
    results = [{"collectives": {"blocking": {"2": {"4": [1e-3, 5e-4], "8": [2e-3, 8e-4]}}}}]
    curves = profile._blocking_curves(results, [], 2**20)
    assert list(curves) == [2]
    (c4, w4, t4, k4), (c8, w8, t8, k8) = curves[2]
    assert (c4, t4, k4, c8, t8, k8) == (1e-3, 5e-4, 1e-3, 2e-3, 8e-4, 2e-3)
    assert w4 == 0.0 and w8 == pytest.approx(3e-4)


def test_a_cpu_count_the_os_cannot_tell_is_recorded_as_none(monkeypatch):
    # HardwareSpec.cpus 0 means "not recorded" (the cost model then finds the cores from the
    # matmul table), not one core
    plan, results = _synthetic()
    summary = profile.summarize(plan, results)
    monkeypatch.setattr(profile.os, "cpu_count", lambda: None)
    table = profile.profile_table(summary, get_hardware_preset("cpu"), "synth", "cpu",
                                  8 * 2**30, "test")
    assert table["cpus"] == 0
    monkeypatch.setattr(profile.os, "cpu_count", lambda: 6)
    assert profile.profile_table(summary, get_hardware_preset("cpu"), "synth", "cpu",
                                 8 * 2**30, "test")["cpus"] == 6

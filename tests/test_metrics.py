"""The textbook formulas of ptd.cost.metrics on numbers worked by hand, chosen so that a
floor division, a swapped operator or a wrong default gives another answer (written from a
mutation run's survivors, see docs/testing.md)."""

import math

import pytest

from ptd.cost import metrics as M


def test_t_compute_and_t_comm_by_hand():
    # 10 FLOPs on 3 FLOP/s: 3.333 s, not the 3 a floor division would give
    assert M.t_compute(10.0, 3.0) == pytest.approx(10 / 3)
    assert M.t_compute(10.0, 2.0, devices=4) == pytest.approx(1.25)
    # alpha + M / B = 1 + 10 / 4 = 3.5 s; no latency unless given
    assert M.t_comm(10.0, 4.0, latency=1.0) == pytest.approx(3.5)
    assert M.t_comm(10.0, 4.0) == pytest.approx(2.5)


def test_training_time_by_hand():
    # 3 tokens x 5 FLOPs / (2 FLOP/s x 4 devices) = 15 / 8 s at full efficiency ...
    assert M.training_time(3.0, 5.0, 2.0, 4) == pytest.approx(1.875)
    # ... and twice that at 50 % efficiency
    assert M.training_time(3.0, 5.0, 2.0, 4, parallel_efficiency=0.5) == pytest.approx(3.75)


def test_amdahl_inverse_on_one_device_has_no_answer():
    assert math.isnan(M.amdahl_parallel_fraction(1.0, 1))
    # S = 1.6 on N = 2: P = (1 - 1/1.6) / (1 - 1/2) = 0.375 / 0.5 = 0.75
    assert M.amdahl_parallel_fraction(1.6, 2) == pytest.approx(0.75)


def test_fit_parallel_fraction_by_hand():
    # four points at N = 2: sum of x^2 = 4 x (1/2 - 1)^2 = 1 exactly; each gives P = 0.75
    assert M.fit_parallel_fraction([2, 2, 2, 2], [1.6] * 4) == pytest.approx(0.75)
    # N = 1 points carry nothing: alone they give no fit, beside others they change nothing
    assert math.isnan(M.fit_parallel_fraction([1, 1], [1.0, 1.0]))
    assert M.fit_parallel_fraction([1, 2], [1.0, 1.6]) == pytest.approx(0.75)


@pytest.mark.parametrize("x,want", [(None, None), (float("nan"), None), (float("inf"), None),
                                    (float("-inf"), None), (1.5, 1.5), (0.0, 0.0)])
def test_finite_or_none(x, want):
    assert M.finite_or_none(x) == want


# ------------------------------------------------------------- FLOPs per token (cost/flops.py)
def test_recompute_flops_of_a_moe_model_by_hand():
    """tiny-moe: L 4, h 64, 8 query heads of 8 (H d = 64), 4 kv heads (kv width 32), 8 SwiGLU
    experts of width 64, top 2. Per token and layer, active products: attention
    64*64 + 2*64*32 + 64*64 = 12288, two experts 2 * 3*64*64 = 24576, router 64*8 = 512:
    37376; the down projections of the two visited experts 2 * 64*64 = 8192. At s = 128
    attention's core is 4 s (H d) = 32768 per layer forward."""
    from ptd.cost.flops import flops_per_token
    from ptd.specs import get_preset
    m = get_preset("tiny-moe")
    core = 4 * 32768
    none = flops_per_token(m, 128)
    assert none.recompute == 0 and none.hardware == none.model
    assert flops_per_token(m, 128, "selective").recompute == core
    # full, stopping early (the default, PyTorch's checkpoint): all but the down projections
    assert flops_per_token(m, 128, "full").recompute == 2 * 4 * (37376 - 8192) + core
    assert flops_per_token(m, 128, "full", early_stop=False).recompute == 2 * 4 * 37376 + core
    # model FLOPs: 3 x (2 x (4 layers x 37376 + output 256 x 64) + 4 x 32768)
    assert none.model == 3 * (2 * (4 * 37376 + 256 * 64) + core)

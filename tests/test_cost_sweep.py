"""Products priced by a measured shape sweep (``gemm_shapes_measured`` from ``ptd calibrate``).

Expected values are worked out by hand: inverse-distance weights in log2 space, and the
roofline time of one product.
"""

from __future__ import annotations

import dataclasses

import pytest

from ptd.cost.compute import Gemm, gemm_time, shape_fraction
from ptd.errors import PtdError
from ptd.specs.hardware import get_hardware_preset, hardware_from_dict


def _cpu(table: dict) -> object:
    return dataclasses.replace(get_hardware_preset("cpu"), gemm_shapes_measured=table)


def test_measured_shape_gives_its_own_value() -> None:
    hw = _cpu({"fp32": {"64x64x64": 1.0, "256x64x64": 0.5}})
    assert shape_fraction(hw, "fp32", 64, 64, 64) == 1.0
    assert shape_fraction(hw, "fp32", 256, 64, 64) == 0.5
    assert shape_fraction(hw, "bf16", 64, 64, 64) is None  # no sweep for that dtype


def test_between_and_beyond_the_sweep_by_hand() -> None:
    hw = _cpu({"fp32": {"64x64x64": 1.0, "256x64x64": 0.5}})
    # m = 128: log2 distance 1 to both points, equal weights: (1.0 + 0.5) / 2
    assert shape_fraction(hw, "fp32", 128, 64, 64) == pytest.approx(0.75)
    # m = 1024: squared distances 16 and 4, weights 1/16 and 1/4:
    # (1.0/16 + 0.5/4) / (1/16 + 1/4) = 0.1875 / 0.3125 = 0.6 (no extrapolation past 0.5's side)
    assert shape_fraction(hw, "fp32", 1024, 64, 64) == pytest.approx(0.6)


def test_product_time_follows_the_sweep() -> None:
    hw = _cpu({"fp32": {"64x64x64": 0.5}})
    g, rate = Gemm(64, 64, 64), 80e9
    flops = 2 * 64**3
    # bandwidth far beyond the products' bytes: compute-bound, time = flops / (rate * 0.5)
    assert gemm_time(g, rate, 1e30, 4, hw, "fp32") == pytest.approx(flops / (rate * 0.5))
    assert gemm_time(g, rate, 1e30, 4, hw, "bf16") == pytest.approx(flops / rate)
    assert gemm_time(g, rate, 1e30, 4, hw) == pytest.approx(flops / rate)  # dtype unknown


@pytest.mark.parametrize("table, what", [
    ({"fp32": {"64x64": 1.0}}, "is not MxNxK"),
    ({"fp32": {"64x0x64": 1.0}}, "is not MxNxK"),
    ({"fp32": {"64x64x64": -1.0}}, "must be > 0"),
    ({"fp32": 3.0}, "must be a table"),
])
def test_bad_sweep_is_refused_in_one_line(table: dict, what: str) -> None:
    with pytest.raises(PtdError, match=what):
        hardware_from_dict({"preset": "cpu", "gemm_shapes_measured": table}, "x")

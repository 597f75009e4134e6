"""cost/tpmodes.py: every field of the 1D/2D/2.5D/3D factors, the mesh-side root and each
refusal, worked by hand from the module docstring's table (written from the survivors of a
mutation run, docs/testing.md). Torch-free.

The table, per device, relative to the unsplit layer:

    mode  devices  compute    params  activations  bandwidth          latency
    1d    P        1/P        1/P     1            2(P-1)/P           2(P-1)
    2d    q^2      1/q^2      1/q^2   1/q^2        6(q-1)/q           6(q-1)
    2.5d  q^2 d    1/(d q^2)  1/q^2   1/(d q^2)    3(q-1)(d+1)/(d q)  6(q-1)
    3d    q^3      1/q^3      1/q^3   1/q^3        6(q-1)/q^3         6(q-1)
"""

import dataclasses

import pytest

from ptd.cost.tpmodes import MODES, TPModeCost, tp_mode_cost
from ptd.errors import PtdError


def fields(c):
    return (c.mode, c.devices, c.q, c.depth, c.compute, c.params, c.activations,
            c.bandwidth, c.latency)


@pytest.mark.parametrize("mode,p,d,expected", [
    # 1d, P = 3: compute/params 1/3, activations replicated, bandwidth 2*2/3, latency 2*2
    ("1d", 3, 1, ("1d", 3, 3, 1, 1 / 3, 1 / 3, 1.0, 4 / 3, 4)),
    # 1d, P = 1: nothing to exchange: 2*0/1 = 0, 2*0 = 0
    ("1d", 1, 1, ("1d", 1, 1, 1, 1.0, 1.0, 1.0, 0.0, 0)),
    # 2d, P = 9, q = 3: 1/9 each, bandwidth 6*2/3 = 4, latency 6*2 = 12
    ("2d", 9, 1, ("2d", 9, 3, 1, 1 / 9, 1 / 9, 1 / 9, 4.0, 12)),
    # 2d, P = 1, q = 1 (1 is 1^2): bandwidth 6*0/1 = 0
    ("2d", 1, 1, ("2d", 1, 1, 1, 1.0, 1.0, 1.0, 0.0, 0)),
    # 2.5d, P = 18, d = 2, q = 3: compute 1/(2*9) = 1/18, params 1/9, activations 1/18,
    # bandwidth 3*2*3/(2*3) = 3, latency 6*2 = 12
    ("2.5d", 18, 2, ("2.5d", 18, 3, 2, 1 / 18, 1 / 9, 1 / 18, 3.0, 12)),
    # 2.5d, P = 12, d = 3, q = 2: compute 1/12, params 1/4, activations 1/12,
    # bandwidth 3*1*4/(3*2) = 2, latency 6
    ("2.5d", 12, 3, ("2.5d", 12, 2, 3, 1 / 12, 1 / 4, 1 / 12, 2.0, 6)),
    # 2.5d, P = 4, d = 1, q = 2: bandwidth 3*1*2/(1*2) = 3 (2d's 6*1/2)
    ("2.5d", 4, 1, ("2.5d", 4, 2, 1, 1 / 4, 1 / 4, 1 / 4, 3.0, 6)),
    # 3d, P = 27, q = 3: 1/27 each, bandwidth 6*2/27 = 4/9, latency 12
    ("3d", 27, 1, ("3d", 27, 3, 1, 1 / 27, 1 / 27, 1 / 27, 4 / 9, 12)),
    # 3d, P = 64, q = 4: bandwidth 6*3/64 = 0.28125, latency 18
    ("3d", 64, 1, ("3d", 64, 4, 1, 1 / 64, 1 / 64, 1 / 64, 0.28125, 18)),
    # 3d, P = 1, q = 1
    ("3d", 1, 1, ("3d", 1, 1, 1, 1.0, 1.0, 1.0, 0.0, 0)),
])
def test_every_field_by_hand(mode, p, d, expected):
    got = fields(tp_mode_cost(mode, p, d))
    assert got[:4] == expected[:4]
    assert got[4:] == pytest.approx(expected[4:], rel=1e-15, abs=0)


def test_depth_defaults_to_one():
    assert tp_mode_cost("2.5d", 4).depth == 1
    assert tp_mode_cost("2.5d", 4).q == 2


def test_mesh_side_of_every_square_and_cube():
    # q^2 and q^3 give back q, whatever p ** (1/k) rounds to in floating point
    for q in range(1, 101):
        assert tp_mode_cost("2d", q * q).q == q
    for q in range(1, 41):
        assert tp_mode_cost("3d", q ** 3).q == q


@pytest.mark.parametrize("p", [2, 3, 5, 8, 15, 17, 99, 101])
def test_non_squares_are_refused(p):
    with pytest.raises(PtdError, match=rf"2d tensor parallelism needs tp = q\^2, got {p}$"):
        tp_mode_cost("2d", p)


@pytest.mark.parametrize("p", [2, 4, 7, 9, 26, 28, 63, 65])
def test_non_cubes_are_refused(p):
    with pytest.raises(PtdError, match=rf"3d tensor parallelism needs tp = q\^3, got {p}$"):
        tp_mode_cost("3d", p)


def test_refusals_and_their_messages():
    with pytest.raises(PtdError, match=r"^tp mode must be one of 1d, 2d, 2.5d, 3d, got '4d'$"):
        tp_mode_cost("4d", 8)
    for mode in MODES:
        with pytest.raises(PtdError, match="^tp and depth must be positive$"):
            tp_mode_cost(mode, 0)
    with pytest.raises(PtdError, match="^tp and depth must be positive$"):
        tp_mode_cost("2.5d", 8, 0)
    for mode in ("1d", "2d", "3d"):
        with pytest.raises(PtdError, match="^--depth applies to --tp-mode 2.5d only$"):
            tp_mode_cost(mode, 8, 2)
    # 8 = q^2 * 3 has no integer q (8 % 3 = 2)
    with pytest.raises(PtdError, match=r"needs tp = q\^2 \* depth, got tp 8, depth 3$"):
        tp_mode_cost("2.5d", 8, 3)
    # 8 / 2 = 4 = 2^2 but 8 / 4 = 2 is not a square
    with pytest.raises(PtdError, match=r"got tp 8, depth 4$"):
        tp_mode_cost("2.5d", 8, 4)
    # 4 / 4 = 1 = 1^2: q = 1 is data parallelism over the depth
    with pytest.raises(PtdError, match=r"needs q >= 2 \(tp 4 at depth 4 is q = 1"):
        tp_mode_cost("2.5d", 4, 4)
    with pytest.raises(PtdError, match=r"needs q >= 2"):
        tp_mode_cost("2.5d", 1, 1)


def test_comm_time_is_alpha_beta():
    # 2d at 16 (q 4): latency 18, bandwidth 4.5: 18 * 1e-5 + 4.5 * 1e8 / 1e10 = 0.04518
    c = tp_mode_cost("2d", 16)
    assert c.comm_time(1e8, 1e-5, 1e10) == pytest.approx(0.04518, rel=1e-12, abs=0)
    # 1d at 2: latency 2, bandwidth 1: 2 * 0.5 + 1 * 6 / 3 = 3
    assert tp_mode_cost("1d", 2).comm_time(6.0, 0.5, 3.0) == pytest.approx(3.0, rel=1e-15, abs=0)


def test_to_dict_and_frozen():
    d = tp_mode_cost("3d", 8).to_dict()
    # q 2: 1/8 each; bandwidth 6*1/8 = 0.75; latency 6
    assert d == {"mode": "3d", "devices": 8, "q": 2, "depth": 1, "compute": 0.125,
                 "params": 0.125, "activations": 0.125, "bandwidth": 0.75, "latency": 6}
    with pytest.raises(dataclasses.FrozenInstanceError):
        tp_mode_cost("1d", 2).q = 3  # type: ignore[misc]
    assert dataclasses.is_dataclass(TPModeCost)


@pytest.mark.parametrize("mode,p,q", [("1d", 4, 4), ("2d", 4, 2), ("2.5d", 4, 2), ("3d", 8, 2)])
def test_mode_names_built_at_run_time(mode, p, q):
    # the CLI's --tp-mode is a string read from argv, not the interned literal: the modes are
    # compared by value
    name = "".join(list(mode))
    assert name == mode
    c = tp_mode_cost(name, p)
    assert (c.mode, c.q) == (mode, q)


def test_2p5d_needs_depth_to_divide_tp():
    # 13 // 3 = 4 = 2^2, but 13 = q^2 * 3 has no integer q: refused (not q = 2)
    with pytest.raises(PtdError, match=r"needs tp = q\^2 \* depth, got tp 13, depth 3$"):
        tp_mode_cost("2.5d", 13, 3)

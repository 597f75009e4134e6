"""1D/2D/2.5D/3D tensor parallelism factors (ptd calc --tp-mode), against the Colossal-AI
documentation's tables worked out by hand for small meshes."""

import json

import pytest

from ptd.cost.tpmodes import tp_mode_cost
from ptd.errors import PtdError


def test_factors_by_hand():
    one = tp_mode_cost("1d", 4)  # 2(P-1)/P = 1.5, 2(P-1) = 6, activations replicated
    assert (one.params, one.activations, one.bandwidth, one.latency) == (0.25, 1.0, 1.5, 6)
    two = tp_mode_cost("2d", 16)  # q 4: 6*3/4 = 4.5, 6*3 = 18
    assert (two.q, two.params, two.activations, two.bandwidth, two.latency) == (4, 1 / 16, 1 / 16, 4.5, 18)
    tess = tp_mode_cost("2.5d", 8, depth=2)  # q 2, d 2: 3*1*3/(2*2) = 2.25; params 1/q^2
    assert (tess.q, tess.params, tess.activations, tess.bandwidth, tess.latency) == (2, 0.25, 0.125, 2.25, 6)
    cube = tp_mode_cost("3d", 8)  # q 2: 6*1/8 = 0.75
    assert (cube.q, cube.params, cube.bandwidth, cube.latency) == (2, 0.125, 0.75, 6)
    # 2.5d with depth 1 is 2d's bandwidth: 3(q-1)*2/q = 6(q-1)/q
    assert tp_mode_cost("2.5d", 16, 1).bandwidth == tp_mode_cost("2d", 16).bandwidth


@pytest.mark.parametrize("mode,p,d,match", [("2d", 8, 1, r"q\^2"), ("3d", 9, 1, r"q\^3"),
                                             ("2.5d", 12, 2, r"q\^2 \* depth"), ("2d", 4, 2, "depth")])
def test_bad_shapes(mode, p, d, match):
    with pytest.raises(PtdError, match=match):
        tp_mode_cost(mode, p, d)


def test_calc_tp_mode(ptd_cli):
    rc, out, err = ptd_cli("calc", "--tp-mode", "2.5d", "--devices", "8", "--depth", "2",
                           "--comm-bytes", "1e8", "--bandwidth", "1e10", "--latency", "1e-5", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["t_comm_s"] == pytest.approx(6 * 1e-5 + 2.25 * 1e8 / 1e10)
    assert d["tp_mode"] == "2.5d" and d["tp_mode_factors"]["bandwidth"] == 2.25
    rc, out, err = ptd_cli("calc", "--tp-mode", "2d", "--devices", "8")
    assert rc == 2 and err.count("\n") == 1 and "tp = q^2" in err
    rc, out, err = ptd_cli("calc", "--depth", "2")
    assert rc == 2 and "--depth applies to --tp-mode 2.5d only" in err
    rc, out, err = ptd_cli("calc", "--tp-mode", "1d", "--topology", "ring")
    assert rc == 2 and "drop --topology" in err

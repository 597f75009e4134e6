"""ptd calc and the metric formulas: the worked examples everyone checks first."""

import re
import json

import pytest

from ptd.cost import metrics as m


def test_worked_examples():
    assert m.t_compute(1e18, 1e15, 8) == pytest.approx(125.0)
    assert m.t_comm(1e9, 1e6, 0.1) == pytest.approx(1000.1)
    assert m.throughput(1e6, 1000) == pytest.approx(1000.0)
    assert m.amdahl_speedup(0.95, 8) == pytest.approx(5.925925, rel=1e-6)
    assert round(m.amdahl_speedup(0.95, 8), 2) == 5.93


def test_amdahl_inverse_and_fit():
    for p in (0.5, 0.9, 0.99):
        for n in (2, 4, 64):
            assert m.amdahl_parallel_fraction(m.amdahl_speedup(p, n), n) == pytest.approx(p)
    ns = [1, 2, 4, 8]
    assert m.fit_parallel_fraction(ns, [m.amdahl_speedup(0.8, n) for n in ns]) == pytest.approx(0.8)


def test_efficiency_speedup_mfu():
    assert m.efficiency(3.0, 4.0) == 0.75
    assert m.speedup(10.0, 4.0) == 2.5
    assert m.scaling_efficiency(2.5, 4) == 0.625
    assert m.t_total(3.0, 2.0, overlap=0.5) == 4.0
    # 1e12 FLOPs/token at 100 tokens/s on one 1e15 device: 10% MFU.
    assert m.mfu(1e12, 100, 1e15, 1) == pytest.approx(0.1)
    assert m.training_time(1e6, 6e9, 1e12, 2, 0.5) == pytest.approx(1e6 * 6e9 / (1e12 * 2 * 0.5))


def test_calc_cli_json_keys(ptd_cli):
    rc, out, _ = ptd_cli("calc", "--flops", "1e18", "--device-flops", "1e15", "--devices", "8",
                         "--comm-bytes", "1e9", "--bandwidth", "1e6", "--latency", "0.1",
                         "--samples", "1e6", "--t-single", "8000", "--parallel-fraction", "0.95",
                         "--json")
    assert rc == 0
    d = json.loads(out)
    assert list(d) == ["t_compute_s", "t_comm_s", "t_total_s", "efficiency",
                       "throughput_samples_per_s", "speedup", "amdahl_speedup",
                       "topology", "servers", "link_bytes", "tp_mode", "tp_mode_factors"]
    assert d["t_compute_s"] == pytest.approx(125.0)
    assert d["t_comm_s"] == pytest.approx(1000.1)
    assert d["t_total_s"] == pytest.approx(1125.1)
    assert d["efficiency"] == pytest.approx(125 / 1125.1)
    assert d["throughput_samples_per_s"] == pytest.approx(1e6 / 1125.1)
    assert d["speedup"] == pytest.approx(8000 / 1125.1)
    assert d["amdahl_speedup"] == pytest.approx(5.925925, rel=1e-6)


def test_calc_cli_measured_time_and_table(ptd_cli):
    rc, out, _ = ptd_cli("calc", "--samples", "1e6", "--time", "1000", "--json")
    assert json.loads(out)["throughput_samples_per_s"] == pytest.approx(1000.0)
    rc, out, _ = ptd_cli("calc", "--parallel-fraction", "0.95", "--devices", "8")
    assert rc == 0 and "amdahl_speedup" in out and "5.92593" in out


@pytest.mark.parametrize("argv", [
    ["calc", "--devices", "-3"],
    ["calc", "--flops", "abc"],
    ["calc", "--parallel-fraction", "1.5"],
    ["calc", "--bandwidth", "0"],
    ["calc", "--nope"],
    ["nosuchcommand"],
])
def test_calc_bad_input_one_line_exit_2(ptd_cli, argv):
    rc, out, err = ptd_cli(*argv)
    assert rc == 2
    assert err.count("\n") == 1 and re.match(r"ptd( calc)?: error: ", err)
    assert "Traceback" not in err

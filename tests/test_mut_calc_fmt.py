"""`ptd calc`'s topologies and fmt.py's numbers for people, by hand, from a sampled mutation
run (30 of 592 mutants, seed 20261129: 10 killed; docs/testing.md)."""

import json

import pytest

from ptd import fmt


def test_ring_all_reduce_by_hand(ptd_cli):
    # 4 ranks, 1 GB, 10 GB/s, 10 us: 2 x 3 latencies + 2 x 3/4 of the message over the link
    rc, out, err = ptd_cli("calc", "--topology", "ring", "--comm-bytes", "1e9", "--devices", "4",
                           "--bandwidth", "1e10", "--latency", "1e-5", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["t_comm_s"] == pytest.approx(6e-5 + 1.5e9 / 1e10)
    assert d["link_bytes"] == pytest.approx(1.5e9)
    # point to point: one latency and the whole message
    rc, out, _ = ptd_cli("calc", "--comm-bytes", "1e9", "--devices", "4", "--bandwidth", "1e10",
                         "--latency", "1e-5", "--json")
    assert json.loads(out)["t_comm_s"] == pytest.approx(1e-5 + 0.1)


@pytest.mark.parametrize("topology", ["ring", "p2p"])
def test_servers_belong_to_the_parameter_server_topology(ptd_cli, topology):
    rc, _, err = ptd_cli("calc", "--topology", topology, "--servers", "2", "--comm-bytes", "1e9",
                         "--devices", "4", "--bandwidth", "1e10")
    assert rc == 2 and "--servers applies to --topology ps only" in err


def test_bytes_switch_unit_at_exactly_one_of_the_larger():
    assert fmt.gib(1023) == "1023 B"
    assert fmt.gib(1024) == "1 KiB"
    assert fmt.gib(1536) == "1.5 KiB"
    assert fmt.gib(2**20) == "1 MiB"
    assert fmt.gib(3 * 2**30) == "3 GiB"
    assert fmt.gib(2**40) == "1 TiB"
    assert fmt.gib(1234567) == "1.18 MiB"  # three significant digits by default
    assert fmt.gib(1234567, digits=4) == "1.177 MiB"


def test_percent():
    assert fmt.pct(0.123) == "12.3%"
    assert fmt.pct(1.0, digits=0) == "100%"
    assert fmt.pct(None) == "-"


def test_step_ranges():
    assert fmt.step_ranges([8, 1, 2, 3, 5, 7, 2]) == "1-3, 5, 7-8"
    assert fmt.step_ranges([4]) == "4"
    assert fmt.step_ranges([1, 3]) == "1, 3"
    assert fmt.step_ranges([]) == ""


def test_table_pads_short_rows_and_aligns_text_left_numbers_right():
    t = fmt.table([["a", "1"], ["bbb"]], header=["name", "n"])
    assert t.splitlines() == ["name  n", "----  -", "a     1", "bbb"]
    # a column whose first body cell is a number (units, % and x allowed) goes right
    t = fmt.table([["x", "12%", "3 ms"], ["yy", "5%", "10 ms"]], header=["k", "p", "t"])
    assert t.splitlines()[2:] == ["x   12%   3 ms", "yy   5%  10 ms"]

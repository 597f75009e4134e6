"""Parameter server against the ring all-reduce: ``ptd calc --topology ps|ring`` and
``ptd estimate --dp-comm ps --servers S``, expected values worked out by hand from
t_ps = 2 (max(N, S) alpha + max(N/S, 1) M/B) and t_ring = 2 (N-1) alpha + 2 (N-1)/N M/B."""

import json

import pytest

from ptd.cost import ps
from ptd.specs import load_hardware, load_model

CALC = ["calc", "--devices", "16", "--comm-bytes", "1e9", "--bandwidth", "1e10", "--latency", "1e-5"]


def test_formulas_by_hand():
    # N 16 workers, S 4 servers, 1 GB at 10 GB/s, 10 us: 2 (16e-5 + 4 * 0.1)
    assert ps.ps_time(1e9, 16, 4, 1e-5, 1e10) == pytest.approx(0.80032)
    # more servers than workers: the workers' links bound it, 8 messages each way
    assert ps.ps_time(1e9, 4, 8, 1e-5, 1e10) == pytest.approx(2 * (8e-5 + 0.1))
    assert ps.ps_server_link_bytes(1e9, 16, 4) == 8e9
    # ring: 2*15*1e-5 + 2*15/16*0.1
    assert ps.ring_allreduce_time(1e9, 16, 1e-5, 1e10) == pytest.approx(3e-4 + 0.1875)
    # with S = N servers the bandwidth term 2 M/B still exceeds the ring's 2 (N-1)/N M/B
    assert ps.ps_time(1e9, 16, 16, 0, 1e10) == pytest.approx(0.2)
    assert ps.ring_allreduce_time(1e9, 16, 0, 1e10) == pytest.approx(0.1875)
    with pytest.raises(ValueError):
        ps.ps_time(1e9, 16, 0, 0, 1e10)


def test_calc_topologies(ptd_cli):
    rc, out, err = ptd_cli(*CALC, "--topology", "ps", "--servers", "4", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["t_comm_s"] == pytest.approx(0.80032)
    assert d["link_bytes"] == pytest.approx(8e9)
    assert (d["topology"], d["servers"]) == ("ps", 4)
    rc, out, _ = ptd_cli(*CALC, "--topology", "ring", "--json")
    d = json.loads(out)
    assert d["t_comm_s"] == pytest.approx(0.1878) and d["link_bytes"] == pytest.approx(1.875e9)
    rc, out, _ = ptd_cli(*CALC, "--json")  # default: one transfer, as before
    d = json.loads(out)
    assert d["t_comm_s"] == pytest.approx(0.10001) and d["topology"] == "p2p" and d["servers"] is None
    rc, out, _ = ptd_cli(*CALC, "--topology", "ps", "--servers", "4")
    assert rc == 0 and "0.80032" in out


def test_estimate_dp_comm_ps_by_hand(ptd_cli):
    hw, m = load_hardware("h100-sxm"), load_model("llama3-8b")
    base = ["estimate", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "64",
            "--zero", "0", "--micro-batch", "1", "--recompute", "full", "--json"]
    grad_bytes = 4 * m.param_count()  # fp32 gradients of the whole model (tp 1, pp 1)
    link = hw.inter_node
    for s in (4, 64, 128):
        rc, out, err = ptd_cli(*base, "--dp-comm", "ps", "--servers", str(s))
        assert rc == 0, err
        d = json.loads(out)
        want = 2 * (max(64, s) * link.latency + max(64 / s, 1) * grad_bytes / link.effective_bandwidth)
        assert d["step_time_s"]["dp_comm_total"] == pytest.approx(want, rel=1e-9)
        assert (d["dp_comm"], d["servers"]) == ("ps", s)
    rc, out, _ = ptd_cli(*base)
    d = json.loads(out)
    assert d["dp_comm"] == "allreduce" and d["servers"] is None
    # 64 replicas on 8 nodes: all-reduce is far cheaper than 4 servers
    assert d["step_time_s"]["dp_comm_total"] < 2 * 16 * grad_bytes / link.effective_bandwidth


@pytest.mark.parametrize("cmd,match", [
    (["calc", "--topology", "ps", "--servers", "0", "--comm-bytes", "1"], "--servers: expected a positive integer"),
    (["calc", "--topology", "ps", "--comm-bytes", "1"], "--topology ps needs --servers"),
    (["calc", "--topology", "ring", "--servers", "2"], "--servers applies to --topology ps only"),
    (["estimate", "--model", "tiny", "--dp-comm", "ps"], "--dp-comm ps and --servers S go together"),
    (["estimate", "--model", "tiny", "--servers", "-1"], "--servers: expected a positive integer"),
    (["estimate", "--model", "tiny", "--dp-comm", "ps", "--servers", "2", "--zero", "3"], "prices zero 0"),
    # ZeRO-1 reduce-scatters FSDP's shards (runtime/parallel/fsdp.py): no whole gradients to push
    (["estimate", "--model", "tiny", "--dp-comm", "ps", "--servers", "2", "--zero", "1"], "not zero 1"),
    (["plan", "--model", "tiny", "--dp-comm", "ps", "--servers", "2", "--fix", "zero=1"], "prices zero 0"),
])
def test_bad_ps_input_is_one_line_exit_2(ptd_cli, cmd, match):
    rc, out, err = ptd_cli(*cmd)
    assert rc == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("ptd"), err
    assert match in err, err


def test_new_flags_in_help(capsys):
    from ptd.cli import main
    for cmd, flags in (("calc", ("--topology", "--servers", "--tp-mode", "--depth")),
                       ("estimate", ("--cp", "--dp-comm", "--servers")),
                       ("plan", ("--cp", "--dp-comm", "--servers")),
                       ("train", ("--cp",))):
        with pytest.raises(SystemExit) as ex:
            main([cmd, "--help"])
        assert ex.value.code == 0
        out = capsys.readouterr().out
        for f in flags:
            assert f in out, (cmd, f)


def test_cluster_crossover_table_by_hand():
    from ptd.bench.ps_table import ps_crossover, render_ps
    from ptd.cost.comm import collective_time
    hw, m = load_hardware("h100-sxm"), load_model("llama3-8b")
    rows = ps_crossover(m, hw, [8, 64], 8)
    M, link = 4 * m.param_count(), hw.inter_node
    r8 = rows[0]
    # S = N = 8: 2 (8 alpha + M/B) over the inter-node link of each worker
    assert r8["ps_s"]["8"] == pytest.approx(2 * (8 * link.latency + M / link.effective_bandwidth))
    assert r8["ps_s"]["1"] == pytest.approx(2 * (8 * link.latency + 8 * M / link.effective_bandwidth))
    assert r8["allreduce_s"] == collective_time("all_reduce", M, 8, hw, 1, 8)
    # one node: NVLink all-reduce; every server costs each worker 2 M over its NIC: never matched
    assert r8["servers_to_match"] is None and rows[1]["servers_to_match"] is None
    assert rows[1]["server_link_bytes_at_n"] == 2 * M
    text = render_ps({"model": "llama3-8b", "ps": rows})
    assert "servers to match" in text and "none <= 4N" in text


def test_edges_by_hand():
    """The guards and the uneven cases (written from a mutation run's survivors)."""
    # 5 workers on 4 servers: a server's link carries 2 x 3 x 5 / 4 = 7.5 bytes of M = 3 (not
    # the 7 of a floor division); on 2 servers a phase takes max(5, 2) alpha + 5/2 M/B
    assert ps.ps_server_link_bytes(3.0, 5, 4) == pytest.approx(7.5)
    assert ps.ps_time(3.0, 5, 2, alpha=1.0, bandwidth=1.0) == pytest.approx(2 * (5 + 2.5 * 3))
    # one worker still pushes and pulls (a real server), one byte is still a transfer
    assert ps.ps_time(1.0, 1, 1, alpha=1.0, bandwidth=2.0) == pytest.approx(2 * (1 + 0.5))
    assert ps.ps_time(1.0, 2, 1, alpha=0.0, bandwidth=1.0) == pytest.approx(4.0)
    # nothing to send, or no worker: free
    for nbytes, n in ((0.0, 4), (-1.0, 4), (8.0, 0)):
        assert ps.ps_time(nbytes, n, 2, alpha=1.0, bandwidth=1.0) == 0.0
    # the ring: one rank or no bytes is free; 2 ranks, 1 byte: 2 alpha + 2 (1/2) M/B
    assert ps.ring_allreduce_time(8.0, 1, 1.0, 1.0) == 0.0
    assert ps.ring_allreduce_time(0.0, 4, 1.0, 1.0) == 0.0
    assert ps.ring_allreduce_time(-1.0, 4, 1.0, 1.0) == 0.0
    assert ps.ring_allreduce_time(8.0, 0, 1.0, 1.0) == 0.0
    assert ps.ring_allreduce_time(1.0, 2, alpha=1.0, bandwidth=1.0) == pytest.approx(2 + 1)
    assert ps.ring_allreduce_time(1.0, 2, alpha=0.0, bandwidth=4.0) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="servers must be >= 1"):
        ps.ps_time(1.0, 2, 0, 1.0, 1.0)


def test_dp_ps_time_uses_the_network_and_is_free_for_one_replica():
    from types import SimpleNamespace
    link = SimpleNamespace(latency=1.0, effective_bandwidth=2.0)
    hw = SimpleNamespace(inter_node=link)
    assert ps.dp_ps_time(8.0, 1, 2, hw) == 0.0
    # 2 replicas, 2 servers: 2 x (max(2, 2) x 1 + max(1, 1) x 8 / 2) = 12 s
    assert ps.dp_ps_time(8.0, 2, 2, hw) == pytest.approx(12.0)

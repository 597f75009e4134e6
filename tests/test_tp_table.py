"""The cluster-scale table of tensor-parallel modes (ptd.bench.tp_table), worked out by hand
for the tiny model on hand-made links (helpers.toy_links: NVLink 50 GB/s effective and 2 us,
network 8 GB/s and 10 us), from Colossal-AI's per-layer factors as cost/tpmodes.py cites
them."""

from __future__ import annotations

import pytest

from helpers import toy_links
from ptd.bench.tp_table import tp_modes_table
from ptd.specs import get_preset

# tiny: hidden 64, q 64, kv 32, SwiGLU 128. Its 7 linear layers (in, out): (64,64), (64,32),
# (64,32), (64,64), (64,128), (64,128), (128,64). At 256 tokens in bf16 the larger
# activation of each is 2*256*max(in, out) bytes: sum of max = 640, so 327,680 bytes in all.
M_SUM = 2 * 256 * 640
WEIGHTS = 2 * (64 * 64 + 64 * 32 + 64 * 32 + 64 * 64 + 64 * 128 + 64 * 128 + 128 * 64)  # 73,728
ACTS = 2 * 256 * (64 + 64 + 64 + 64 + 64 + 64 + 128)  # inputs: 262,144


def rows() -> dict[tuple[int, str], dict]:
    table = tp_modes_table(get_preset("tiny"), toy_links(), 256, devices_per_node=8,
                           degrees=(4, 8, 16))
    return {(r["tp"], r["mode"]): r for r in table}


def test_which_modes_each_degree_allows() -> None:
    # 4 = 2^2 (2d), 8 = 2^2 * 2 (2.5d, depth 2) = 2^3 (3d), 16 = 4^2 (2d); 1d always
    assert sorted(rows()) == [(4, "1d"), (4, "2d"), (8, "1d"), (8, "2.5d"), (8, "3d"),
                              (16, "1d"), (16, "2d")]


def test_2d_on_four_devices_by_hand() -> None:
    r = rows()[(4, "2d")]  # q = 2: bandwidth 6(q-1)/q = 3, latency 6(q-1) = 6 per layer
    assert r["comm_per_block_s"] == pytest.approx(7 * 6 * 2e-6 + 3 * M_SUM / 50e9)
    assert r["weights_per_device_bytes"] == pytest.approx(WEIGHTS / 4)
    assert r["activations_per_device_bytes"] == pytest.approx(ACTS / 4)


def test_1d_on_four_devices_by_hand() -> None:
    r = rows()[(4, "1d")]  # bandwidth 2(P-1)/P = 1.5, latency 2(P-1) = 6 per layer
    assert r["comm_per_block_s"] == pytest.approx(7 * 6 * 2e-6 + 1.5 * M_SUM / 50e9)
    assert r["activations_per_device_bytes"] == pytest.approx(ACTS)  # whole on every rank


def test_past_a_node_the_network_carries_it() -> None:
    r = rows()[(16, "2d")]  # q = 4: bandwidth 6*3/4 = 4.5, latency 18; 16 > 8 per node
    assert r["link"] == "inter-node"
    assert r["comm_per_block_s"] == pytest.approx(7 * 18 * 10e-6 + 4.5 * M_SUM / 8e9)
    r = rows()[(8, "2.5d")]  # q = 2, d = 2: params 1/q^2, activations 1/(d q^2)
    assert r["weights_per_device_bytes"] == pytest.approx(WEIGHTS / 4)
    assert r["activations_per_device_bytes"] == pytest.approx(ACTS / 8)


def test_estimate_prices_a_mode_beside_the_1d_plan(ptd_cli) -> None:
    import json
    args = ["estimate", "--model", "llama3-70b", "--hardware", "h100-sxm", "--gpus", "64",
            "--tp", "8", "--pp", "2", "--json"]
    rc, out, err = ptd_cli(*args)
    assert rc == 0, err
    plain = json.loads(out)
    rc, out, err = ptd_cli(*args, "--tp-mode", "3d")
    assert rc == 0, err
    d = json.loads(out)
    mode = d.pop("tp_mode")
    assert d == plain  # the plan ptd trains (1d) is priced as before
    st = plain["step_time_s"]
    # 70B on pp 2: 40 blocks on the busiest rank, one pass of them per micro-batch: 512
    # sequences over dp 4 and the chosen micro-batch
    blocks = 40 * 512 // (4 * plain["plan"]["micro_batch"])
    assert mode["tp_comm_s"] == pytest.approx(blocks * mode["comm_per_block_s"])
    assert mode["step_time_s"] == pytest.approx(st["total"] - st["tp_comm"] + mode["tp_comm_s"])
    assert mode["priced_only"] is True and mode["q"] == 2
    # the table's own row for one block of the same model, tp 8, 3d
    from ptd.bench.tp_table import tp_modes_table
    from ptd.specs import get_preset, load_hardware
    tokens = 8192 * plain["plan"]["micro_batch"]  # a micro-batch's
    row = [r for r in tp_modes_table(get_preset("llama3-70b"), load_hardware("h100-sxm"), tokens,
                                     8, (8,)) if r["mode"] == "3d"][0]
    assert mode["comm_per_block_s"] == pytest.approx(row["comm_per_block_s"])


@pytest.mark.parametrize("flags, why", [
    (["--tp", "8", "--tp-mode", "2d"], "2d tensor parallelism needs tp = q^2, got 8"),
    (["--tp-mode", "3d"], "--tp-mode 3d needs --tp > 1"),
    (["--tp", "4", "--depth", "2"], "--depth applies to --tp-mode 2.5d only"),
])
def test_estimate_tp_mode_bad_input_is_one_line(ptd_cli, flags, why) -> None:
    rc, out, err = ptd_cli("estimate", "--model", "llama3-8b", "--gpus", "8", *flags)
    assert rc == 2 and out == "" and err.count("\n") == 1 and why in err


def test_plan_reports_the_best_plan_of_each_mode(ptd_cli) -> None:
    import json
    from ptd.bench.tp_table import mode_delta
    from ptd.specs import ClusterSpec, load_hardware
    rc, out, err = ptd_cli("plan", "--model", "llama3-70b", "--hardware", "h100-sxm", "--gpus", "64",
                           "--global-batch", "512", "--seq-len", "4096", "--top", "1",
                           "--tp-modes", "1d,2d,3d", "--json")
    assert rc == 0, err
    d = json.loads(out)
    modes = d["tp_modes"]
    assert set(modes) == {"1d", "2d", "3d"} and all(m["priced_only"] for k, m in modes.items()
                                                    if k != "1d")
    # 1d is the ranking's own winner, at its own step time
    assert modes["1d"]["step_time_s"] == pytest.approx(d["top"][0]["step_time_s"]["total"])
    # each mode's figure is mode_delta of its plan (tp a square for 2d, a cube for 3d)
    model, cl = get_preset("llama3-70b"), ClusterSpec(load_hardware("h100-sxm"), 64)
    for mode, q in (("2d", 2), ("3d", 2)):
        m = modes[mode]
        tp = q ** (2 if mode == "2d" else 3)
        assert f"tp{tp} " in m["plan"]
        e = _estimate_of(m["plan"], model, cl)
        assert m["step_time_s"] == pytest.approx(mode_delta(model, e, mode)["step_time_s"])
        assert m["step_time_s"] >= modes["1d"]["step_time_s"] or mode == min(
            modes, key=lambda k: modes[k]["step_time_s"])


def _estimate_of(desc: str, model, cl):  # noqa: ANN001
    """The estimate of a plan printed as ``dp16 tp4 pp1 zero3 sp mb2 gb512 [schedule]``."""
    import re
    from ptd.cost.estimate import estimate
    from ptd.specs import ParallelPlan
    g = {k: int(v) for k, v in re.findall(r"\b(dp|tp|pp|vpp|zero|mb|gb)(\d+)", desc)}
    sched = next((s for s in ("interleaved-1f1b", "zero-bubble", "gpipe") if s in desc), "1f1b")
    rc = re.search(r"\brc-(full|selective)\b", desc)
    p = ParallelPlan(dp=g["dp"], tp=g["tp"], pp=g["pp"], vpp=g.get("vpp", 1), zero=g["zero"],
                     sp=" sp " in f" {desc} ", micro_batch=g["mb"], global_batch=g["gb"],
                     seq_len=4096, schedule=sched, dtype="bf16", uneven_stages="uneven" in desc,
                     recompute=rc.group(1) if rc else "none")
    return estimate(model, cl, p)


def test_plan_explains_which_mode_wins(ptd_cli) -> None:
    rc, out, err = ptd_cli("plan", "--model", "llama3-70b", "--hardware", "h100-sxm", "--gpus", "64",
                           "--global-batch", "512", "--seq-len", "4096", "--top", "1", "--pareto", "0",
                           "--tp-modes", "1d,3d", "--explain")
    assert rc == 0, err
    assert "tensor-parallel modes (priced only: ptd train runs 1d, and 2d with --tp-mode 2d)" in out
    assert "1d wins:" in out and "3d:" in out and "tensor-parallel communication" in out


def test_2p5d_at_q1_is_not_tensor_parallelism(ptd_cli) -> None:
    rc, out, err = ptd_cli("calc", "--tp-mode", "2.5d", "--devices", "2", "--depth", "2")
    assert rc == 2 and "needs q >= 2" in err

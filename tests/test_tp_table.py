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

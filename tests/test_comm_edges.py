"""Edges of ``ptd.cost.comm`` that the first mutation run (scripts/mutation, 2026-11-24) found
unguarded: the default members per node, a hierarchy of two members per node, a buffer
that does not divide by the node count, one-byte buffers, groups of one at the helper
level, and a calibrated fit used at a smaller group. Same links as test_comm_golden.py:

    intra B 50e9 B/s, alpha 2 us;  inter B 8e9 B/s, alpha 10 us;  M = 1e9 bytes
"""

import pytest
from helpers import toy_links

from ptd.cost.comm import bus_factor, collective_time, flat_time, latency_steps
from ptd.specs.hardware import CollectiveFit

M = 1e9
REL = 1e-12


@pytest.fixture(scope="module")
def hw():
    return toy_links()  # helpers.py: the links' numbers, written out there


def test_members_per_node_default_to_n_over_nodes(hw):
    # 16 ranks on 2 nodes, per_node not given -> 8 each. One ring of 15 steps: 14 inside
    # nodes (14 * 2e-6) and 1 across (1e-5); bytes 7/8 * 0.02 inside + 1/2 * 1.25e8/8e9 across
    want = (2.8e-5 + 0.0175) + (1e-5 + 0.0078125)
    assert collective_time("reduce_scatter", M, 16, hw, nodes=2) == pytest.approx(want, rel=REL)


def test_two_members_per_node_is_hierarchical(hw):
    # 4 ranks, 2 nodes of 2: one ring of 3 steps, 2 inside nodes (2 * 2e-6) and 1 across
    # (1e-5); bytes 1/2 * 0.02 inside + 1/2 * 5e8/8e9 = 0.03125 across
    want = (4e-6 + 0.01) + (1e-5 + 0.03125)
    assert collective_time("all_gather", M, 4, hw, nodes=2, per_node=2) == pytest.approx(want, rel=REL)


def test_all_to_all_over_three_nodes(hw):
    # 24 ranks, 3 nodes of 8: inside on M/3 (7*2e-6 + 7/8 * (1e9/3)/50e9), across
    # (2/3) * 1e9/8e9 with N-1 = 2 alphas
    want = (1.4e-5 + 7 / 8 * (1e9 / 3) / 50e9) + (2 / 3) * 0.125 + 2e-5
    got = collective_time("all_to_all", M, 24, hw, nodes=3, per_node=8)
    assert got == pytest.approx(want, rel=REL)


def test_one_byte_still_pays_the_latency(hw):
    # 7 alphas + 7/8 * 1/50e9
    assert collective_time("all_gather", 1, 8, hw) == pytest.approx(1.4e-5 + 7 / 8 / 50e9, rel=REL)


def test_helpers_at_a_group_of_one():
    assert bus_factor("all_reduce", 1) == 0.0 and bus_factor("send_recv", 1) == 1.0
    assert bus_factor("broadcast", 4) == 1.0 and bus_factor("all_to_all", 4) == 0.75
    assert latency_steps("send_recv", 8) == 1.0 and latency_steps("all_gather", 1) == 0.0
    assert latency_steps("all_gather", 8) == 7.0 and latency_steps("all_reduce", 8, "tree") == 6.0
    assert flat_time("all_gather", M, 1, 2e-6, 50e9) == 0.0
    assert flat_time("send_recv", M, 1, 2e-6, 50e9) == pytest.approx(2e-6 + 0.02, rel=REL)


def test_calibrated_fit_used_at_a_smaller_group(hw):
    # broadcast measured at 4 ranks (alpha 40 us for the whole broadcast, bus 4e9 B/s),
    # used at 2: steps ceil(log2 2) = 1 over ceil(log2 4) = 2 -> alpha/2;
    # 2e-5 + 1 * 1e8/4e9 = 2e-5 + 0.025
    cal = hw.replace(collectives=(CollectiveFit("broadcast", 4, 4e-5, 4e9),))
    assert collective_time("broadcast", 1e8, 2, cal) == pytest.approx(2e-5 + 0.025, rel=REL)

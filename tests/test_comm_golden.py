"""Golden values for every communication term of ``ptd.cost.comm``, derived by hand from
the alpha-beta model (Hockney 1994; Thakur, Rabenseifner and Gropp 2005, IJHPCA 19(1),
"Optimization of collective communication operations in MPICH") as the module documents it:

    all-reduce      ring 2(n-1) a + 2(n-1)/n M/B    tree 2 ceil(log2 n) a + 2(n-1)/n M/B
                    (the cheaper of the two, as NCCL's tuner picks)
    reduce-scatter  (n-1) a + (n-1)/n M/B           all-gather  the same
    broadcast       ceil(log2 n) a + M/B (pipelined) all-to-all  (n-1) a + (n-1)/n M/B
    send/recv       a + M/B

and, across N nodes of k members, the hierarchical forms of the module docstring. Each
expected number below is written out (arithmetic in the comment), never taken from the
code under test. Links chosen with round numbers:

    intra-node: bandwidth 100 GB/s x efficiency 0.5 = B 50e9 B/s, alpha 2 us
    inter-node: bandwidth  10 GB/s x efficiency 0.8 = B  8e9 B/s, alpha 10 us
    M = 1e9 bytes: M/B_intra = 0.02 s, M/B_inter = 0.125 s
"""

import pytest
from helpers import toy_links

from ptd.cost.comm import collective_time, latency_steps
from ptd.specs.hardware import CollectiveFit

M = 1e9
REL = 1e-12


@pytest.fixture(scope="module")
def hw():
    return toy_links()  # helpers.py: the links' numbers, written out there


# --------------------------------------------------------- one node, n = 8 (alpha 2 us, M/B 0.02 s)
INTRA_8 = {
    # tree: 2*ceil(log2 8) = 6 alphas (ring would be 14); 2*7/8*0.02 = 0.035
    "all_reduce": 6 * 2e-6 + 0.035,        # 0.035012
    # 7 alphas; 7/8 * 0.02 = 0.0175
    "reduce_scatter": 7 * 2e-6 + 0.0175,   # 0.017514
    "all_gather": 7 * 2e-6 + 0.0175,       # 0.017514
    # ceil(log2 8) = 3 alphas; whole buffer once: 0.02
    "broadcast": 3 * 2e-6 + 0.02,          # 0.020006
    "all_to_all": 7 * 2e-6 + 0.0175,       # 0.017514
    # one message, whole buffer
    "send_recv": 2e-6 + 0.02,              # 0.020002
}

# --------------------------------------------------------- 4 nodes, 1 member each (alpha 10 us, M/B 0.125 s)
INTER_4 = {
    # tree: 2*ceil(log2 4) = 4 alphas (ring 6); 2*3/4*0.125 = 0.1875
    "all_reduce": 4 * 1e-5 + 0.1875,       # 0.18754
    # 3 alphas; 3/4*0.125 = 0.09375
    "reduce_scatter": 3 * 1e-5 + 0.09375,  # 0.09378
    "all_gather": 3 * 1e-5 + 0.09375,
    # 2 alphas; 0.125
    "broadcast": 2 * 1e-5 + 0.125,         # 0.12502
    "all_to_all": 3 * 1e-5 + 0.09375,
    # across nodes: the network link
    "send_recv": 1e-5 + 0.125,             # 0.12501
}

# --------------------------------------------------------- 2 nodes x 8 members (hierarchical)
# inner pieces on M over k = 8 inside a node: RS = AG = 7*2e-6 + 7/8*0.02 = 0.017514
# across the 2 nodes on M/k = 1.25e8 bytes: 1.25e8/8e9 = 0.015625 s
HIER_2x8 = {
    # RS inside + all-reduce across on M/8 (2 nodes: ring 2 alphas = tree 2 alphas;
    # 2*(1/2)*0.015625) + AG inside
    "all_reduce": 0.017514 + (2 * 1e-5 + 0.015625) + 0.017514,   # 0.050673
    # NCCL's one ring over the 16 ranks: 15 steps, 1 of them across nodes (nodes - 1),
    # 14 inside (NCCL tuning.cc: (nsteps - nInterSteps) intraLat + nInterSteps interLat);
    # bytes: 7/8 of M over NVLink (0.0175) + 1/2 of M/8 over each NIC (0.0078125)
    "reduce_scatter": 14 * 2e-6 + 1e-5 + 0.0175 + 0.0078125,     # 0.0253505
    "all_gather": 14 * 2e-6 + 1e-5 + 0.0175 + 0.0078125,
    # broadcast across on M/8 (1 alpha + 0.015625) then inside on M (3 alphas + 0.02)
    "broadcast": (1e-5 + 0.015625) + (3 * 2e-6 + 0.02),          # 0.035641
    # 1/N = 1/2 of each rank's data stays in the node: all-to-all inside on M/2
    # (7 alphas + 7/8 * 5e8/50e9 = 0.00875); the other half crosses the network at B_inter
    # ((1/2) * 1e9/8e9 = 0.0625) with N-1 = 1 alpha
    "all_to_all": (7 * 2e-6 + 0.00875) + 0.0625 + 1e-5,           # 0.071274
}


@pytest.mark.parametrize("kind", sorted(INTRA_8))
def test_one_node_ring_or_tree(hw, kind):
    assert collective_time(kind, M, 8, hw, nodes=1) == pytest.approx(INTRA_8[kind], rel=REL)


@pytest.mark.parametrize("kind", sorted(INTER_4))
def test_across_nodes_one_member_each(hw, kind):
    n = 2 if kind == "send_recv" else 4
    got = collective_time(kind, M, n, hw, nodes=n, per_node=1)
    assert got == pytest.approx(INTER_4[kind], rel=REL)


@pytest.mark.parametrize("kind", sorted(HIER_2x8))
def test_hierarchical_two_nodes_of_eight(hw, kind):
    got = collective_time(kind, M, 16, hw, nodes=2, per_node=8)
    assert got == pytest.approx(HIER_2x8[kind], rel=REL)


def test_all_reduce_takes_the_cheaper_of_ring_and_tree(hw):
    # latency-bound (1 KB): n = 8 ring 14 alphas, tree 6 -> tree:
    # 6*2e-6 + 2*7/8*1e3/50e9 = 1.2e-5 + 3.5e-8
    assert collective_time("all_reduce", 1e3, 8, hw) == pytest.approx(1.2e-5 + 3.5e-8, rel=REL)
    # n = 6 (not a power of two): tree 2*ceil(log2 6) = 6 alphas, ring 10;
    # 6*2e-6 + 2*5/6*0.02 = 1.2e-5 + 0.0333333...
    assert collective_time("all_reduce", M, 6, hw) == pytest.approx(1.2e-5 + 1 / 30, rel=REL)
    # n = 2: ring 2(n-1) = 2 alphas = tree 2*1; 2*2e-6 + 2*(1/2)*0.02
    assert collective_time("all_reduce", M, 2, hw) == pytest.approx(4e-6 + 0.02, rel=REL)
    assert latency_steps("all_reduce", 8, "ring") == 14
    assert latency_steps("all_reduce", 8, "tree") == 6
    assert latency_steps("broadcast", 5, "ring") == 3      # ceil(log2 5)


def test_nothing_to_move_costs_nothing_but_a_point_to_point_message(hw):
    for kind in ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all"):
        assert collective_time(kind, M, 1, hw) == 0.0          # a group of one
        assert collective_time(kind, 0, 8, hw) == 0.0          # an empty buffer
    # send/recv between two ranks of one node: alpha + M/B, whatever n says
    assert collective_time("send_recv", M, 1, hw) == pytest.approx(2e-6 + 0.02, rel=REL)


def test_calibrated_fit_replaces_the_link_and_scales_alpha_by_ring_steps(hw):
    # measured at group 4: alpha 50 us for the whole all-reduce, bus bandwidth 4e9 B/s
    cal = hw.replace(collectives=(CollectiveFit("all_reduce", 4, 5e-5, 4e9),))
    m = 1e8
    # at 4: 5e-5 + 2*3/4 * 1e8/4e9 = 5e-5 + 0.0375
    assert collective_time("all_reduce", m, 4, cal) == pytest.approx(5e-5 + 0.0375, rel=REL)
    # at 8 (nearest fit is 4): alpha scaled by ring steps 2*7 / 2*3 = 14/6;
    # 5e-5*14/6 + 2*7/8 * 1e8/4e9 = 1.1666...e-4 + 0.04375
    assert collective_time("all_reduce", m, 8, cal) == pytest.approx(5e-5 * 14 / 6 + 0.04375, rel=REL)
    # the fit is per collective: an all-gather still uses the link (7*2e-6 + 7/8*1e8/50e9)
    assert collective_time("all_gather", m, 8, cal) == pytest.approx(1.4e-5 + 0.00175, rel=REL)

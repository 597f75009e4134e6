"""An oversubscribed spine (``HardwareSpec.nodes_per_leaf``, ``spine_oversubscription``):
which groups cross it, and what that does to their collectives. Expected values by hand
from the layout rule (ranks row-major over pp, dp, cp, tp) and the hierarchical formulas."""

from __future__ import annotations

import dataclasses

import pytest

from ptd.cli import main
from ptd.cost.comm import collective_time
from ptd.cost.estimate import estimate
from ptd.errors import PtdError
from ptd.specs import ClusterSpec, ParallelPlan, get_hardware_preset, load_model
from ptd.specs.layout import axis_span

H100 = get_hardware_preset("h100-sxm")


def _spine(leaf: int, over: float):
    return dataclasses.replace(H100, nodes_per_leaf=leaf, spine_oversubscription=over)


def test_axis_span_by_hand():
    p = ParallelPlan(dp=4, tp=8, pp=2)  # 64 ranks, 8 a node
    assert axis_span("tp", p, 8) == 1          # ranks 0..7: node 0
    assert axis_span("dp", p, 8) == 4          # ranks 0, 8, 16, 24: nodes 0..3
    assert axis_span("pp", p, 8) == 5          # ranks 0, 32: nodes 0 and 4
    assert axis_span("pp_pair", p, 8) == 5
    q = ParallelPlan(dp=2, cp=2, tp=8)         # gradient group: ranks 0, 8, 16, 24
    assert axis_span("grad", q, 8) == 4
    assert axis_span("cp", q, 8) == 2          # ranks 0, 8


def test_across_spine_divides_the_network_link_only_past_a_leaf():
    hw = _spine(2, 4.0)
    assert hw.across_spine(2) is hw            # within a leaf: untouched
    far = hw.across_spine(3)
    assert far.inter_node.bandwidth == H100.inter_node.bandwidth / 4
    assert far.intra_node == H100.intra_node
    assert hw.across_spine(5) is far           # the same object: the memos key on it
    assert H100.across_spine(1000) is H100     # no spine given: never
    assert _spine(2, 1.0).across_spine(9).inter_node == H100.inter_node


def test_a_hierarchical_all_reduce_pays_the_spine_on_its_network_part():
    # 32 ranks on 4 nodes (8 a node), 1 GB: reduce-scatter and all-gather inside the node,
    # the all-reduce across the 4 nodes on 1/8 of the buffer; only that part's bandwidth
    # term grows: 2 (4-1)/4 * (1e9/8) / B_eff, times (4 - 1) more at 4:1
    hw = _spine(2, 4.0)
    base = collective_time("all_reduce", 1e9, 32, hw, 4, 8)
    far = collective_time("all_reduce", 1e9, 32, hw.across_spine(4), 4, 8)
    b_eff = H100.inter_node.bandwidth * H100.inter_node.efficiency
    assert far - base == pytest.approx(3 * 2 * 3 / 4 * (1e9 / 8) / b_eff)


def _est(hw, plan, n):
    model = load_model("llama3-8b")
    return estimate(model, ClusterSpec(hw, n, 8), plan)


def test_only_groups_that_cross_the_spine_slow_down():
    plan = ParallelPlan(dp=8, tp=8, pp=1, micro_batch=1, global_batch=64, seq_len=4096, zero=1)
    same = _est(H100, plan, 64).step
    # the dp group spans nodes 0..7: within a leaf of 8, the step is unchanged
    inside = _est(_spine(8, 4.0), plan, 64).step
    assert inside.dp_comm_total == same.dp_comm_total and inside.total == same.total
    # past a leaf of 4 it crosses the spine: more gradient communication, tp (in a node) alike
    across = _est(_spine(4, 4.0), plan, 64).step
    assert across.dp_comm_total > 1.5 * same.dp_comm_total
    assert across.tp_comm == same.tp_comm


def test_pipeline_transfers_between_nodes_pay_it_too():
    plan = ParallelPlan(dp=1, tp=8, pp=4, micro_batch=1, global_batch=32, seq_len=4096, zero=0,
                        schedule="1f1b")
    same = _est(H100, plan, 32).step
    # neighbouring stages are 8 ranks (one node) apart: a pair spans 2 nodes
    assert _est(_spine(2, 8.0), plan, 32).step.pp_comm == same.pp_comm
    assert _est(_spine(1, 8.0), plan, 32).step.pp_comm > 2 * same.pp_comm


def test_bad_values_and_lone_flags_are_one_line_errors(capsys):
    with pytest.raises(PtdError, match="spine_oversubscription must be in"):
        _spine(2, 0.5)
    with pytest.raises(PtdError, match="nodes_per_leaf must be"):
        dataclasses.replace(H100, nodes_per_leaf=-1)
    assert main(["estimate", "--spine-oversubscription", "2"]) == 2
    assert "go together" in capsys.readouterr().err
    assert main(["estimate", "--nodes-per-leaf", "2", "--spine-oversubscription", "2",
                 "--gpus", "64", "--tp", "8", "--dp", "8"]) == 0


def test_the_hardware_checks_after_the_spine_fields_still_run():
    # the spine's method was once written into the middle of __post_init__, leaving the check
    # of the measured blocking waits unreachable after its return: a group with no points
    # passed (a negative wait is also the type check's)
    cpu = get_hardware_preset("cpu")
    with pytest.raises(PtdError, match=r"blocking_wait_measured\[2\]"):
        cpu.replace(blocking_wait_measured={2: ((0.0, -1e-3),)})
    with pytest.raises(PtdError, match=r"blocking_wait_measured\[4\] needs"):
        cpu.replace(blocking_wait_measured={4: ()})
    assert cpu.replace(blocking_wait_measured={2: ((0.0, 1e-3),)}).blocking_wait_measured


def test_tensor_context_and_expert_groups_across_nodes_pay_it():
    # tp 16 with 8 a node: the tp group spans 2 nodes (ranks 0..15)
    gpt = load_model("gpt3-175b")  # 96 heads: tp 16 divides them
    tp = ParallelPlan(dp=1, tp=16, micro_batch=1, global_batch=1, seq_len=2048)

    def tp_comm(hw):
        return estimate(gpt, ClusterSpec(hw, 16, 8), tp).step.tp_comm
    assert tp_comm(_spine(1, 4.0)) > 1.2 * tp_comm(H100)
    assert tp_comm(_spine(2, 4.0)) == tp_comm(H100)
    # cp 2 over tp 8: cp peers 8 ranks apart, one node each
    cp = ParallelPlan(dp=1, cp=2, tp=8, micro_batch=1, global_batch=1, seq_len=8192)
    assert (_est(_spine(1, 4.0), cp, 16).step.cp_comm_total
            > 1.5 * _est(H100, cp, 16).step.cp_comm_total)
    # ep 2 over dp 2 with tp 8: the two expert groups' ranks 8 apart, on two nodes
    moe = load_model("mixtral-8x7b")
    ep = ParallelPlan(dp=2, ep=2, tp=8, micro_batch=1, global_batch=2, seq_len=4096, zero=1)
    far = estimate(moe, ClusterSpec(_spine(1, 4.0), 16, 8), ep).step.ep_comm
    near = estimate(moe, ClusterSpec(H100, 16, 8), ep).step.ep_comm
    assert far > 1.5 * near

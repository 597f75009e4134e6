"""The real survivors of a cosmic-ray sample of specs/plan.py (2026-11-30, 29 of 40 killed;
docs/testing.md): a plan read from a partial table, square 2-D tensor-parallel meshes beyond
2 x 2, the sequence- and context-parallel divisibility rules at the edge, and what the
world-size refusal says. Expected values by hand from the rules' own statements."""

import pytest

from ptd.errors import PtdError
from ptd.specs.plan import ParallelPlan, plan_from_dict


def test_a_partial_table_is_a_plan_and_only_unknown_fields_are_named():
    p = plan_from_dict({"dp": 2, "tp": 2})
    assert (p.dp, p.tp, p.pp, p.micro_batch) == (2, 2, 1, 1)
    with pytest.raises(PtdError) as e:
        plan_from_dict({"dp": 2, "bogus": 1})
    assert str(e.value) == "unknown plan field(s) bogus"


@pytest.mark.parametrize("tp, mb, q", [(4, 2, 2), (9, 3, 3), (16, 4, 4)])
def test_square_2d_meshes_validate_and_split_q_ways(tp, mb, q):
    """tp = q*q on a q x q mesh: valid with the micro-batch divisible by q, and the heads,
    MLP and vocabulary cut q ways (1-D: tp ways)."""
    p = ParallelPlan(tp=tp, tp_mode="2d", micro_batch=mb, global_batch=mb)
    p.validate(world_size=tp)
    assert p.tp_split == q
    assert ParallelPlan(tp=tp).tp_split == tp
    with pytest.raises(PtdError, match=f"not divisible by q = {q}"):
        ParallelPlan(tp=tp, tp_mode="2d", micro_batch=q + 1, global_batch=q + 1).validate()


def test_a_non_square_2d_mesh_is_refused():
    for tp in (2, 8, 12):
        with pytest.raises(PtdError, match=f"needs tp = q\\*q with q >= 2 .*got tp {tp}"):
            ParallelPlan(tp=tp, tp_mode="2d", micro_batch=4, global_batch=4).validate()


def test_sequence_parallel_needs_the_sequence_divisible_by_tp_times_cp():
    """seq 6 over tp 2 (3 tokens a rank) is fine, 7 is not; under cp 2 with sp each rank
    holds seq / (tp * cp): 12 over 2 x 2 is fine (and 12 is divisible by 2 * cp = 4)."""
    ParallelPlan(tp=2, sp=True, seq_len=6).validate()
    with pytest.raises(PtdError, match=r"seq_len \(7\) divisible by tp \(2\)"):
        ParallelPlan(tp=2, sp=True, seq_len=7).validate()
    ParallelPlan(tp=2, cp=2, sp=True, seq_len=12).validate()
    with pytest.raises(PtdError, match=r"seq_len \(10\) divisible by tp\*cp = 2\*2"):
        ParallelPlan(tp=2, cp=2, sp=True, seq_len=10).validate()


def test_context_parallel_two_needs_the_sequence_in_four_chunks():
    """cp 2 cuts each sequence into 2 * 2 = 4 chunks: 6 tokens do not go, 8 do."""
    with pytest.raises(PtdError, match=r"cp 2 needs seq_len \(6\) divisible by 2\*cp = 4"):
        ParallelPlan(cp=2, seq_len=6).validate()
    ParallelPlan(cp=2, seq_len=8).validate()


def test_the_world_size_refusal_spells_out_its_product():
    with pytest.raises(PtdError) as e:
        ParallelPlan(dp=2, global_batch=8).validate(world_size=4)
    assert str(e.value) == "dp*tp*pp = 2*1*1 = 2 does not equal the world size 4"
    with pytest.raises(PtdError) as e:
        ParallelPlan(cp=2, seq_len=8).validate(world_size=4)
    assert str(e.value) == "dp*tp*pp*cp = 1*1*1*2 = 2 does not equal the world size 4"

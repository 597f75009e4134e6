"""Tests that bite the real survivors of a fresh uniform sample of the whole ``ptd.cost``
package (``scripts/mutation_sample.py sample ... --n 30 --seed 20261210``, seventh session,
docs/testing.md). Every expected value is arithmetic written out in the comments, never
computed by the code under test."""

from ptd.cost.step import StepBreakdown


# Catches: step.py:102 ``... + self.ep_comm + self.cp_comm`` -> ``... + self.ep_comm *
# self.cp_comm`` (``StepBreakdown.bound``: the expert-parallel and the context-parallel
# communication multiplied instead of added). By hand: compute 2 s, expert-parallel
# all-to-alls 1 s, context-parallel exchange not hidden 1.5 s, nothing else; total
# 2 + 1 + 1.5 = 4.5 s. Exposed communication 1 + 1.5 = 2.5 s > 2 s of compute:
# communication-bound, though the largest single part is the computation (2 / 4.5 = 44 %).
# The mutant counts 1 x 1.5 = 1.5 s < 2 s and calls it compute-bound.
def test_bound_adds_expert_and_context_parallel_communication():
    b = StepBreakdown(total=4.5, compute=2.0, tp_comm=0.0, pp_comm=0.0, dp_comm_exposed=0.0,
                      bubble=0.0, optimizer=0.0, ep_comm=1.0, cp_comm=1.5)
    assert b.bound() == "communication-bound: the largest part is computation (44% of the step)"


# The same mutant with no expert parallelism: 0 x cp_comm = 0. Compute 2 s, context-parallel
# exchange not hidden 3 s, total 5 s: exposed 3 s > 2 s, communication-bound; the largest
# part is the exchange, 3 / 5 = 60 %. The mutant counts 0 s exposed and says
# "context-parallel exchange not hidden-bound".
def test_bound_counts_context_parallel_exchange_without_expert_parallelism():
    b = StepBreakdown(total=5.0, compute=2.0, tp_comm=0.0, pp_comm=0.0, dp_comm_exposed=0.0,
                      bubble=0.0, optimizer=0.0, ep_comm=0.0, cp_comm=3.0)
    assert b.bound() == ("communication-bound: the largest part is context-parallel exchange "
                         "not hidden (60% of the step)")

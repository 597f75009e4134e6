"""``ptd.planner.pareto``: the memory-versus-time front and its thinning, on hand-made points.

Written from the mutation survivors of ``src/ptd/planner/pareto.py``. ``pareto_front`` reads
only ``e.memory.total`` and ``e.step.total``, so the points are stand-ins with those two
numbers (memory in GB, step time in s) and a name."""

from __future__ import annotations

from types import SimpleNamespace

from ptd.planner.pareto import pareto_front, thin


def pt(name, mem, t):
    return SimpleNamespace(name=name, memory=SimpleNamespace(total=mem),
                           step=SimpleNamespace(total=t))


def names(front):
    return [e.name for e in front]


def test_front_by_hand():
    # A (10 GB, 5 s), B (20, 3), C (30, 4), D (15, 6), E (40, 1).
    # Sorted by memory: A 10/5, D 15/6, B 20/3, C 30/4, E 40/1.
    # D: more memory and slower than A -> dominated.  C: more memory and slower than B.
    # Left: A (least memory), B, E (fastest), by increasing memory, decreasing time.
    pts = [pt("C", 30, 4), pt("A", 10, 5), pt("E", 40, 1), pt("D", 15, 6), pt("B", 20, 3)]
    assert names(pareto_front(pts)) == ["A", "B", "E"]


def test_equal_time_more_memory_is_dominated():
    # B takes as long as A with more memory: A beats it on memory, ties on time -> out
    assert names(pareto_front([pt("B", 20, 5), pt("A", 10, 5)])) == ["A"]


def test_equal_memory_the_faster_is_kept():
    # same memory: the faster (B) dominates; sorted (10, 3) before (10, 5), so B alone
    assert names(pareto_front([pt("A", 10, 5), pt("B", 10, 3)])) == ["B"]


def test_exact_ties_keep_only_the_first():
    # equal memory and time: the docstring keeps the first one (the sort is stable)
    assert names(pareto_front([pt("A", 10, 5), pt("B", 10, 5)])) == ["A"]


def test_empty_and_single():
    assert pareto_front([]) == []
    assert names(pareto_front(iter([pt("A", 1, 1)]))) == ["A"]  # any iterable


def test_infinite_step_time_never_enters():
    # "best" starts at +inf: a plan whose time is inf beats nothing
    assert names(pareto_front([pt("A", 1, float("inf")), pt("B", 2, 7)])) == ["B"]


FRONT = [pt(str(i), i, 10 - i) for i in range(6)]  # six points 0..5


def test_thin_nothing_for_no_room():
    assert thin(FRONT, 0) == []
    assert thin(FRONT, -1) == []


def test_thin_keeps_all_when_they_fit():
    assert names(thin(FRONT, 6)) == ["0", "1", "2", "3", "4", "5"]
    assert names(thin(FRONT, 9)) == ["0", "1", "2", "3", "4", "5"]
    assert isinstance(thin(tuple(FRONT), 6), list)


def test_thin_to_one_is_the_fastest_end():
    assert names(thin(FRONT, 1)) == ["5"]


def test_thin_spreads_evenly_by_rounding():
    # k = 4 of 6: indices round(i * 5 / 3) for i = 0..3 = round(0, 1.67, 3.33, 5) = 0, 2, 3, 5
    assert names(thin(FRONT, 4)) == ["0", "2", "3", "5"]
    # k = 3 of 6: round(0, 2.5, 5) = 0, 2, 5 (2.5 rounds half to even: 2)
    assert names(thin(FRONT, 3)) == ["0", "2", "5"]
    # k = 2: the two ends
    assert names(thin(FRONT, 2)) == ["0", "5"]
    # k = 5 of 6: round(i * 5 / 4) = round(0, 1.25, 2.5, 3.75, 5) = 0, 1, 2, 4, 5
    assert names(thin(FRONT, 5)) == ["0", "1", "2", "4", "5"]


def test_thin_an_empty_front():
    # no plan fits: nothing to show, whatever k (not an IndexError at front[-1] for k = 1,
    # nor at front[0] / front[-1] for the spread of k = 3)
    assert thin([], 1) == []
    assert thin([], 3) == []
    assert thin([], 0) == []

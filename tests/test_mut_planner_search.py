"""planner/search.py by hand: --fix parsing and its bounds, divisors; and (below, from the
module's first mutation run, a sample of 25, seed 20261127) the walk counted plan by plan on
a space small enough to enumerate on paper, and the pieces around it."""

import pytest

from ptd.errors import PtdError
from ptd.planner import search as S


def test_parse_fix_aliases_types_and_blanks():
    # aliases: mb -> micro_batch, rc -> recompute, uneven -> uneven_stages; empty items skipped
    assert S.parse_fix(["tp=8, pp=16,", " mb=2 ", "rc=full,uneven=off", "zero=0"]) == {
        "tp": 8, "pp": 16, "micro_batch": 2, "recompute": "full", "uneven_stages": False,
        "zero": 0}
    assert S.parse_fix(["sp=YES", "offload=1"]) == {"sp": True, "offload": True}
    assert S.parse_fix([]) == {}


@pytest.mark.parametrize("spec", ["tp", "tp=", "=4", "bogus=1", "tp=x", "tp=0", "zero=-1",
                                  "zero=4", "sp=maybe", "recompute=some", "schedule=zb"])
def test_parse_fix_refuses(spec):
    with pytest.raises(PtdError):
        S.parse_fix([spec])


def test_fix_bounds_edges():
    # ints >= 1 except zero, which is 0..3
    assert S.parse_fix(["dp=1", "zero=3"]) == {"dp": 1, "zero": 3}


# ------------------------------------------------------------------------------------------
# From the mutation survivors of search.py (a sample of 25, seed 20261127): the walk counted
# plan by plan on a space small enough to enumerate on paper, the schedule labels, the
# schedules of a layout, the layout reasons, context-parallel layouts, the no-fit message,
# the sort key, the dimensions of a plan and the elapsed time.

from collections import Counter
from types import SimpleNamespace

from helpers import cluster
from ptd.specs import ClusterSpec, ParallelPlan, get_preset, load_hardware


def two_ranks():
    """The tiny model (4 layers, 8 heads, 4 kv heads, MLP 128) on 2 CPU workers, global
    batch 2, sequence 64, fp32: every plan fits.

    Layouts (tp, pp dividing 2): A dp2 tp1 pp1, B dp1 tp1 pp2, C dp1 tp2 pp1.
    A: one schedule (none), mb in divisors(2/2) = [1], sp off, zero 0-3 (dp 2),
       3 recomputes: 1*1*4*1*3 = 12 plans considered, all 12 kept.
    B: schedules gpipe, 1f1b, ZB-V (4 stages), interleaved-1f1b vpp 2 (4 stages; vpp 3..
       would exceed 4 // 2 = 2); mb 1, 2; zero 0-3 considered, 3 recomputes:
       4*2*4*3 = 96. mb 2 leaves m = 2 / 2 = 1 micro-batch < pp 2: 1f1b, ZB-V and
       interleaved are removed for it (3 schedules * 4 zeros * 3 rc = 36 "fewer
       micro-batches"), gpipe is not. ZeRO 1-3 at dp 1: 3 stages * 3 rc = 9 per
       (schedule, mb) left, over 4 (mb 1) + 1 (mb 2, gpipe) = 5 of them: 45. Kept:
       5 * 3 recomputes = 15.
    C: one schedule, mb 1, 2, sp off and on (64 % 2 = 0), zero 0-3, 3 rc:
       2*2*4*3 = 48; ZeRO 1-3 at dp 1: 2*2*3*3 = 36; kept 2*2*3 = 12.
    Totals: 156 considered, 39 kept, 81 ZeRO-at-dp-1, 36 too few micro-batches."""
    return S.search(get_preset("tiny"), cluster("cpu", 2), 2, 64, dtype="fp32")


def test_the_walk_counted_plan_by_plan():
    r = two_ranks()
    assert r.layouts_considered == 3 and not r.layouts_rejected
    assert r.plans_considered == 156 and r.plans_fit == 39
    assert r.plans_rejected == Counter({S.ZERO_DP1: 81, S.FEW_MICROBATCHES: 36})
    layouts = Counter((e.plan.dp, e.plan.tp, e.plan.pp) for e in r.ranked)
    assert layouts == {(2, 1, 1): 12, (1, 1, 2): 15, (1, 2, 1): 12}
    # B's 15: mb 1 under each of the 4 schedules, mb 2 under gpipe only (3 recomputes each)
    assert Counter((e.plan.schedule, e.plan.vpp, e.plan.micro_batch) for e in r.ranked
                   if e.plan.pp == 2) == {("gpipe", 1, 1): 3, ("1f1b", 1, 1): 3,
                                          ("zero-bubble", 1, 1): 3, ("interleaved-1f1b", 2, 1): 3,
                                          ("gpipe", 1, 2): 3}
    assert not any(e.plan.uneven_stages for e in r.ranked)  # 4 layers on 2 or 4 stages
    assert {e.plan.zero for e in r.ranked if e.plan.dp == 1} == {0}
    assert {e.plan.zero for e in r.ranked if e.plan.dp == 2} == {0, 1, 2, 3}


def test_reasons_and_best_per_dimension_value():
    r = two_ranks()
    # too few micro-batches: all 36 have mb 2, pp 2; 12 per schedule (4 zeros * 3 rc)
    assert r.reasons_by[("micro_batch", 2)][S.FEW_MICROBATCHES] == 36
    assert r.reasons_by[("pp", 2)][S.FEW_MICROBATCHES] == 36
    assert r.reasons_by[("schedule", "1f1b")][S.FEW_MICROBATCHES] == 12
    assert r.reasons_by[("schedule", "gpipe")] == Counter({S.ZERO_DP1: 18})  # mb 1 and 2: 2*9
    # ZeRO 2 at dp 1: B 5 (schedule, mb) * 3 rc + C 4 (mb, sp) * 3 rc = 27; zero 0 never removed
    assert r.reasons_by[("zero", 2)] == Counter({S.ZERO_DP1: 27})
    assert ("zero", 0) not in r.reasons_by
    assert r.reasons_by[("sp", True)] == Counter({S.ZERO_DP1: 18})  # C: 2 mb * 3 zeros * 3 rc
    # best_by has a plan for every value seen among the kept plans, with that value
    labels = {"none", "gpipe", "1f1b", "zero-bubble ZB-V", "interleaved-1f1b vpp2"}
    assert {v for (k, v) in r.best_by if k == "schedule"} == labels
    assert set(r.best_by) == ({("dp", 1), ("dp", 2), ("tp", 1), ("tp", 2), ("pp", 1), ("pp", 2),
                               ("zero", 0), ("zero", 1), ("zero", 2), ("zero", 3), ("sp", False),
                               ("sp", True), ("micro_batch", 1), ("micro_batch", 2),
                               ("recompute", "none"), ("recompute", "selective"),
                               ("recompute", "full")} | {("schedule", s) for s in labels})
    for (k, v), e in r.best_by.items():
        assert S.dimension_values(e.plan)[k] == v
        # the best of those with the value: no kept plan with it ranks before it
        first = next(x for x in r.ranked if S.dimension_values(x.plan)[k] == v)
        assert r.key(e) == r.key(first)
    # least memory per value: at most the memory of any kept plan with that value
    for (k, v), need in r.least_memory_by.items():
        have = [x.memory.total for x in r.ranked if S.dimension_values(x.plan)[k] == v]
        assert have and need == min(have)
    assert r.least_memory[0] == min(x.memory.total for x in r.ranked)


def test_context_parallel_layouts():
    tiny = get_preset("tiny")
    # 2 ranks, cp 1, 2, 3: cp 3 does not divide 2; cp 2 needs 62 % (2*2) == 0, it is 2
    r = S.search(tiny, cluster("cpu", 2), 2, 62, dtype="fp32", cp_values=(1, 2, 3))
    assert r.layouts_rejected == Counter({S.CP_DEVICES: 1, S.CP_SEQ: 1})
    assert r.reasons_by[("cp", 3)] == Counter({S.CP_DEVICES: 1})
    assert r.reasons_by[("cp", 2)] == Counter({S.CP_SEQ: 1})
    assert r.layouts_considered == 3  # A, B, C of two_ranks(), cp 1
    # sequence 64: cp 2 leaves 2 / 2 = 1 rank, one layout dp1 tp1 pp1 cp2; 4 cp layouts in all
    r = S.search(tiny, cluster("cpu", 2), 2, 64, dtype="fp32", cp_values=(1, 2))
    assert r.layouts_considered == 4 and not r.layouts_rejected
    cp2 = [e.plan for e in r.ranked if e.plan.cp == 2]
    # mb 1, 2 (divisors of 2 / dp 1), zero 0 only, 3 recomputes
    assert sorted((p.dp, p.tp, p.pp, p.micro_batch) for p in cp2) == \
        [(1, 1, 1, 1)] * 3 + [(1, 1, 1, 2)] * 3
    assert ("cp", 2) in r.best_by and r.best_by[("cp", 2)].plan.cp == 2


def test_schedule_labels():
    assert S._label(1, "gpipe", 1, 1) == "none"
    assert S._label(2, "gpipe", 1, 2) == "gpipe"
    assert S._label(2, "1f1b", 1, 2) == "1f1b"
    assert S._label(2, "interleaved-1f1b", 3, 6) == "interleaved-1f1b vpp3"
    assert S._label(2, "zero-bubble", 1, 4) == "zero-bubble ZB-V"  # two stages per rank
    assert S._label(2, "zero-bubble", 3, 6) == "zero-bubble vpp3"
    p = ParallelPlan(dp=1, pp=4, vpp=2, schedule="interleaved-1f1b", global_batch=8)
    assert S.schedule_label(p) == "interleaved-1f1b vpp2"


def test_schedules_of_a_layout():
    s = S._schedules
    # pp 1: no pipeline; a fixed vpp > 1 leaves nothing, a fixed schedule keeps its name
    assert s(8, 1, {}, True, 8) == [("1f1b", 1, 1)]
    assert s(8, 1, {"vpp": 1}, True, 8) == [("1f1b", 1, 1)]
    assert s(8, 1, {"vpp": 2}, True, 8) == []
    assert s(8, 1, {"schedule": "gpipe"}, True, 8) == [("gpipe", 1, 1)]
    # 8 layers on pp 2: vpp 2..4 (8 // 2); 3 does not divide 8 / 2 = 4 layers per rank and
    # is kept only with uneven stages, up to the largest uneven vpp
    one = [("gpipe", 1, 2), ("1f1b", 1, 2), ("zero-bubble", 1, 4)]
    assert s(8, 2, {}, True, 8) == one + [
        ("interleaved-1f1b", 2, 4), ("interleaved-1f1b", 3, 6), ("interleaved-1f1b", 4, 8),
        ("zero-bubble", 3, 6), ("zero-bubble", 4, 8)]  # zero-bubble vpp 2 is ZB-V, above
    even = one + [("interleaved-1f1b", 2, 4), ("interleaved-1f1b", 4, 8), ("zero-bubble", 4, 8)]
    assert s(8, 2, {}, False, 8) == even
    assert s(8, 2, {}, True, 2) == even  # vpp 3 > 2 uneven; 2 and 4 divide
    assert s(8, 2, {}, True, 3) == s(8, 2, {}, True, 8)  # 3 <= 3
    # fixed vpp: that one only, and no one-stage-per-rank schedule unless it is 1
    assert s(8, 2, {"vpp": 3}, True, 8) == [("interleaved-1f1b", 3, 6), ("zero-bubble", 3, 6)]
    assert s(8, 2, {"vpp": 2}, True, 8) == [("interleaved-1f1b", 2, 4)]
    assert s(8, 2, {"vpp": 1}, True, 8) == one
    assert s(8, 2, {"schedule": "zero-bubble"}, True, 8) == [
        ("zero-bubble", 1, 4), ("zero-bubble", 3, 6), ("zero-bubble", 4, 8)]
    assert s(4, 4, {}, True, 8) == [("gpipe", 1, 4), ("1f1b", 1, 4), ("zero-bubble", 1, 8)]


def test_layout_reasons_in_order():
    tiny = get_preset("tiny")  # 8 heads, 4 kv heads, MLP 128, 4 layers
    r = S._layout_reason
    assert r(tiny, 1, 8, 1, 4, 8, False) == S.TP_CROSSES_NODES  # tp 8 > node 4
    assert r(tiny, 1, 4, 1, 6, 8, False) == S.TP_CROSSES_NODES  # 6 % 4: a tp group straddles
    assert r(tiny, 1, 2, 1, 6, 8, False) is None  # 6 % 2 == 0
    assert r(tiny, 1, 8, 1, 4, 8, True) == S.TP_KV_HEADS  # 8 heads ok, 4 kv heads not
    assert r(tiny, 1, 16, 1, 4, 8, True) == S.TP_HEADS
    assert r(tiny.replace(ffn_hidden=100), 1, 8, 1, 8, 8, False) == S.TP_KV_HEADS
    assert r(tiny.replace(n_kv_heads=8, ffn_hidden=100), 1, 8, 1, 8, 8, False) == S.TP_FFN
    assert r(tiny, 1, 1, 5, 1, 8, False) == S.PP_LAYERS
    assert r(tiny, 1, 1, 4, 1, 8, False) is None  # pp = layers is allowed
    assert r(tiny, 3, 1, 1, 1, 8, False) == S.DP_BATCH
    assert r(tiny, 4, 1, 1, 1, 8, False) is None


def test_no_fit_message():
    hw = load_hardware("cpu").replace(memory_bytes=10 * 2**30, memory_reserved=2 * 2**30)
    res = S.SearchResult(get_preset("tiny"), ClusterSpec(hw, 4), 8, 64, "fp32",
                         "throughput", None, None, {})
    assert res.no_fit_message() == "no plan fits: 0 plans in 0 layouts considered"
    res.plans_considered, res.layouts_considered = 40, 3
    plan = ParallelPlan(dp=4, global_batch=8, seq_len=64)
    res.least_memory = (12.34 * 2**30, plan)  # 12.34 GiB -> "12.3"; usable 10 - 2 = 8 GiB
    res.plans_rejected.update({S.NO_FIT: 30, S.ZERO_DP1: 6, S.FEW_MICROBATCHES: 3})
    res.layouts_rejected.update({S.TP_HEADS: 5})  # merged with the plans' reasons: 3rd
    msg = ("no plan fits: 40 plans in 3 layouts considered; the least memory is 12.3 GiB per "
           "device (dp4 tp1 pp1 zero0 mb1 gb8) of 8 GiB; rejected: does not fit in memory (30), "
           "ZeRO shards over dp: nothing to shard at dp 1 (6), "
           "tp does not divide the attention heads (5)")
    assert res.no_fit_message() == msg
    with pytest.raises(PtdError) as err:
        res.best
    assert str(err.value) == msg


def test_objective_key_and_dimension_values():
    plan = ParallelPlan(dp=2, tp=2, pp=2, vpp=2, zero=1, sp=True, micro_batch=4,
                        recompute="full", schedule="interleaved-1f1b", global_batch=16, ep=2)
    e = SimpleNamespace(plan=plan, memory=SimpleNamespace(total=5.0),
                        step=SimpleNamespace(total=7.0))
    tie = (2, 2, 2, 2, "interleaved-1f1b", 1, True, 4, 2, 2)  # RECOMPUTE.index("full") = 2
    assert S.objective_key("memory", e) == (5.0, 7.0, tie)
    assert S.objective_key("throughput", e) == (7.0, 5.0, tie)
    assert S.objective_key("time-to-train", e) == (7.0, 5.0, tie)
    assert S.dimension_values(plan) == {
        "dp": 2, "tp": 2, "pp": 2, "zero": 1, "sp": True, "schedule": "interleaved-1f1b vpp2",
        "micro_batch": 4, "recompute": "full", "ep": 2}
    assert "ep" not in S.dimension_values(plan.replace(ep=1))


class _Clock:
    def __init__(self, *ts):
        self.ts = list(ts)

    def perf_counter(self):
        return self.ts.pop(0)


def test_elapsed_is_the_clock_difference(monkeypatch):
    monkeypatch.setattr(S, "time", _Clock(100.0, 103.5))  # read at the start and at the end
    assert two_ranks().elapsed_s == 3.5

"""planner: single-process tests for the real survivors of a second fresh sample of the whole
package (seed 20261211, N 40; docs/testing.md, "The planner package, another fresh sample",
eighth session). Expected values derived by hand, each test applied by hand against its
mutant (fails there, passes on the clean tree):

- ``search.py:364`` (``_Walk.plans``): ``continue`` after a rejected schedule as ``break``.
  With uneven stages off, a schedule whose stage count does not divide the layers (ZB-V's
  2*pp) ends the walk of that layout, so the later interleaved and zero-bubble schedules
  with more chunks, whose stages do divide the layers, are never priced.
- ``search.py:397`` (``_Walk._micro_batch_plans``): ``compression != "none"`` as
  ``compression > "none"``. ``"fp16"`` sorts before ``"none"``, so fp16 gradient
  compression with ZeRO > 0 was not rejected for its reason; the plans went on to be priced
  and came back as "invalid: ..." from ``ParallelPlan.validate`` instead.
- ``trial.py:50``: the return annotation of the property ``Candidate.best``, ``float |
  None``, as ``float % None``. ``test_annotations.py`` walks functions and classes but not
  the getters of properties then (it does now); ``typing.get_type_hints`` on one raised
  ``TypeError``.
- ``export_torchtitan.py:192`` (``_pairs``): ``... or t.startswith("activation-checkpoint:")
  or not out`` as ``... and not out``. The activation-checkpoint subcommand, always the last
  argument, was glued onto the last flag's line (``--compile.enable
  activation-checkpoint:full``) instead of standing on its own line. The shell runs the
  same words, but the script ptd writes is not the one-flag-per-line file it documents.
"""

from __future__ import annotations

import dataclasses
import typing
from collections import Counter

from helpers import cluster
from ptd.planner import export as X
from ptd.planner import export_torchtitan as TT
from ptd.planner import search as S
from ptd.planner import trial as T
from ptd.specs import get_preset


def test_a_rejected_schedule_does_not_end_the_layouts_walk():
    # tiny with 6 layers on 2 CPU workers, pp fixed at 2 (so dp 1, tp 1), uneven stages off,
    # global batch 2, fp32. _schedules(6, 2, ...): vpp v in 2..6//2 = 3 with 6 % (2v) == 0:
    # only v = 3. So gpipe (2 stages), 1f1b (2), ZB-V (4), interleaved-1f1b vpp 3 (6),
    # zero-bubble vpp 3 (6). ZB-V's 4 stages do not divide 6 layers: rejected (uneven), the
    # other four divide them and stay.
    six = dataclasses.replace(get_preset("tiny"), n_layers=6)
    r = S.search(six, cluster("cpu", 2), 2, 64, dtype="fp32",
                 fixed={"pp": 2, "uneven_stages": False})
    kept = {(e.plan.schedule, e.plan.vpp) for e in r.ranked}
    assert kept == {("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 3), ("zero-bubble", 3)}
    # ZB-V's plans: mb 1, 2 (divisors of 2 / dp 1) * zero 0-3 * sp off * 3 recomputes = 24
    assert r.plans_rejected[S.UNEVEN] == 24
    assert not any(e.plan.uneven_stages for e in r.ranked)


def test_fp16_compression_with_zero_is_rejected_for_its_reason():
    # tiny on 2 CPU workers, dp fixed at 2 (tp 1, pp 1), global batch 2, fp32, fp16 gradient
    # compression: one schedule, mb 1 (divisors of 2 / 2), sp off, zero 0-3 (dp 2), 3
    # recomputes = 12 plans; ZeRO 1, 2, 3 with compression: 3 * 3 = 9 rejected for it, the
    # 3 at ZeRO 0 kept.
    r = S.search(get_preset("tiny"), cluster("cpu", 2), 2, 64, dtype="fp32",
                 fixed={"dp": 2, "grad_compression": "fp16"})
    assert r.plans_considered == 12 and r.plans_fit == 3
    assert r.plans_rejected == Counter({S.COMPRESSION_ZERO: 9})
    assert {(e.plan.zero, e.plan.grad_compression) for e in r.ranked} == {(0, "fp16")}
    assert r.reasons_by[("zero", 1)] == Counter({S.COMPRESSION_ZERO: 3})


def test_candidate_best_annotation_resolves():
    # every property getter of the package is resolved by tests/test_annotations.py; this
    # one, the survivor, by name
    assert typing.get_type_hints(T.Candidate.best.fget) == {"return": float | None}


def test_torchtitan_subcommand_stands_on_its_own_line():
    # one flag with its values per line; the subcommand (no "--") on a line of its own
    got = TT._pairs(["--module", "llama3", "--a", "1", "2", "--b", "activation-checkpoint:full"])
    assert got == ["--module llama3", "--a 1 2", "--b", "activation-checkpoint:full"]
    # the whole export: its last line is the subcommand alone, after a continuation
    r = S.search(get_preset("tiny"), cluster("cpu", 2), 2, 64, dtype="fp32",
                 fixed={"dp": 2, "recompute": "full"})
    text = X.export(r.best, "torchtitan")
    assert text.endswith(" \\\n  activation-checkpoint:full\n")

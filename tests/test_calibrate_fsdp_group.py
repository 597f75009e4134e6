"""FSDP2's per-unit work timed on a real group (``bench.fsdp_unit_group_costs``): the bare
collectives it subtracts are the ones FSDP2 issues, and the profile takes its figure where
a group timed one."""

from __future__ import annotations

import pytest

from helpers import alone, run_ranks
from ptd.runtime.calibrate.profile import profile_table, summarize
from ptd.specs import get_hardware_preset
from ptd.specs.hardware import hardware_from_dict


def test_fsdp_collectives_by_hand():
    # a block unit: weight 8 x 8 and bias 8 = 72 elements, a rank's shard 72 / g where g
    # divides 8; the root's norm 8, a shard 8 / g. Over 3 ranks each parameter's 8 rows are
    # cut into shards of 3 (the last padded): 27 a block, 3 the root, reduced whole as 81
    # and 9. Forward: every unit gathers, the root (whose forward starts
    # first) before the blocks. Backward: every unit gathers again when resharded, and
    # every unit all-reduces its whole flat gradient.
    from ptd.runtime.calibrate.bench import fsdp_collectives
    fwd, bwd = fsdp_collectives(True, 2)
    assert fwd == [("ag", 4)] + [("ag", 36)] * 8
    assert bwd == [("ag", 4)] + [("ag", 36)] * 8 + [("ar", 72)] * 8 + [("ar", 8)]
    fwd, bwd = fsdp_collectives(False, 4)
    assert fwd == [("ag", 2)] + [("ag", 18)] * 8
    assert bwd == [("ar", 72)] * 8 + [("ar", 8)]
    fwd, bwd = fsdp_collectives(True, 3)
    assert fwd == [("ag", 3)] + [("ag", 27)] * 8
    assert bwd == fwd + [("ar", 81)] * 8 + [("ar", 9)]


def _fsdp_calls(rank: int, store: str, world: int, q) -> None:  # type: ignore[no-untyped-def]
    """Rank of a group of ``world``: the collectives FSDP2 really issues in one forward and
    one backward of the calibration's model, both ways, beside what the calibration
    subtracts; then the stage itself on a few rounds."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from ptd.runtime.calibrate import bench
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank,
                            world_size=world)
    torch.set_num_threads(1)
    log: list[tuple[str, int]] = []
    real_ag, real_ar = dist.all_gather_single, dist.all_reduce

    def ag(out, inp, *a, **k):  # type: ignore[no-untyped-def]
        log.append(("ag", inp.numel()))
        return real_ag(out, inp, *a, **k)

    def ar(t, *a, **k):  # type: ignore[no-untyped-def]
        log.append(("ar", t.numel()))
        return real_ar(t, *a, **k)
    dist.all_gather_single, dist.all_reduce = ag, ar
    seen = {}
    for reshard in (True, False):
        m = bench._fsdp_model(DeviceMesh.from_group(dist.group.WORLD, "cpu"), reshard)
        x = torch.randn(4, 8)
        m(x).backward()  # the first step initialises FSDP2 (lazy init)
        log.clear()
        y = m(x)
        fwd = list(log)
        log.clear()
        y.backward()
        seen[reshard] = (fwd, list(log), bench.fsdp_collectives(reshard, world))
    dist.all_gather_single, dist.all_reduce = real_ag, real_ar

    class Barrier:
        def wait(self, timeout: float) -> None:
            dist.barrier()
    costs = bench.fsdp_unit_group_costs(rank, world, None, Barrier(), 30.0, 5)
    suite = None
    if world == 2:  # and as the calibration's collectives' stages call it, on a small plan
        plan = {"group_sizes": [2], "kinds": [], "coll_sizes": [], "repeats": 1,
                "blocking_chunks": {0: 2}, "blocking_bytes": 1024, "blocking_side": 8,
                "dtensor_reduce_sizes": [1024], "dtensor_reduce_pairs": 2,
                "fsdp_group_rounds": 3}
        ticks: list[str] = []
        times, _ = bench.collective_suite(rank, 2, plan, torch.device("cpu"), Barrier(), 30.0,
                                          ticks.append)
        suite = (sorted(times["fsdp_group"]["2"]), ticks)
    q.put((rank, (seen, costs, suite)))
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_the_stage_subtracts_what_fsdp_issues(tmp_path, world):
    out = run_ranks(_fsdp_calls, world, str(tmp_path / "store"), world, timeout=120)
    for rank in range(world):
        seen, costs, suite = out[rank]
        for reshard in (True, False):
            fwd, bwd, (want_fwd, want_bwd) = seen[reshard]
            assert fwd == want_fwd, (reshard, fwd)
            assert sorted(bwd) == sorted(want_bwd), (reshard, bwd)  # backward order varies
        assert set(costs) == {"fsdp_unit_forward", "fsdp_unit_backward",
                              "fsdp_unit_keep_forward", "fsdp_unit_keep_backward"}
        assert all(v >= 0 for v in costs.values())
        if world == 2:
            assert suite == (sorted(costs), ["blocking collectives", "DTensor all-reduce",
                                             "FSDP units g=2"])


def test_a_group_figure_stands_for_the_one_rank_one():
    from test_calibrate import _synthetic
    plan, results = _synthetic()
    for rank, r in enumerate(results):
        for per_n in r["compute"].values():  # the one-rank figures of each worker count
            per_n["framework"] = {"fsdp_unit_forward": 1e-4, "fsdp_unit_backward": 2e-4}
        # the two ranks of the group: 0.5 and 0.7 ms forward -> their mean, 0.6
        r["collectives"]["fsdp_group"] = {"2": {"fsdp_unit_forward": 5e-4 + 2e-4 * rank,
                                                "fsdp_unit_backward": 9e-4}}
    s = summarize(plan, results)
    assert s["framework"]["fsdp_unit_forward"] == {1: pytest.approx(1e-4), 2: pytest.approx(6e-4)}
    assert s["framework"]["fsdp_unit_backward"] == {1: pytest.approx(2e-4), 2: pytest.approx(9e-4)}
    hw = hardware_from_dict(profile_table(s, get_hardware_preset("cpu"), "synth", "cpu",
                                          8 * 2**30, "test"), "synth")
    assert hw.overheads_measured["fsdp_unit_forward"] == {1: pytest.approx(1e-4),
                                                         2: pytest.approx(6e-4)}


def test_the_stage_is_fsdp_less_the_plain_model_less_the_bare_collectives(monkeypatch):
    # Stand-ins with known times, one process (a group of one): every collective sleeps 1
    # ms; "FSDP" issues the stage's own list of collectives and spends 9 ms of its own in the
    # forward, 4.5 in the backward; the plain model sleeps 2.7 ms forward, 0.9 backward.
    # Per unit (9 units): forward (9 + 9 - 2.7 - 9) / 9 = 0.7 ms, backward 4.5 - 0.9 = 0.4 ms
    # (the collectives cancel). Without the bare collectives taken off: 1.7 / 1.4 (resharded);
    # without the plain model: 1.0 / 0.5.
    import time

    import torch
    import torch.distributed as dist

    from ptd.runtime.calibrate import bench

    def sleep_call(*a, **k):  # type: ignore[no-untyped-def]
        time.sleep(1e-3)
    monkeypatch.setattr(dist, "all_gather_single", sleep_call)
    monkeypatch.setattr(dist, "all_reduce", sleep_call)

    def stand_in(fwd_s: float, bwd_s: float, calls: tuple[list, list] | None) -> torch.nn.Module:
        class Slow(torch.autograd.Function):
            @staticmethod
            def forward(ctx, w):  # type: ignore[no-untyped-def]
                return w.sum()

            @staticmethod
            def backward(ctx, g):  # type: ignore[no-untyped-def]
                for _ in (calls[1] if calls else []):
                    sleep_call()
                time.sleep(bwd_s)
                return g * torch.ones(8)

        class M(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.w = torch.nn.Parameter(torch.ones(8))
                self.calls = 0

            def forward(self, x):  # type: ignore[no-untyped-def]
                for _ in (calls[0] if calls else []):
                    sleep_call()
                self.calls += 1
                # one disturbed round of seven (after three warm-up calls): the median
                # passes over it, a mean would not (+20 / 7 / 9 = 0.32 ms a unit)
                time.sleep(fwd_s + (20e-3 if calls and self.calls == 5 else 0.0))
                return Slow.apply(self.w)
        return M()
    monkeypatch.setattr(bench, "_FsdpModel", lambda: stand_in(2.7e-3, 0.9e-3, None))
    monkeypatch.setattr(bench, "_fsdp_model", lambda mesh, reshard: stand_in(
        9e-3, 4.5e-3, bench.fsdp_collectives(reshard, 1)))

    class Barrier:
        def wait(self, timeout: float) -> None:
            pass
    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with alone():  # sleeps of a millisecond: another test's run beside would stretch them
            got = bench.fsdp_unit_group_costs(0, 1, None, Barrier(), 10.0, 7)
    finally:
        if made:
            dist.destroy_process_group()
    for key in ("fsdp_unit", "fsdp_unit_keep"):
        # (a divisor of 8 blocks rather than 9 units would read 0.79 / 0.45)
        assert got[f"{key}_forward"] == pytest.approx(0.7e-3, abs=0.05e-3)
        assert got[f"{key}_backward"] == pytest.approx(0.4e-3, abs=0.03e-3)

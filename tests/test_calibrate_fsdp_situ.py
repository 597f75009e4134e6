"""The calibration's ZeRO-3-in-place stage (runtime/calibrate/fsdp_situ.py): what it times on
two real ranks, the residual's arithmetic, the profile's table, the cost model charging it
once per ZeRO-3 gather of a pair and nowhere else, and the stage's place in a full
calibration only."""

import dataclasses
from pathlib import Path

import pytest

from helpers import run_ranks
from ptd.cost.estimate import estimate
from ptd.errors import PtdError
from ptd.runtime.calibrate.profile import fsdp_residual, profile_table, summarize
from ptd.specs import get_preset
from ptd.specs.hardware import (ClusterSpec, get_hardware_preset, hardware_from_dict,
                                load_hardware)
from ptd.specs.plan import ParallelPlan

REPO = Path(__file__).resolve().parent.parent
# SITU_MODEL's block, by hand: wq and wo 256 x 256, wk and wv 128 x 256 (4 kv heads of 32),
# SwiGLU's three 256 x 704, two norm weights of 256 -- no biases; fp32
BLOCK_BYTES = 4 * (2 * 256 * 256 + 2 * 128 * 256 + 3 * 256 * 704 + 2 * 256)


def test_lookup_round_trip_and_bad_tables(tmp_path):
    """One point reads flat at every size, negative where it is (a residual); none where
    absent or with more workers than measured; the TOML form loads and dumps; a malformed
    or non-finite table is refused, naming the field."""
    base = load_hardware("cpu")
    assert base.fsdp_situ_at(BLOCK_BYTES, 2) == 0.0
    assert load_hardware("h100-sxm").fsdp_situ_at(BLOCK_BYTES, 8) == 0.0
    hw = base.replace(fsdp_situ_measured={2: ((3e6, -2.5e-3),)})
    assert hw.fsdp_situ_at(1e3, 2) == hw.fsdp_situ_at(1e9, 1) == -2.5e-3
    assert hw.fsdp_situ_at(3e6, 3) == 0.0
    assert ClusterSpec(hw, 2).fsdp_situ(5e6) == -2.5e-3
    assert ClusterSpec(hw, 4).fsdp_situ(5e6) == 0.0
    assert hw.to_dict()["fsdp_situ_measured"] == {"2": [[3e6, -2.5e-3]]}
    p = tmp_path / "hw.toml"
    p.write_text('[hardware]\npreset = "cpu"\n[hardware.fsdp_situ_measured]\n'
                 '2 = [[2951168, 2.6e-3]]\n')
    assert load_hardware(str(p)).fsdp_situ_measured == {2: ((2951168.0, 2.6e-3),)}
    for bad in ("0.002", "[[1, 2, 3]]", '[["a", 1]]', "[]", "[[1e6, nan]]", "[[0, 1e-3]]"):
        p.write_text(f'[hardware]\npreset = "cpu"\n[hardware.fsdp_situ_measured]\n2 = {bad}\n')
        with pytest.raises(PtdError, match="fsdp_situ_measured"):
            load_hardware(str(p))


def _tiny_plan(**kw):
    return ParallelPlan(**{"dp": 2, "zero": 3, "micro_batch": 2, "global_batch": 8,
                           "seq_len": 64, "dtype": "fp32", **kw})


def test_the_step_charges_it_once_per_zero3_gather_of_a_pair():
    """tiny has 4 blocks: ZeRO-3 makes 5 units (a block each and the root); each micro-batch
    (2 here) gathers every unit for its forward and again for its backward, so a flat r adds
    2 x 5 x r to the forward and as much to the backward, nowhere else. A pipeline rank of
    pp 2 holds 2 blocks and its chunk's root: 3 units (on four workers: read from a table
    of four). ZeRO-1/2, DDP, dp 4 and a pair among more busy workers than measured: nothing."""
    model = get_preset("tiny")
    cpu = load_hardware("cpu")
    r = 1.5e-3
    hw = cpu.replace(fsdp_situ_measured={2: ((1e6, r),)})
    four = cpu.replace(fsdp_situ_measured={4: ((1e6, r),)})
    for plan, units, table in ((_tiny_plan(), 5, hw), (_tiny_plan(pp=2, schedule="1f1b"), 3, four)):
        base = estimate(model, ClusterSpec(cpu, plan.world_size), plan).step
        got = estimate(model, ClusterSpec(table, plan.world_size), plan).step
        m = plan.n_microbatches
        assert got.forward - base.forward == pytest.approx(m * units * r, rel=1e-9)
        assert got.backward - base.backward == pytest.approx(m * units * r, rel=1e-9)
        assert got.total - base.total == pytest.approx(2 * m * units * r, rel=1e-9)
        assert got.dp_comm_exposed == base.dp_comm_exposed
    for plan, n in ((_tiny_plan(zero=2), 2), (_tiny_plan(zero=1), 2), (_tiny_plan(zero=0), 2),
                    (_tiny_plan(dp=4, global_batch=16), 4), (_tiny_plan(tp=2), 4)):
        assert estimate(model, ClusterSpec(hw, n), plan).step.total == \
            estimate(model, ClusterSpec(cpu, n), plan).step.total
    # a pair beside another (dp 2 x tp 2 on four workers) where four were measured: charged;
    # a group of four on them: not (a gather waits for three peers, not measured in place)
    dp4 = _tiny_plan(dp=4, global_batch=16)
    assert estimate(model, ClusterSpec(four, 4), dp4).step.total == \
        estimate(model, ClusterSpec(cpu, 4), dp4).step.total
    tp2 = _tiny_plan(tp=2)
    assert estimate(model, ClusterSpec(four, 4), tp2).step.total - \
        estimate(model, ClusterSpec(cpu, 4), tp2).step.total == pytest.approx(4 * 5 * r)


def test_a_negative_residual_takes_the_unit_cost_down_never_below_zero():
    """With the per-unit hooks at 0.6 / 0.5 ms, a residual of -0.2 ms leaves 0.4 / 0.3 a
    unit and pass; one of -5 ms leaves 0 (the copies stay), as no hooks at all."""
    model = get_preset("tiny")
    hooks = load_hardware("cpu").replace(overheads_measured={"fsdp_unit_forward": {1: 6e-4},
                                                             "fsdp_unit_backward": {1: 5e-4}})
    plan = _tiny_plan()
    c = ClusterSpec(hooks, 2)
    base = estimate(model, c, plan).step
    down = estimate(model, ClusterSpec(hooks.replace(fsdp_situ_measured={2: ((1e6, -2e-4),)}), 2),
                    plan).step
    assert base.forward - down.forward == pytest.approx(2 * 5 * 2e-4)
    assert base.backward - down.backward == pytest.approx(2 * 5 * 2e-4)
    floor = estimate(model, ClusterSpec(hooks.replace(fsdp_situ_measured={2: ((1e6, -5e-3),)}), 2),
                     plan).step
    bare = estimate(model, ClusterSpec(load_hardware("cpu"), 2), plan).step
    assert floor.forward == pytest.approx(bare.forward)
    assert floor.backward == pytest.approx(bare.backward)


def _point(fsdp=(0.060, 0.120), plain=(0.045, 0.090)):
    return {"tokens": 1024, "units": 3, "unit_bytes": float(BLOCK_BYTES),
            "fsdp": list(fsdp), "plain": list(plain)}


def test_the_residual_closes_the_stage_and_moves_with_its_times():
    """Priced back with the residual it yields, the stage's own plan (the calibration model,
    4 x 256 tokens a rank, ZeRO-3 over a pair) costs exactly the measured difference above
    the plain model: the estimate's forward + backward + exposed communication less the
    same plan's without ZeRO. One more millisecond in the measured backward is 1/6 ms a
    gather (3 units, each gathered twice)."""
    from ptd.runtime.calibrate.tp_situ import SITU_MODEL
    hw = load_hardware(str(REPO / "docs/data/epyc2-2026-11-30/bench1/calibrated.toml"))
    point = _point()
    r = fsdp_residual(point, hw, 2)
    zero3 = ParallelPlan(dp=2, zero=3, micro_batch=4, global_batch=8, seq_len=256, dtype="fp32")
    c = ClusterSpec(hw.replace(fsdp_situ_measured={2: ((BLOCK_BYTES, r),)}), 2)
    z = estimate(SITU_MODEL, c, zero3).step
    d = estimate(SITU_MODEL, c, dataclasses.replace(zero3, zero=0)).step
    assert z.forward + z.backward + z.dp_comm_exposed - d.forward - d.backward == \
        pytest.approx(0.180 - 0.135, rel=1e-9)
    later = fsdp_residual(_point(fsdp=(0.060, 0.121)), hw, 2)
    assert later - r == pytest.approx(1e-3 / 6, rel=1e-9)
    # the plain side counts against it: a slower plain model, a smaller residual
    assert fsdp_residual(_point(plain=(0.046, 0.090)), hw, 2) == pytest.approx(r - 1e-3 / 6)


def test_the_profile_table_holds_the_mean_points_residual():
    """Two ranks' points become their mean; the table's point is (a block unit's bytes, the
    mean point's residual priced from the profile's other tables), keyed by 2 workers."""
    from test_calibrate import _synthetic
    plan, results = _synthetic()
    for rank, r in enumerate(results):
        r["collectives"]["fsdp_situ"] = {"2": _point(fsdp=(0.060 + 0.002 * rank, 0.120),
                                                     plain=(0.045, 0.090 - 0.004 * rank))}
    s = summarize(plan, results)
    (p,) = s["fsdp_situ"][2]
    assert p["fsdp"] == [pytest.approx(0.061), pytest.approx(0.120)]
    assert p["plain"] == [pytest.approx(0.045), pytest.approx(0.088)]
    table = profile_table(s, get_hardware_preset("cpu"), "synth", "cpu", 8 * 2**30, "test")
    (row,) = table["fsdp_situ_measured"]["2"]
    # priced from the table without its own row: the residual is what the rest leave out
    rest = hardware_from_dict({k: v for k, v in table.items() if k != "fsdp_situ_measured"}, "s")
    assert row == [float(BLOCK_BYTES), pytest.approx(fsdp_residual(p, rest, 2), rel=1e-9)]
    assert hardware_from_dict(table, "synth").fsdp_situ_measured[2] == (
        (float(BLOCK_BYTES), pytest.approx(row[1])),)
    del results[0]["collectives"]["fsdp_situ"], results[1]["collectives"]["fsdp_situ"]
    assert "fsdp_situ_measured" not in profile_table(summarize(plan, results),
                                                     get_hardware_preset("cpu"), "s", "cpu",
                                                     8 * 2**30, "test")


def _stage(rank, store, q):
    import torch
    import torch.distributed as dist
    from ptd.runtime.calibrate import bench
    from ptd.runtime.calibrate.fsdp_situ import fsdp_situ
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)

    class Barrier:
        def wait(self, timeout: float) -> None:
            dist.barrier()
    got = fsdp_situ(rank, 2, None, Barrier(), 30.0, rounds=2, seq=32, micro_batch=2)
    plan = {"group_sizes": [2], "kinds": [], "coll_sizes": [], "repeats": 1,
            "blocking_chunks": {0: 2}, "blocking_bytes": 1024, "blocking_side": 8,
            "dtensor_reduce_sizes": [1024], "dtensor_reduce_pairs": 2, "fsdp_situ_rounds": 1}
    ticks: list[str] = []
    times, _ = bench.collective_suite(rank, 2, plan, torch.device("cpu"), Barrier(), 60.0,
                                      ticks.append)
    q.put((rank, (got, times["fsdp_situ"]["2"]["tokens"], ticks)))
    dist.destroy_process_group()


@pytest.mark.dist
@pytest.mark.timeout(180)
def test_the_stage_on_a_real_pair(tmp_path):
    """Two blocks of hidden 256 under ptd's ZeRO-3 on a real pair, 2 x 32 tokens a rank: 3
    units, a block's fp32 bytes by hand, and each pass slower than the plain model's (every
    unit's 2.95 MB gather against a few milliseconds of work). In the collectives' suite it
    runs after DTensor's all-reduce, at 4 x 256 tokens."""
    out = run_ranks(_stage, 2, str(tmp_path / "store"), timeout=180)
    for rank in (0, 1):
        got, tokens, ticks = out[rank]
        assert (got["tokens"], got["units"], got["unit_bytes"]) == (64, 3, BLOCK_BYTES)
        assert got["fsdp"][0] > got["plain"][0] > 0 and got["fsdp"][1] > got["plain"][1] > 0
        assert tokens == 1024
        assert ticks == ["blocking collectives", "DTensor all-reduce", "ZeRO-3 in place"]


def test_only_a_full_cpu_calibration_runs_it():
    from ptd.runtime.calibrate.fsdp_situ import FSDP_SITU_ROUNDS
    from ptd.runtime.calibrate.workers import make_plan, stage_labels
    full = make_plan([1, 2], ["fp32"], False, "cpu")
    assert full["fsdp_situ_rounds"] == FSDP_SITU_ROUNDS == 12
    assert "ZeRO-3 in place" in stage_labels(full)
    for p in (make_plan([1, 2], ["fp32"], True, "cpu"), make_plan([1, 2], ["fp32"], False, "cuda")):
        assert p["fsdp_situ_rounds"] == 0
        assert "ZeRO-3 in place" not in stage_labels(p)

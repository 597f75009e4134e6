"""The calibration's tp-in-place stage (runtime/calibrate/tp_situ.py): the all-reduces it
counts on two real ranks, the residual's arithmetic by hand, the profile's table, the cost
model adding it once per tp collective, and the stage's place in a full calibration only."""

import pytest

from helpers import run_ranks
from ptd.runtime.calibrate.profile import profile_table, summarize, tp_residual
from ptd.specs import get_preset
from ptd.specs.hardware import (ClusterSpec, CollectiveFit, get_hardware_preset, hardware_from_dict,
                                load_hardware)
from ptd.specs.plan import ParallelPlan


def _box(**changes):
    """A CPU with round numbers: all-reduce of a pair 0.1 ms + bytes / 1 GB/s (bus factor 1
    at 2), DTensor's extra 0.2 ms flat, a blocking wait of 1 ms + 0.1 x the chunk."""
    return load_hardware("cpu").replace(
        collectives=(CollectiveFit(kind="all_reduce", group_size=2, alpha=1e-4,
                                   bus_bandwidth=1e9),),
        dtensor_reduce_measured={2: ((1e3, 2e-4), (2e6, 2e-4))},
        blocking_wait_measured={2: ((0.0, 1e-3), (1e-2, 2e-3))}, **changes)


def test_the_residual_by_hand():
    """19 all-reduces (3 of 4 kB, 16 of 1 MiB) in a pair step of 120 ms against 60 ms on one
    rank. The chunk between two is 60/19 ms, so each waits 1 + 0.1 x 60/19 ms; the 3 small
    ones cost 0.1 + 0.004096 + 0.2 ms, the 16 large 0.1 + 1.048576 + 0.2 ms:
    3 x 0.304096 + 16 x 1.348576 + (19 + 6) ms = 47.489504 ms priced, 60 measured;
    (60 - 47.489504) / 19 = 0.658447 ms each. At 100 ms it is negative, -0.394184."""
    point = {"tokens": 1024, "tp": 0.120, "one": 0.060,
             "all_reduces": [[4096, 3], [1048576, 16]]}
    assert tp_residual(point, _box(), 2) == pytest.approx(12.510496e-3 / 19, rel=1e-9)
    assert tp_residual(dict(point, tp=0.100), _box(), 2) == pytest.approx(-7.489504e-3 / 19,
                                                                          rel=1e-9)


def test_lookup_round_trip_and_bad_tables(tmp_path):
    """The least-squares line through the points, negative where it runs below 0 (not
    floored, unlike DTensor's extra); 0 where absent; the TOML form loads and dumps."""
    from ptd.errors import PtdError
    base = load_hardware("cpu")
    assert base.tp_situ_at(2**20, 2) == 0.0
    assert load_hardware("h100-sxm").tp_situ_at(2**20, 8) == 0.0
    # (1e6, 1 ms), (2e6, 0.5 ms): slope -0.5 ms per 1e6 bytes
    hw = base.replace(tp_situ_measured={2: ((1e6, 1e-3), (2e6, 5e-4)), 4: ((1e6, 3e-3),)})
    assert hw.tp_situ_at(3e6, 2) == pytest.approx(0.0, abs=1e-15)
    assert hw.tp_situ_at(4e6, 2) == pytest.approx(-5e-4)
    assert hw.tp_situ_at(0.0, 2) == pytest.approx(1.5e-3)
    assert ClusterSpec(hw, 4).tp_situ(1e9) == 3e-3  # one point: flat; 4 workers' table
    assert hw.tp_situ_at(1e6, 3) == 3e-3  # 3 -> the 4-worker points
    assert hw.tp_situ_at(1e6, 5) == 0.0  # more than any count measured: none
    assert hw.to_dict()["tp_situ_measured"]["2"] == [[1e6, 1e-3], [2e6, 5e-4]]
    p = tmp_path / "box.toml"
    p.write_text('[hardware]\npreset = "cpu"\n[hardware.tp_situ_measured]\n'
                 '2 = [[524288, -0.0002], [1048576, 0.0007]]\n')
    assert load_hardware(str(p)).tp_situ_measured == {2: ((524288.0, -2e-4), (1048576.0, 7e-4))}
    for bad in ("0.001", "[[0, 0.001]]", "[[65536, nan]]", '[[65536, "x"]]', "[]"):
        p.write_text(f'[hardware]\npreset = "cpu"\n[hardware.tp_situ_measured]\n2 = {bad}\n')
        with pytest.raises(PtdError, match="tp_situ_measured"):
            load_hardware(str(p))


def test_the_step_adds_it_once_per_tp_collective():
    """A flat residual r adds (tp pair's collectives) x r to tp_comm: per block 2 forward and 5
    backward (wq, wk, wv, w1, w3 input gradients; tiny is SwiGLU), the embedding, the output
    layer's input gradient and loss_parallel's 3 -- and under sp once per reduce-scatter and
    all-gather pair (4 a block, the embedding, the output gradient, the output's gather, 3
    loss), not once per call. A negative one takes DTensor's extra down, never below 0.
    Compute does not move; without tp nothing is added."""
    from ptd.cost.step import step_time
    model = get_preset("tiny")
    cpu = load_hardware("cpu").replace(blocking_wait_measured={})
    extra = cpu.replace(dtensor_reduce_measured={2: ((1e6, 1e-3),)})
    plan = ParallelPlan(dp=1, tp=2, micro_batch=2, global_batch=4, seq_len=64, dtype="fp32")
    per_mb = model.n_layers * (2 + 5) + 1 + 1 + 3
    per_mb_sp = model.n_layers * 4 + 1 + 1 + 1 + 3
    for p, count in ((plan, per_mb), (plan.replace(sp=True), per_mb_sp)):
        base = step_time(model, p, ClusterSpec(cpu, 2))
        got = step_time(model, p, ClusterSpec(cpu.replace(tp_situ_measured={2: ((1e6, 4e-4),)}), 2))
        assert got.tp_comm - base.tp_comm == pytest.approx(p.n_microbatches * count * 4e-4)
        assert got.compute == base.compute
    base = step_time(model, plan, ClusterSpec(extra, 2))
    down = step_time(model, plan, ClusterSpec(extra.replace(tp_situ_measured={2: ((1e6, -4e-4),)}), 2))
    assert base.tp_comm - down.tp_comm == pytest.approx(plan.n_microbatches * per_mb * 4e-4)
    floor = step_time(model, plan, ClusterSpec(extra.replace(tp_situ_measured={2: ((1e6, -5e-3),)}), 2))
    bare = step_time(model, plan, ClusterSpec(cpu, 2))
    assert floor.tp_comm == pytest.approx(bare.tp_comm)  # extra + residual < 0: nothing
    dp = ParallelPlan(dp=2, micro_batch=2, global_batch=4, seq_len=64, dtype="fp32")
    assert step_time(model, dp, ClusterSpec(cpu.replace(tp_situ_measured={2: ((1e6, 4e-4),)}), 2)
                     ).total == step_time(model, dp, ClusterSpec(cpu, 2)).total
    # measured in pairs, it prices pairs: tp 2 beside pp 2 on 4 workers reads the 4-worker
    # points where there are some, none past the largest count measured; tp 4 (a group of
    # 4, its own blocking curve) none
    tp2pp2 = ParallelPlan(tp=2, pp=2, micro_batch=2, global_batch=4, seq_len=64, dtype="fp32")
    tp4 = ParallelPlan(tp=4, micro_batch=2, global_batch=4, seq_len=64, dtype="fp32")
    four = cpu.replace(tp_situ_measured={4: ((1e6, 4e-4),)})
    two = cpu.replace(tp_situ_measured={2: ((1e6, 4e-4),)})
    got, base, none = (step_time(model, tp2pp2, ClusterSpec(hw, 4)) for hw in (four, cpu, two))
    assert got.tp_comm > base.tp_comm
    assert none.total == base.total
    assert step_time(model, tp4, ClusterSpec(four, 4)).total == \
        step_time(model, tp4, ClusterSpec(cpu, 4)).total


def test_the_profile_table_holds_each_points_residual():
    """Two ranks' points become their mean, and the table's residual is that mean point's,
    priced by the profile's own fit (0.1 ms + bytes / 1 GB/s here) and the cpu preset's
    blocking curve (the synthetic timings have none of their own) -- the residual is
    priced from the other tables, so it is set last."""
    from test_calibrate import _synthetic
    plan, results = _synthetic()
    for rank, r in enumerate(results):
        r["collectives"]["tp_situ"] = {"2": [
            {"tokens": 512, "tp": 0.050 + 0.002 * rank, "one": 0.030,
             "all_reduces": [[2048, 3], [524288, 16]]},
            {"tokens": 1024, "tp": 0.100, "one": 0.060 - 0.002 * rank,
             "all_reduces": [[4096, 3], [1048576, 16]]}]}
    s = summarize(plan, results)
    assert [(p["tp"], p["one"]) for p in s["tp_situ"][2]] == [
        (pytest.approx(0.051), pytest.approx(0.030)), (pytest.approx(0.100), pytest.approx(0.059))]
    table = profile_table(s, get_hardware_preset("cpu"), "synth", "cpu", 8 * 2**30, "test")
    wait = get_hardware_preset("cpu").blocking_wait_at
    rows = table["tp_situ_measured"]["2"]
    for (nbytes, resid), (tp, one, small, large) in zip(
            rows, [(0.051, 0.030, 2048, 524288), (0.100, 0.059, 4096, 1048576)]):
        priced = 3 * (1e-4 + small / 1e9) + 16 * (1e-4 + large / 1e9) + 19 * wait(one / 19, 2, 2)
        assert nbytes == large
        assert resid == pytest.approx((tp - one - priced) / 19, rel=1e-6)
    hw = hardware_from_dict(table, "synth")
    assert hw.tp_situ_measured[2][1] == (1048576.0, pytest.approx(rows[1][1]))


def _stage(rank, store, q):
    import torch
    import torch.distributed as dist
    from ptd.runtime.calibrate import bench
    from ptd.runtime.calibrate.tp_situ import tp_situ
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    ones = [dist.new_group([r]) for r in range(2)]

    class Barrier:
        def wait(self, timeout: float) -> None:
            dist.barrier()
    got = tp_situ(rank, 2, None, ones[rank], Barrier(), 30.0, rounds=2, seq=16,
                  micro_batches=(1, 2))
    plan = {"group_sizes": [2], "kinds": [], "coll_sizes": [], "repeats": 1,
            "blocking_chunks": {0: 2}, "blocking_bytes": 1024, "blocking_side": 8,
            "dtensor_reduce_sizes": [1024], "dtensor_reduce_pairs": 2, "tp_situ_rounds": 1}
    ticks: list[str] = []
    times, _ = bench.collective_suite(rank, 2, plan, torch.device("cpu"), Barrier(), 60.0,
                                      ticks.append)
    q.put((rank, (got, {n: [p["tokens"] for p in pts] for n, pts in times["tp_situ"].items()},
                   ticks)))
    dist.destroy_process_group()


def test_the_stage_counts_the_pairs_all_reduces(tmp_path):
    """Two blocks of hidden 256 on a real pair: per micro-batch of 16 tokens a block's 2
    forward and 5 backward all-reduces, the embedding's and the output layer's input
    gradient -- 16 of 16 x 256 x 4 bytes -- and loss_parallel's 3 of 4 bytes a token; the
    pair's step takes longer than the one-rank mesh's. In the collectives' suite the stage
    runs after DTensor's all-reduce, at 512, 1024 and 2048 tokens, keyed by 2 workers."""
    out = run_ranks(_stage, 2, str(tmp_path / "store"), timeout=180)
    for rank in (0, 1):
        got, tokens, ticks = out[rank]
        assert [p["tokens"] for p in got] == [16, 32]
        for p, mb in zip(got, (1, 2)):
            assert p["all_reduces"] == [[4 * 16 * mb, 3], [16 * mb * 256 * 4, 16]]
            assert p["tp"] > p["one"] > 0
        assert tokens == {"2": [512, 1024, 2048]}
        assert ticks == ["blocking collectives", "DTensor all-reduce", "tp collectives in place"]


def test_only_a_full_cpu_calibration_runs_it():
    from ptd.runtime.calibrate.tp_situ import SITU_ROUNDS
    from ptd.runtime.calibrate.workers import make_plan, stage_labels
    full = make_plan([1, 2], ["fp32"], False, "cpu")
    assert full["tp_situ_rounds"] == SITU_ROUNDS == 10
    assert "tp collectives in place" in stage_labels(full)
    for p in (make_plan([1, 2], ["fp32"], True, "cpu"), make_plan([1, 2], ["fp32"], False, "cuda")):
        assert p["tp_situ_rounds"] == 0
        assert "tp collectives in place" not in stage_labels(p)


def test_the_one_rank_model_holds_a_tp_ranks_shapes():
    """Half the heads (8 -> 4 of 32), half the kv heads (4 -> 2), half of SwiGLU's 704 and
    of the vocabulary (256 -> 128): the local shapes of a tp-2 rank, by hand."""
    from ptd.runtime.calibrate.tp_situ import SITU_MODEL, _local
    loc = _local(SITU_MODEL, 2)
    assert (loc.n_heads, loc.n_kv_heads, loc.head_dim, loc.ffn_hidden, loc.vocab_size,
            loc.hidden, loc.n_layers) == (4, 2, 32, 352, 128, 256, 2)

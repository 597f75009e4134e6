"""bench/scaling.py by hand, from a sampled mutation run (40 of 948 mutants, seed 20261129;
docs/testing.md): the micro-batch rule, which speedups Amdahl's fit takes, the cluster
table's layouts, speedups and relative fit, and the per-round table. No runs: the cluster
table is the cost model's alone, and the measured tables are fed by hand."""

import pytest

from ptd.bench import scaling as S
from ptd.bench.scaling import Layout, amdahl_fit, micro_batch


@pytest.mark.parametrize("lay, gb, mb", [
    (Layout(2, 1, 1, 0), 8, 4),    # a replica's batch whole: 8 / 2
    (Layout(1, 2, 1, 0), 8, 8),    # tp shares one replica
    (Layout(1, 1, 2, 0), 8, 2),    # pp 2: 2 x 2 = 4 micro-batches of 2
    (Layout(1, 1, 4, 0), 64, 8),   # pp 4: 8 micro-batches of 8 (not 16 of 4)
    (Layout(2, 1, 2, 0), 16, 2),   # 8 a replica, in 4 pieces
    (Layout(1, 1, 4, 0), 4, 1),    # fewer samples than pieces: one sample, never zero
])
def test_micro_batch_is_the_replica_batch_in_two_pieces_per_stage(lay, gb, mb):
    assert micro_batch(lay, gb) == mb


def _amdahl(p, n):
    return 1 / ((1 - p) + p / n)


def test_amdahl_fit_takes_every_positive_speedup_and_nothing_else():
    # exact P = 0.5 data at 4 and 8; a nonsense negative point at 2 must not move it
    s = {1: 1.0, 2: -1.0, 4: _amdahl(0.5, 4), 8: _amdahl(0.5, 8)}
    assert amdahl_fit(s)[0] == pytest.approx(0.5, abs=1e-9)
    # slowdowns are measured points too (S < 1): the fit runs and says P is outside [0, 1]
    p, why = amdahl_fit({1: 1.0, 2: 0.8, 4: 0.7})
    assert p is None and "outside [0, 1]" in why
    p, why = amdahl_fit({1: 1.0, 2: 1.5, 4: float("nan")})
    assert p is None and "1 measured point(s)" in why


@pytest.fixture(scope="module")
def cluster():
    # Llama 2 7B (32 heads: tp 8 divides them) on H100s, global batch 32: ddp at 64 GPUs has
    # no whole sample a replica, pp 4 at 64 (dp 16) too few micro-batches for its stages
    return S.cluster_tables("llama2-7b", "h100-sxm", [8, 16, 32, 64], 1024, 32,
                            ["ddp", "zero2", "tp", "pp", "3d"])


def test_cluster_layouts_follow_each_strategy(cluster):
    rows = {(r["strategy"], r["n"]): r["plan"] for r in cluster["speedup"]}
    assert {n for s, n in rows if s == "ddp"} == {8, 16, 32}  # 32 % 64 != 0: no row
    assert {n for s, n in rows if s == "pp"} == {8, 16, 32}
    assert rows[("ddp", 8)].startswith("dp8 tp1 pp1 zero0")
    assert rows[("zero2", 16)].startswith("dp16 tp1 pp1 zero2")
    # tp: 8 a node, ZeRO-1 over the rest; pp: 4 stages, ZeRO-1 over the rest
    assert rows[("tp", 64)].startswith("dp8 tp8 pp1 zero1")
    assert rows[("tp", 8)].startswith("dp1 tp8 pp1 zero1")
    assert rows[("pp", 16)].startswith("dp4 tp1 pp4 zero1")
    # 3d: tp 8 x pp 4 from 32 GPUs on; below, tp 8 alone, which fills 8 only
    assert rows[("3d", 64)].startswith("dp2 tp8 pp4 zero1")
    assert rows[("3d", 8)].startswith("dp1 tp8 pp1 zero1")
    assert ("3d", 16) not in rows


def test_cluster_speedup_is_over_the_smallest_size_as_that_many_devices(cluster):
    by = {}
    for r in cluster["speedup"]:
        by.setdefault(r["strategy"], []).append(r)
    for strat, rs in by.items():
        n0, t0 = rs[0]["n"], rs[0]["step_s"]
        for r in rs:
            assert r["speedup"] == pytest.approx(t0 * n0 / r["step_s"])
            assert r["efficiency"] == pytest.approx(r["speedup"] / r["n"])
        assert rs[0]["speedup"] == pytest.approx(n0)


def test_cluster_amdahl_is_fitted_relative_to_the_smallest_size(cluster):
    by = {}
    for r in cluster["speedup"]:
        by.setdefault(r["strategy"], []).append((r["n"], r["step_s"]))
    fitted = {a["strategy"]: a for a in cluster["amdahl"]}
    assert set(fitted) == {s for s, pts in by.items() if len(pts) >= 2}
    for strat, pts in by.items():
        if len(pts) < 2:
            continue
        (n0, t0), rest = pts[0], pts[1:]
        # Amdahl over k = n / n0 units, S'(k) = t0 / t, least squares in
        # 1/S' - 1 = P (1/k - 1) (worked here, not the code's)
        xs = [1 / (n / n0) - 1 for n, _ in rest]
        ys = [t / t0 - 1 for _, t in rest]
        p = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
        a = fitted[strat]
        assert len(rest) >= 2 and 0 < p < 1, strat  # (this grid: a fit for every strategy)
        assert a["P"] == pytest.approx(p, rel=1e-9), strat


def _res(rounds):
    row = {"strategy": "ddp", "n": 2, "plan": "dp2", "step_s": 0.6, "step_s_pred": 0.5,
           "speedup": 1.5, "speedup_pred": 1.6, "efficiency": 0.75, "efficiency_pred": 0.8,
           "mfu": 0.1, "mfu_pred": 0.1, "ratio_rounds": rounds}
    return {"speedup": [row], "amdahl": [], "memory": []}


def test_render_has_one_column_per_round():
    text = S.render(_res([1.2, 1.0, 1.8]), None)
    head = next(ln for ln in text.splitlines() if ln.lstrip().startswith("strategy")
                and "round 1" in ln)
    assert head.split()[2:] == ["round", "1", "round", "2", "round", "3", "median"]
    assert "in each of 3 rounds" in text

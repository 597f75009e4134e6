"""ptd bench scaling: scaling tables measured on this machine, beside the cost model's
prediction, then predicted at cluster scale. Before and after the runs it times this
machine's matmul rate and memory bandwidth against the profile's (a shared machine drifts
from its calibration; the ratios are printed, the predictions unchanged).

For one model and one global batch, each strategy (DDP, ZeRO-1/2/3, TP, PP and a 3-D mix)
runs at each worker count (1, 2, 4) as a short real `ptd train`; the tables are speedup and
efficiency per strategy and worker count, Amdahl's parallel fraction P fitted per strategy,
memory per device per ZeRO stage and the step-time breakdown -- each measured beside the
prediction. Then the same tables predicted for --cluster-model on N = 8 ... 1024 of
--cluster-hardware. Writes scaling.json, CSV files and PNG plots to --out.

  ptd bench scaling                     # ~10 min on a 2-core CPU
  ptd bench scaling --quick             # reduced grid (1 and 2 workers, 4 strategies), ~2 min
  ptd bench scaling --rounds 3          # the grid three times: each row's median round
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from .args import path_arg, positive_int, positive_ints
from ..errors import PtdError

HELP = "scaling benchmarks: speedup, efficiency, Amdahl, memory per ZeRO stage (measured and predicted)"


def _strategies(s: str) -> list[str]:
    from ..bench.scaling import STRATEGIES
    v = [x.strip() for x in s.split(",") if x.strip()]
    bad = [x for x in v if x not in STRATEGIES]
    if bad or not v:
        raise argparse.ArgumentTypeError(f"strategies are {', '.join(STRATEGIES)}; got {s!r}")
    if len(set(v)) != len(v):
        raise argparse.ArgumentTypeError(f"a strategy is named twice in {s!r}")
    return v


def add(p: argparse.ArgumentParser) -> None:
    p.add_argument("what", choices=["scaling"], help="which benchmark")
    p.add_argument("--model", default="small", help="model to run here (small)")
    p.add_argument("--seq-len", type=positive_int, default=128)
    p.add_argument("--global-batch", type=positive_int, default=16)
    p.add_argument("--steps", type=positive_int, default=7,
                   help="steps per run: warm-up, memory step, profiled step, clean steps (7)")
    p.add_argument("--workers", type=lambda s: positive_ints(s, 8), default=None,
                   help="worker counts (1,2,4; at most 8)")
    p.add_argument("--strategies", type=_strategies, default=None,
                   help="ddp,zero1,zero2,zero3,tp,pp,3d (all)")
    p.add_argument("--hardware", help="profile for the predictions (default: as ptd train)")
    p.add_argument("--quick", action="store_true",
                   help="reduced grid: workers 1,2; ddp, zero3, tp, pp; tiny model; 5 steps")
    p.add_argument("--cluster-model", default="llama3-8b")
    p.add_argument("--cluster-hardware", default="h100-sxm")
    p.add_argument("--cluster-gpus", type=positive_ints, default=[8, 16, 32, 64, 128, 256, 512, 1024])
    p.add_argument("--cluster-seq-len", type=positive_int, default=4096)
    p.add_argument("--cluster-global-batch", type=positive_int, default=1024)
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--run-timeout", type=float, default=240.0, help="seconds per run (240)")
    p.add_argument("--rounds", type=positive_int, default=1,
                   help="run the whole grid this many times, round after round; each row "
                        "reports its median round and every round's measured / predicted (1)")
    p.add_argument("--out", type=path_arg, help="output folder (runs/bench, replaced by each bench)")
    p.add_argument("--force", action="store_true",
                   help="replace the results of an earlier bench in --out")


def run(a: argparse.Namespace) -> int:
    from ..bench import scaling as S
    if a.quick:
        a.workers = a.workers or [1, 2]
        a.strategies = a.strategies or ["ddp", "zero3", "tp", "pp"]
        if a.model == "small":
            a.model = "tiny"
        a.steps = min(a.steps, 5)
        a.cluster_gpus = [8, 64, 512]
    a.workers = a.workers or [1, 2, 4]
    a.strategies = a.strategies or list(S.STRATEGIES)
    if 1 not in a.workers:
        raise PtdError("--workers must include 1 (the baseline of the speedups)")
    from ..specs import load_model
    check_runs(S, load_model(a.model), a)  # every run's plan, before anything runs
    from .. import flagcheck
    flagcheck.bench(a)  # --run-timeout, writable --out, hardware of this host
    # the cluster tables are the cost model's alone: priced first, so that a bad
    # --cluster-* flag is refused before minutes of runs rather than after them
    from ..specs import load_hardware
    for flag, load, name in (("--cluster-model", load_model, a.cluster_model),
                             ("--cluster-hardware", load_hardware, a.cluster_hardware)):
        try:
            load(name)
        except PtdError as e:
            raise PtdError(f"{flag}: {e}") from None
    cl = S.cluster_tables(a.cluster_model, a.cluster_hardware, a.cluster_gpus, a.cluster_seq_len,
                          a.cluster_global_batch, a.strategies)
    if not cl["speedup"]:
        raise PtdError(f"no cluster layout applies to --cluster-gpus "
                       f"{','.join(map(str, a.cluster_gpus))} with --cluster-global-batch "
                       f"{a.cluster_global_batch} (each size's data-parallel ranks must divide "
                       "the global batch; tp, pp and 3d need multiples of 8 and 4)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from ..runtime.calibrate.first_run import ensure_profile
    ensure_profile(a.hardware)  # the runs' predictions use this machine's numbers
    from ..runtime.calibrate import drift
    from ..runtime.calibrate.first_run import resolve_hardware
    hw = resolve_hardware(a.hardware or "auto")[0]
    t0 = time.perf_counter()
    before = drift.check(hw)  # the machine against its profile, around the runs
    data = S.measure(out, model=a.model, seq_len=a.seq_len, global_batch=a.global_batch,
                     steps=a.steps, workers=a.workers, strategies=a.strategies,
                     hardware=a.hardware, run_timeout=a.run_timeout, rounds=a.rounds)
    after = drift.check(hw) if before else None
    res = S.tables(data, a.strategies, a.workers)
    elapsed = time.perf_counter() - t0
    meta = {"model": a.model, "seq_len": a.seq_len, "global_batch": a.global_batch,
            "steps": a.steps, "workers": a.workers, "strategies": a.strategies,
            "rounds": a.rounds, "seconds": elapsed,
            "machine_vs_profile": {"before": before, "after": after},
            "other_load": data.get("other_load", [])}
    slim_rows = [{k: v for k, v in r.items() if k != "summary"} |
                 {"summary": {k: r["summary"].get(k) for k in ("measured", "predicted", "ratio",
                                                               "plan_desc", "error", "wall_s")}}
                 for r in data["rows"]]
    from ..safeio import dumps_strict
    (out / "scaling.json").write_text(dumps_strict({"meta": meta, "measured": res, "cluster": cl,
                                                  "runs": slim_rows}, indent=1, default=str) + "\n")
    S.write_csv(out / "speedup.csv", res["speedup"])
    S.write_csv(out / "memory.csv", res["memory"])
    S.write_csv(out / "amdahl.csv", res["amdahl"])
    S.write_csv(out / "cluster_speedup.csv", cl["speedup"])
    S.write_csv(out / "cluster_memory.csv", cl["memory"])
    print(S.render(res, cl))
    line = drift.describe(before, after)
    if line:
        print(f"\n{line}")
    from ..runtime.calibrate.quiet import warning
    shared = warning(meta["other_load"], os.cpu_count() or 1, key="run",
                     consequence="those rows read slow for a reason the cost model cannot see")
    if shared:
        print(f"ptd bench: {shared}", file=sys.stderr)
    if not a.no_plots:
        _plots(S, res, cl, data, out, a)
    print(f"\nptd bench: {len(data['rows'])} rows in {elapsed:.0f} s; wrote {out}/scaling.json, "
          f"*.csv{'' if a.no_plots else ', *.png'}")
    return bench_status(data["rows"], res)


def check_runs(S, model, a: argparse.Namespace) -> None:  # type: ignore[no-untyped-def]
    """Refuse, before the first run, a grid with a run ``ptd train`` would refuse (a bench
    that fails its rows one by one, minutes in, has measured nothing worth keeping)."""
    from ..specs import ParallelPlan
    if a.steps < 2:  # each run warms up over its first step and tracks memory at step 2
        raise PtdError(f"--steps {a.steps}: each run needs at least 2 (a warm-up step, then the "
                       "memory step)")
    if a.seq_len > model.max_seq_len:
        raise PtdError(f"--seq-len {a.seq_len} exceeds {model.name}'s max_seq_len {model.max_seq_len}")
    for n in a.workers:
        for strat in a.strategies:
            lay = S.layout(strat, n)
            plan = ParallelPlan(dp=lay.dp, tp=lay.tp, pp=lay.pp, zero=lay.zero,
                                micro_batch=S.micro_batch(lay, a.global_batch),
                                global_batch=a.global_batch, seq_len=a.seq_len, schedule="1f1b")
            try:  # (the runtime's further rules concern schedules and compression it never uses)
                plan.validate(model, lay.n)
            except PtdError as e:
                raise PtdError(f"{strat} on {n} worker(s) ({plan.describe()}): {e}") from None


def bench_status(rows: list, res: dict) -> int:
    """1 with one line when a row failed or a table came out empty (a partial benchmark is
    not a result), else 0."""
    failed = [r for r in rows if "error" in r["summary"]]
    if failed:
        f = failed[0]
        print(f"ptd bench: error: {len(failed)} of {len(rows)} run(s) failed; first "
              f"{f['strategy']} N={f['n']}: {f['summary']['error']}", file=sys.stderr)
        return 1
    empty = [k for k in ("speedup", "memory") if not res.get(k)]
    if empty:
        print(f"ptd bench: error: empty table(s): {', '.join(empty)}", file=sys.stderr)
        return 1
    return 0


def _plots(S, res, cl, data, out: Path, a: argparse.Namespace) -> None:  # type: ignore[no-untyped-def]
    from ..bench import plots as P
    P.speedup_plot(res["speedup"], res["amdahl"], out / "speedup.png",
                   f"{a.model}, global batch {a.global_batch} x {a.seq_len}: speedup on this machine")
    nmax = max(a.workers)
    zero = [r for r in res["memory"] if r["n"] == nmax and r["strategy"] in ("ddp", "zero1", "zero2", "zero3")]
    P.memory_plot(zero or res["memory"], out / "memory.png",
                  f"memory per device at N={nmax} by ZeRO stage (measured | predicted)")
    P.breakdown_plot([r for r in res["breakdown"] if r["n"] == nmax], out / "breakdown.png",
                     f"step-time breakdown at N={nmax} (measured | predicted)")
    pp = [r for r in data["rows"] if r["strategy"] == "pp" and r["n"] == nmax]
    if pp and "per_rank" not in pp[0]["summary"]:
        pass
    if pp:
        run_dir = out / "runs" / "n{}-dp{}-tp{}-pp{}-z{}".format(nmax, *pp[0]["layout"])
        summ = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
        if summ.get("per_rank"):
            P.timeline_plot(summ["per_rank"], out / "pipeline_timeline.png",
                            f"pipeline pp={nmax} (1F1B), one profiled step: gaps are the bubble")
    P.speedup_plot(cl["speedup"], cl["amdahl"], out / "cluster_speedup.png",
                   f"{cl['model']} on {cl['hardware']} (predicted): speedup vs ideal", predicted=False)
    P.cluster_memory_plot([r for r in cl["memory"] if r["strategy"] in ("ddp", "zero1", "zero2", "zero3")
                           and r["n"] == min(x["n"] for x in cl["memory"])],
                          out / "cluster_memory.png",
                          f"{cl['model']} per device by ZeRO stage (predicted)")

#!/usr/bin/env python
"""ptd against the tools people would otherwise use, on this machine: tokens/s of the same
model, global batch, micro-batch, sequence length, worker count and steps under ``ptd train``,
Hugging Face Accelerate (DDP) and DeepSpeed (ZeRO 1, 2, 3), side by side. Outside CI.

    ./scripts/setup-compare                           # .venv-compare: torch 2.13.0 (CPU),
                                                      # accelerate, deepspeed, ptd
    .venv-compare/bin/python scripts/compare_frameworks.py            # ~10 min on 2 cores
    .venv-compare/bin/python scripts/compare_frameworks.py --repeats 1 --steps 8   # quicker

Pairs: DDP is ptd ``--zero 0`` against Accelerate; ZeRO-k is ptd ``--zero k`` against
DeepSpeed stage k. A framework that is not installed, or whose run fails, is reported as
such (with the last line it printed) and the others still run.

Every run is a fresh launch (torchrun, gloo, one intra-op thread per worker). The repeats are
interleaved -- each round runs every configuration once -- and each configuration keeps its
best round, so a noisy minute on a shared machine slows all of them alike and cannot pick a
winner. tokens/s is measured the same way for all (see scripts/compare_worker.py): tokens of
a step over the mean wall-clock step time of the steps after the first. The first-step
loss is printed too: equal initial weights and data give an equal first loss, which shows
that the frameworks train the same thing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def ptd_run(a: argparse.Namespace, zero: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "ptd", "train", "--model", a.model, "--nproc", str(a.nproc),
           "--dp", str(a.nproc), "--zero", str(zero), "--seq-len", str(a.seq_len),
           "--global-batch", str(a.global_batch), "--micro-batch", str(a.micro_batch),
           "--steps", str(a.steps), "--profile-steps", "0", "--memory-step", "0",
           "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    (out.parent / f"{out.name}.log").write_text(r.stdout + r.stderr)
    if r.returncode or not (out / "summary.json").is_file():
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1]}
    s = json.loads((out / "summary.json").read_text())
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [d["loss"] for d in recs if "step" in d and "loss" in d]
    import ptd
    return {"tokens_per_s": s["measured"]["tokens_per_s"],
            "step_time_s": s["measured"]["step_time_s"], "losses": losses,
            "version": ptd.__version__}


def other_run(a: argparse.Namespace, framework: str, zero: int, out: Path) -> dict:
    out.parent.mkdir(parents=True, exist_ok=True)
    res = out.with_suffix(".json")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={a.nproc}", str(HERE / "compare_worker.py"),
           "--framework", framework, "--zero", str(zero), "--model", a.model,
           "--seq-len", str(a.seq_len), "--global-batch", str(a.global_batch),
           "--micro-batch", str(a.micro_batch), "--steps", str(a.steps), "--out", str(res)]
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, env=env)
    out.with_suffix(".log").write_text(r.stdout + r.stderr)
    if r.returncode or not res.is_file():
        lines = [x for x in (r.stderr + r.stdout).strip().splitlines()
                 if "Error" in x or "error" in x] or (r.stderr.strip().splitlines() or ["?"])
        return {"error": lines[-1][:300]}
    return json.loads(res.read_text())


def f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small")
    p.add_argument("--nproc", type=int, default=4, help="workers (4)")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=12, help="steps per run (12; the first is not timed)")
    p.add_argument("--repeats", type=int, default=2, help="interleaved rounds; the best counts (2)")
    p.add_argument("--strategies", default="ddp,zero1,zero2,zero3")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run (600)")
    p.add_argument("--out", default="runs/compare", help="runs, logs and compare.json (runs/compare)")
    a = p.parse_args()

    have = {m: importlib.util.find_spec(m) is not None for m in ("accelerate", "deepspeed")}
    pairs = []  # (strategy, zero, other framework)
    for s in a.strategies.split(","):
        z = 0 if s == "ddp" else int(s.removeprefix("zero"))
        pairs.append((s, z, "accelerate" if s == "ddp" else "deepspeed"))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[tuple[str, str], list[dict]] = {}
    total = a.repeats * len(pairs) * 2
    done = 0
    t_start = time.perf_counter()
    for r in range(a.repeats):
        for s, z, other in pairs:
            for fw in ("ptd", other):
                t0 = time.perf_counter()
                run_dir = out / f"{s}-{fw}-r{r + 1}"
                if fw == "ptd":
                    res = ptd_run(a, z, run_dir)
                elif not have[fw]:
                    res = {"error": f"{fw} is not installed in {sys.prefix}"}
                else:
                    res = other_run(a, fw, z, run_dir)
                results.setdefault((s, fw), []).append(res)
                done += 1
                msg = res.get("error") or f"{res['tokens_per_s']:,.0f} tokens/s"
                print(f"[{done}/{total}] {s} {fw}: {msg} ({time.perf_counter() - t0:.0f} s)",
                      file=sys.stderr, flush=True)

    def best(runs: list[dict]) -> dict | None:
        ok = [x for x in runs if "error" not in x]
        return max(ok, key=lambda x: x["tokens_per_s"]) if ok else None

    rows, table = [], []
    for s, z, other in pairs:
        bp, bo = best(results[(s, "ptd")]), best(results[(s, other)])
        err = next((x["error"] for x in results[(s, other)] if "error" in x), "")
        row = {"strategy": s, "other": other,
               "ptd_tokens_per_s": bp and bp["tokens_per_s"],
               "other_tokens_per_s": bo and bo["tokens_per_s"],
               "ptd_over_other": (bp["tokens_per_s"] / bo["tokens_per_s"]) if bp and bo else None,
               "ptd_first_loss": bp and bp["losses"][0], "other_first_loss": bo and bo["losses"][0],
               "ptd_last_loss": bp and bp["losses"][-1], "other_last_loss": bo and bo["losses"][-1],
               "other_version": bo and bo.get("version"), "other_error": None if bo else err,
               "ptd_runs": [x.get("tokens_per_s") for x in results[(s, "ptd")]],
               "other_runs": [x.get("tokens_per_s") for x in results[(s, other)]]}
        rows.append(row)
        other_s = f(row["other_tokens_per_s"], ",.0f") if bo else "failed: " + err[:60]
        table.append((s, f"{other} {row['other_version'] or ''}".strip(),
                      f(row["ptd_tokens_per_s"], ",.0f"), other_s, f(row["ptd_over_other"], ".2f"),
                      f"{f(row['ptd_first_loss'], '.4f')} / {f(row['other_first_loss'], '.4f')}",
                      f"{f(row['ptd_last_loss'], '.3f')} / {f(row['other_last_loss'], '.3f')}"))
    head = ("strategy", "against", "ptd tok/s", "other tok/s", "ptd/other",
            "first loss ptd / other", "last loss ptd / other")
    widths = [max(len(str(x)) for x in col) for col in zip(head, *table)]
    print(f"{a.model}, {a.nproc} workers, global batch {a.global_batch} x {a.seq_len} tokens, "
          f"micro-batch {a.micro_batch}, {a.steps} steps, best of {a.repeats} interleaved "
          f"rounds ({time.perf_counter() - t_start:.0f} s)")
    for i, line in enumerate([head, *table]):
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    (out / "compare.json").write_text(json.dumps({"args": vars(a), "rows": rows}, indent=2) + "\n")
    print(f"wrote {out / 'compare.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

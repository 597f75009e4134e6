"""ptd plan: the fastest plan that fits, found by searching every layout with the cost model.

Searches every dp*tp*pp factorisation of --gpus (tp inside a node unless
--allow-tp-across-nodes), ZeRO stage, sequence parallelism, pipeline schedule and virtual
stages, micro-batch and recomputation; removes what is invalid or does not fit, with the
reason; ranks the rest by --objective. Prints the top plans, the memory-versus-time Pareto
front and the rejected counts; --explain says why the winner has each value.

Examples:
  ptd plan --model llama3.1-405b --hardware h100-sxm --gpus 16384 --global-batch 2048 --seq-len 8192
  ptd plan --model llama3-70b --gpus 64 --fix tp=8,zero=1 --explain
  ptd plan --model llama3-8b --gpus 8 --objective memory --json
  ptd plan --model llama3-8b --gpus 64 --export megatron -o megatron_launch.sh
  ptd plan --model small --hardware cpu --gpus 4 --seq-len 256 --global-batch 32 --run
  ptd plan --model small --hardware cpu --gpus 4 --seq-len 256 --global-batch 16 --dtype fp32 \
      --try 3        # run the top 3 and each layout's best here; predicted vs measured
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from .args import emit_json, nonneg_int, path_arg, positive_int, positive_ints
from ..errors import PtdError
from ..fmt import duration, gib, pct, si, table
from .estimate import add_plan_flags, default_seq_len, resolve

HELP = "search every parallel layout for the fastest plan that fits (instant, no torch)"

MEM_SHORT = {"params": "params", "grads": "grads", "optimizer": "optimizer",
             "activations": "activations", "buffers": "buffers"}
STEP_SHORT = {"compute": "compute", "tp_comm": "tp comm", "pp_comm": "pp comm",
              "dp_comm_exposed": "dp comm", "bubble": "bubble", "optimizer": "optimizer",
              "cp_comm": "cp comm"}


def add(p: argparse.ArgumentParser) -> None:
    add_plan_flags(p)
    p.add_argument("--top", type=positive_int, default=10, help="plans to show (10)")
    p.add_argument("--objective", choices=["throughput", "memory", "time-to-train"],
                   default="throughput",
                   help="rank by tokens/s (default), by least memory per device, or by time "
                        "to train --tokens (the same order as throughput)")
    p.add_argument("--fix", action="append", default=[], metavar="FIELD=VALUE,...",
                   help="hold plan fields: dp, tp, pp, vpp, zero, sp, micro_batch (mb), "
                        "recompute (rc), schedule, offload, uneven_stages, grad_compression")
    p.add_argument("--cp", type=positive_ints, default=[1], metavar="N,...",
                   help="context-parallel degrees to search, e.g. 1,2,4,8,16 (default 1: none); "
                        "a cp not dividing the devices or seq_len/2 is rejected with its reason")
    p.add_argument("--allow-tp-across-nodes", action="store_true",
                   help="let tensor parallelism span nodes")
    p.add_argument("--tp-modes", type=tp_modes, metavar="MODE,...",
                   help="also price the ranked plans' tensor parallelism as 1d,2d,2.5d,3d "
                        "(2.5d at depth 2) and report the best plan of each mode (priced only: "
                        "ptd train runs 1d, and 2d with --tp-mode 2d); off by default")
    p.add_argument("--explain", action="store_true",
                   help="for the winner, what each alternative value would cost")
    p.add_argument("--pareto", type=nonneg_int, default=10, metavar="N",
                   help="Pareto-front points to show (10; --json has all)")
    p.add_argument("--export", choices=["ptd", "torchtitan", "megatron", "deepspeed"],
                   help="write the winner for ptd train --config, torchtitan, Megatron-LM or "
                        "DeepSpeed (to stdout, or to --output)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing --output file (and the files written beside it)")
    p.add_argument("-o", "--output", type=path_arg, metavar="FILE",
                   help="write the export (or, with --run, the ptd config) here")
    p.add_argument("--steps", type=positive_int,
                   help="training steps in the export (200, as ptd train), or of each --try run (8)")
    p.add_argument("--run", action="store_true",
                   help="plan for this machine (--hardware cpu or a calibrated profile) and "
                        "start ptd train with the winner")
    t = p.add_argument_group("trying plans on this host (--try)")
    t.add_argument("--try", dest="try_k", type=positive_int, metavar="K",
                   help="run the top K plans and the best plan of every other dp x tp x pp "
                        "layout here (one node: --gpus workers), and rank them by measured "
                        "tokens/s beside the prediction")
    t.add_argument("--no-layouts", action="store_true", default=None,
                   help="with --try: the top K only, not each layout's best")
    t.add_argument("--repeats", type=positive_int, default=None,
                   help="runs per plan, interleaved; the best counts (2)")
    t.add_argument("--tolerance", type=float, default=None,
                   help="how far below the best measured the top plan may be (0.10)")
    t.add_argument("--try-dir", default=None, type=path_arg, metavar="DIR",
                   help="configs, runs and try.json go here (runs/plan-try)")
    t.add_argument("--run-timeout", type=float, default=None,
                   help="seconds per run before it counts as failed (300)")


def tp_modes(s: str) -> list[str]:
    v = [x.strip() for x in s.split(",") if x.strip()]
    bad = [x for x in v if x not in ("1d", "2d", "2.5d", "3d")]
    if not v or bad:
        raise argparse.ArgumentTypeError(f"modes must be among 1d,2d,2.5d,3d, got {s!r}")
    return list(dict.fromkeys(v))


def _modes(a: argparse.Namespace, model, res) -> tuple[dict | None, list[str]]:  # type: ignore[no-untyped-def]
    """``--tp-modes``: the best plan per mode and, with ``--explain``, why the winner wins."""
    if not a.tp_modes:
        return None, []
    from ..planner.modes import best_by_mode, explain_modes
    best = best_by_mode(model, res.ranked, a.tp_modes)
    return best, (explain_modes(best) if a.explain else [])


def render_modes(best: dict, why: list[str]) -> str:  # type: ignore[type-arg]
    from ..fmt import duration
    rows = [(m, duration(d["step_time_s"]), d["estimate"].plan.describe())
            for m, d in sorted(best.items(), key=lambda kv: kv[1]["step_time_s"])]
    out = ["", "tensor-parallel modes (priced only: ptd train runs 1d, and 2d with --tp-mode 2d): the best plan of each",
           table(rows, header=("mode", "step time", "plan"), align="lrl") if rows else
           "  no ranked plan has a tensor-parallel degree these modes allow"]
    return "\n".join(out + why)


def run(a: argparse.Namespace) -> int:
    from ..cost.estimate import default_global_batch
    from ..planner.search import parse_fix, search

    if a.run and a.export not in (None, "ptd"):
        raise PtdError("--run writes a ptd config; export other formats in a separate call")
    if a.try_k and (a.run or a.export):
        raise PtdError("--try runs plans itself; use --run or --export in a separate call")
    from .. import flagcheck
    flagcheck.plan(a)  # flags without effect, writable paths, hardware of this host
    if a.try_k and a.objective == "memory":
        raise PtdError("--try ranks by measured throughput; use --objective throughput")
    if a.try_k and not 0 <= a.tolerance < 1:
        raise PtdError(f"--tolerance must be in [0, 1), got {a.tolerance}")
    fixed = parse_fix(a.fix)
    model, cluster, opts = resolve(a)
    if opts.ps_servers:  # a parameter server replaces DDP's all-reduce; ZeRO-1/2/3 reduce-scatter
        if fixed.get("zero", 0):
            raise PtdError("--dp-comm ps prices zero 0 (gradients pushed whole)")
        fixed.setdefault("zero", 0)
    seq = a.seq_len or default_seq_len(model)
    gb = a.global_batch or default_global_batch(seq, 1)
    res = search(model, cluster, gb, seq, dtype=a.dtype, fixed=fixed, objective=a.objective,
                 tokens=a.tokens, options=opts, allow_tp_across_nodes=a.allow_tp_across_nodes,
                 cp_values=a.cp)
    win = res.best  # raises "no plan fits: ..." when nothing does
    if a.try_k:
        return try_plans(a, res, opts)
    dims = None
    if a.explain:
        from ..planner.explain import explain
        dims = explain(res)
    modes, why = _modes(a, model, res)

    text = None
    fmt = "ptd" if a.run else a.export
    target = Path(a.output or "runs/plan.toml")
    beside: dict[str, str] = {}
    if fmt:
        from ..planner.export import export_files
        # --run trains into a folder beside the plan it writes
        out = str(target.parent / "run") if a.run else None
        ex = export_files(win, fmt, hardware=a.hardware, steps=a.steps, out=out, options=opts,
                          name=target.name if a.output else None)
        text, beside = ex.text, ex.beside
        for n in ex.notes:  # what the framework cannot express, never dropped in silence
            print(f"ptd plan: {fmt} cannot express: {n}", file=sys.stderr)
    path = None
    if text is not None and (a.output or a.run):
        path = target
        if a.output:  # a file the user names is never replaced without --force
            from ..safeio import refuse_overwrite
            for f in [path, *(path.parent / n for n in beside)]:
                refuse_overwrite(f, "--output", a.force)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            for name, body in beside.items():
                (path.parent / name).write_text(body)
        except OSError as e:
            raise PtdError(f"cannot write {path}: {e.strerror}") from None
    elif beside:
        print(f"ptd plan: {fmt}: give -o FILE to also write {', '.join(beside)} beside it",
              file=sys.stderr)

    if a.json:
        emit_json(to_json(res, a.top, dims, fmt, text, path)
                  | {"cp_values": a.cp, "dp_comm": a.dp_comm, "servers": a.servers}
                  | ({"tp_modes": {m: {k: v for k, v in d.items() if k != "estimate"}
                                   | {"plan": d["estimate"].plan.describe()}
                                   for m, d in modes.items()}} if modes is not None else {}))
    elif text is not None and path is None:
        sys.stdout.write(text)  # the export alone, to redirect
    else:
        print(render(res, a.top, a.pareto, dims))
        if modes is not None:
            print(render_modes(modes, why))
        if path is not None:
            print(f"\nwrote the {fmt} export of plan #1 to {path}"
                  + "".join(f" and {path.parent / n}" for n in beside))

    if a.run:
        cmd = [sys.executable, "-m", "ptd", "train", "--config", str(path)]
        print("running: " + " ".join(cmd[1:]), flush=True)
        return subprocess.call(cmd)
    return 0


def try_plans(a: argparse.Namespace, res, opts) -> int:  # type: ignore[no-untyped-def]

    from ..planner import trial
    c = res.cluster
    if c.n_nodes > 1:
        raise PtdError(f"--try runs every plan on this host: --gpus {c.n_devices} is "
                       f"{c.n_nodes} nodes of {c.devices_per_node}; try one node's worth")
    if c.hardware.kind == "gpu":
        import torch
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < c.n_devices:
            raise PtdError(f"--try runs every plan on this host: --hardware {a.hardware} "
                           f"describes {c.n_devices} GPUs and this host has {have}; plan with "
                           f"--hardware cpu or a calibrated profile (ptd calibrate)")
    cands = trial.candidates(res, a.try_k, per_layout=not a.no_layouts)
    out = Path(a.try_dir)
    log = (lambda m: print(m, file=sys.stderr, flush=True))
    if not a.json:
        print(render(res, a.try_k, 0), flush=True)
        print()
    log(f"ptd plan --try: {len(cands)} plans x {a.repeats} repeats, {a.steps or 8} steps "
        f"each, into {out}")
    wall = trial.run_all(cands, out, hardware=a.hardware, steps=a.steps or 8,
                         repeats=a.repeats, timeout=a.run_timeout, options=opts, log=log)
    v = trial.verdict(cands, a.tolerance)
    tj = trial.to_json(cands, v, a.repeats, wall)
    from ..safeio import dumps_strict
    (out / "try.json").write_text(dumps_strict(tj, indent=2, default=str) + "\n")
    if a.json:
        emit_json({**to_json(res, a.try_k, None, None, None, None), "try": tj})
    else:
        print(trial.render(cands, v, a.repeats, wall))
        print(f"\nwrote {out / 'try.json'}")
    return 0


# --------------------------------------------------------------------- output
def short(plan) -> str:  # type: ignore[no-untyped-def]
    """describe() without the global batch (the same for every plan of a search)."""
    return plan.describe().replace(f" gb{plan.global_batch}", "")


def _mem(e) -> str:  # type: ignore[no-untyped-def]
    m = e.memory
    return f"{gib(m.total)} ({MEM_SHORT[m.largest]} {pct(getattr(m, m.largest) / m.total, 0)})"


def _step(e) -> str:  # type: ignore[no-untyped-def]
    s = e.step
    return f"{duration(s.total)} ({STEP_SHORT[s.largest]} {pct(getattr(s, s.largest) / s.total, 0)})"


def render(res, top: int, pareto: int, dims=None) -> str:  # type: ignore[no-untyped-def]
    from ..planner.pareto import pareto_front, thin

    m, c = res.model, res.cluster
    win = res.best
    n_rej = sum(res.plans_rejected.values())
    lines = [
        f"{m.name} ({si(m.param_count())} params) on {c.n_devices} x {c.hardware.name} "
        f"({c.n_nodes} node{'s' if c.n_nodes > 1 else ''} of {c.devices_per_node}); global batch "
        f"{res.global_batch} x {res.seq_len} tokens, {res.dtype}",
        f"searched {res.plans_considered} plans in {res.layouts_considered} "
        f"layout{'s' if res.layouts_considered != 1 else ''} (dp x tp x pp) "
        f"in {res.elapsed_s:.2f} s: {res.plans_fit} fit, {n_rej} rejected; objective "
        f"{res.objective}" + (f"; fixed {', '.join(f'{k}={v}' for k, v in res.fixed.items())}"
                              if res.fixed else ""),
    ]
    ttt = f"time to train {si(win.tokens)} tok"
    rows = [(i + 1, short(e.plan), _mem(e), _step(e), si(e.tokens_per_s), pct(e.mfu),
             duration(e.time_to_train_s)) for i, e in enumerate(res.top(top))]
    lines += ["", f"top {len(rows)} of {res.plans_fit} plans that fit",
              table(rows, header=("#", "plan", "memory/device", "step time", "tokens/s", "MFU", ttt),
                    align="rlllrrr")]
    front = pareto_front(res.ranked)
    shown = thin(front, pareto)
    if shown:
        prow = [(gib(e.memory.total), duration(e.step.total), si(e.tokens_per_s), short(e.plan))
                for e in shown]
        lines += ["", f"memory vs step time: Pareto front of {len(front)} plan"
                      f"{'s' if len(front) != 1 else ''}"
                      + (f" ({len(shown)} shown)" if len(shown) < len(front) else ""),
                  table(prow, header=("memory/device", "step time", "tokens/s", "plan"),
                        align="rrrl")]
    rej = [(r, n) for r, n in res.plans_rejected.most_common()]
    rej += [(f"{r} [layouts]", n) for r, n in res.layouts_rejected.most_common()]
    if rej:
        lines += ["", "rejected", table(rej, header=("reason", "count"), align="lr")]
    if dims is not None:
        lines += ["", render_explain(res, dims)]
    return "\n".join(lines)


def _delta(e, win) -> str:  # type: ignore[no-untyped-def]
    dt = e.step.total / win.step.total - 1
    dm = (e.memory.total - win.memory.total) / 2**30
    return f"{'+' if dt >= 0 else ''}{100 * dt:.1f}% time, {'+' if dm >= 0 else ''}{dm:.1f} GiB"


def render_explain(res, dims, per_dim: int = 3) -> str:  # type: ignore[no-untyped-def]
    from ..planner.search import NO_FIT
    win = res.best
    cap = res.cluster.hardware.usable_memory
    rows = []
    held = set(res.fixed) | ({"schedule"} if "vpp" in res.fixed else set())
    for d in dims:
        first = True
        shown = d.alternatives[:per_dim]
        for alt in shown or [None]:
            if alt is None:
                rows.append((d.name, _val(d.value),
                             "(held by --fix)" if d.name in held else "(no other value)", "", ""))
                break
            if alt.best is not None:
                best = _delta(alt.best, win) + "  " + short(alt.best.plan)
            elif alt.reason == NO_FIT and alt.least_memory is not None:
                best = f"no plan fits (needs >= {gib(alt.least_memory)} of {gib(cap)})"
            else:
                best = f"no plan: {alt.reason}"
            if alt.alone is not None and alt.alone_reason is None:
                alone = _delta(alt.alone, win)
            elif alt.alone is not None:
                alone = f"does not fit ({gib(alt.alone.memory.total)})"
            elif alt.alone_reason:
                alone = alt.alone_reason if len(alt.alone_reason) < 60 else alt.alone_reason[:57] + "..."
            else:
                alone = "-"
            rows.append((d.name if first else "", _val(d.value) if first else "",
                         f"{d.name}={_val(alt.value)}", alone, best))
            first = False
        if len(d.alternatives) > per_dim:
            rows.append(("", "", f"(+{len(d.alternatives) - per_dim} more)", "", ""))
    head = (f"why plan #1 ({short(win.plan)}): each alternative value, with only it changed "
            f"('alone'), and the best plan that has it (everything else chosen again)")
    return head + "\n" + table(rows, header=("dimension", "value", "alternative", "alone",
                                             "best plan with it"), align="lllll")


def _val(v) -> str:  # type: ignore[no-untyped-def]
    if isinstance(v, bool):
        return "on" if v else "off"
    return str(v)


def to_json(res, top: int, dims, fmt, text, path) -> dict:  # type: ignore[no-untyped-def]
    from ..planner.pareto import pareto_front
    m, c = res.model, res.cluster
    front = pareto_front(res.ranked)
    out = {
        "model": m.name,
        "hardware": c.hardware.name,
        "gpus": c.n_devices,
        "gpus_per_node": c.devices_per_node,
        "global_batch": res.global_batch,
        "seq_len": res.seq_len,
        "dtype": res.dtype,
        "objective": res.objective,
        "fixed": res.fixed,
        "search": {
            "layouts_considered": res.layouts_considered,
            "layouts_rejected": dict(res.layouts_rejected.most_common()),
            "plans_considered": res.plans_considered,
            "plans_fit": res.plans_fit,
            "plans_rejected": dict(res.plans_rejected.most_common()),
            "elapsed_s": res.elapsed_s,
        },
        "top": [e.to_json() for e in res.top(top)],
        "pareto": [{"plan": e.plan.describe(), "memory_bytes": e.memory.total,
                    "step_time_s": e.step.total, "tokens_per_s": e.tokens_per_s}
                   for e in front],
    }
    if dims is not None:
        from ..planner.explain import to_json as explain_json
        out["explain"] = explain_json(dims, res.best)
    if fmt:
        out["export"] = {"format": fmt, "path": str(path) if path else None, "text": text}
    return out

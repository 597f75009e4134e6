"""Flags that would do nothing, or contradict each other, are refused rather than ignored.

Each ``ptd`` command calls its function here once, after parsing and before any work, so
that the rules live in one file (docs/errors.md lists them). Flags whose value is only
used in one mode default to None in the parser; a value given outside that mode is
refused, and the mode's default is filled in here.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from .errors import PtdError

BENCH_OUT = "runs/bench"
RUN_RESULTS = ("summary.json", "metrics.jsonl")
"""A finished run's results in its folder: an explicit ``--out`` holding them is not trained
into again without ``--resume`` or ``--force``."""
PLAN_TRY_DEFAULTS = {"repeats": 2, "tolerance": 0.10, "try_dir": "runs/plan-try",
                     "run_timeout": 300.0, "no_layouts": False}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _fix_fields(specs: list[str]) -> None:
    """A field held twice (``--fix tp=2 --fix tp=4``) would silently keep the last."""
    from .planner.search import FIX_ALIASES
    seen: set[str] = set()
    for spec in specs:
        for item in spec.split(","):
            key = FIX_ALIASES.get(item.partition("=")[0].strip(), item.partition("=")[0].strip())
            if not key:
                continue
            if key in seen:
                raise PtdError(f"--fix: {key} is given more than once")
            seen.add(key)


def _timeout(v: Any, flag: str) -> None:
    if v is not None and not (isinstance(v, (int, float)) and 0 < v < 1e7):
        raise PtdError(f"{flag} must be > 0 seconds (and below 1e7), got {v}")


def plan(a: argparse.Namespace) -> None:
    """``ptd plan``: --try's own flags need --try; --fix fields once; paths writable;
    --run and --try measure here, so the hardware must describe this host."""
    _fix_fields(a.fix or [])
    try_k = getattr(a, "try_k", None)
    if try_k and a.try_dir:  # a folder the user names keeps an earlier --try unless --force
        from .safeio import refuse_overwrite
        refuse_overwrite(os.path.join(a.try_dir, "try.json"), "--try-dir", a.force)
    for name, default in PLAN_TRY_DEFAULTS.items():
        v = getattr(a, name, None)
        unset = v is None or v is False  # (not ``in (None, False)``: 0 == False)
        if not try_k and not unset:
            raise PtdError(f"{_flag(name)} only applies with --try K")
        if unset:
            setattr(a, name, default)
    _timeout(a.run_timeout, "--run-timeout")
    from .safeio import check_writable
    if a.output and not (a.export or a.run):
        # nothing would be written there: a silent success would leave the user looking for it
        raise PtdError("--output names where --export or --run writes; give one of them")
    if a.output:
        check_writable(a.output, "--output", kind="file")
    if try_k:
        check_writable(a.try_dir, "--try-dir")
    if a.run or try_k:
        from .runtime.launch.preflight import wrong_hardware
        from .specs import load_hardware
        problem = wrong_hardware(load_hardware(a.hardware), _gpus())
        if problem:
            raise PtdError(f"{'--run' if a.run else '--try'} measures on this host: {problem}")


def bench(a: argparse.Namespace) -> None:
    """``ptd bench``: a positive --run-timeout, a writable --out, and predictions for the
    hardware the rows run on."""
    _timeout(a.run_timeout, "--run-timeout")
    from .safeio import check_writable, refuse_overwrite
    if a.out is None:
        a.out = BENCH_OUT  # ptd's own scratch folder: each bench replaces the last
    else:  # a folder the user names keeps an earlier bench's results unless --force
        refuse_overwrite(os.path.join(a.out, "scaling.json"), "--out", a.force)
    check_writable(a.out, "--out")
    if a.hardware:
        from .runtime.launch.preflight import wrong_hardware
        from .specs import load_hardware
        problem = wrong_hardware(load_hardware(a.hardware), _gpus())
        if problem:
            raise PtdError(problem)


def train(a: argparse.Namespace, cfg: Any) -> None:
    """``ptd train``: flags that would be ignored or cannot hold on this host."""
    if a.warmup is not None and a.warmup >= cfg.steps:
        raise PtdError(f"--warmup {a.warmup} >= --steps {cfg.steps}: the learning rate would "
                       "never leave the warm-up")
    from .safeio import LOCK_NAME, refuse_overwrite
    force = getattr(a, "force", False)
    if getattr(a, "slurm_script", None):
        refuse_overwrite(a.slurm_script, "--slurm-script", force)
    # A folder the user names keeps an earlier run's results unless --resume or --force
    # (runs/latest, the default, is ptd's scratch folder: each run replaces it). A run in
    # progress there is refused by its lock, naming the holder, not here.
    out = getattr(a, "out", None)
    if out and a.resume is None and not force \
            and not os.path.exists(os.path.join(out, LOCK_NAME + ".holder")):
        for name in RUN_RESULTS:
            p = os.path.join(out, name)
            if os.path.exists(p):
                raise PtdError(f"--out {out!r} holds an earlier run ({name}); continue it with "
                               "--resume, pass --force to replace it, or choose another --out")
    pipeline_only(getattr(a, "schedule", None), getattr(a, "uneven_stages", None), cfg.plan.pp)
    no_effect(a, cfg)
    # where the nodes meet is torchrun's business only in a multi-node job started by hand
    # (--slurm-script's script names its own head node and node ranks)
    multi = getattr(a, "nnodes", 1) > 1 and not getattr(a, "slurm_script", None)
    for name, default in (("rdzv_endpoint", None), ("rdzv_id", "ptd"), ("node_rank", 0)):
        if not multi and getattr(a, name, default) != default:
            where = "with --slurm-script" if getattr(a, "slurm_script", None) else "with --nnodes 1"
            raise PtdError(f"{_flag(name)} has no effect {where}: it names a node of a "
                           "multi-node job started on each node (--nnodes N > 1)")
    cores = os.cpu_count() or 1
    threads = a.threads if a.threads is not None else getattr(cfg, "threads", None)
    if isinstance(threads, int) and threads > cores:  # the flag's or the --config file's
        where = "--threads" if a.threads is not None else "threads (--config)"
        raise PtdError(f"{where} {threads}: this host has {cores} CPU core(s)")


def no_effect(a: argparse.Namespace, cfg: Any) -> None:
    """``ptd train`` flags that the rest of the run would make do nothing."""
    given = lambda name: getattr(a, name, None) not in (None, False)  # noqa: E731
    if not cfg.checkpoint.every:  # no checkpoint is written: where and how many are moot
        for name in ("checkpoint_keep", "checkpoint_async", "checkpoint_dir"):
            if given(name):
                raise PtdError(f"{_flag(name)} needs --checkpoint-every K > 0 (no checkpoint "
                               "is saved without it)")
    if given("memory_step") and a.memory_step > cfg.steps:
        raise PtdError(f"--memory-step {a.memory_step} is past the run's last step "
                       f"(--steps {cfg.steps})")


def pipeline_only(schedule: Any, uneven: Any, pp: int) -> None:
    """--schedule and --uneven-stages shape a pipeline; with pp 1 they would change nothing."""
    if pp == 1:
        for flag, given in (("--schedule", schedule is not None), ("--uneven-stages", bool(uneven))):
            if given:
                raise PtdError(f"{flag} applies to pipeline parallelism (--pp > 1); this plan has pp 1")


def _gpus() -> int:
    from .runtime.launch.launcher import gpu_count
    return gpu_count()

"""``ptd train``'s checks of the world outside the config, before anything starts:

- the hardware profile the comparison will use resolves (an unknown ``--hardware`` or a
  damaged calibrated profile is refused here, not by rank 0 after training), and describes
  this host (a GPU profile on a CPU-only host would compare a CPU run with an H100
  prediction, thousands of times off);
- ``--out`` and ``--checkpoint-dir`` can be written;
- the workers' predicted memory fits in this host's memory (CPU hosts);
- a ``--resume`` whose checkpoint is already at the final step is reported, not run.

Everything here raises :class:`PtdError` (one line, exit 2) or returns a note.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...errors import PtdError
from ...safeio import check_writable
from ...specs import TrainConfig

GiB = 2**30


def host_memory_bytes() -> float | None:
    """Physical memory of this host (Linux/macOS sysconf), None where unknown."""
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def wrong_hardware(hw: Any, gpus: int) -> str | None:
    """Why measuring on this host and comparing with ``hw`` would be meaningless, or None."""
    if hw.kind == "gpu" and gpus == 0:
        return (f"hardware {hw.name!r} describes a GPU and this host has none: the run would "
                f"be compared with a GPU prediction; use --hardware cpu or a calibrated "
                f"profile (ptd calibrate)")
    if hw.kind == "cpu" and gpus > 0:
        return (f"hardware {hw.name!r} describes a CPU but this host trains on its {gpus} "
                f"GPU(s); use the GPU's preset or a profile ptd calibrate wrote here")
    return None


def resolve_hardware(cfg: TrainConfig, gpus: int) -> Any:
    from ..calibrate.first_run import resolve_hardware as resolve
    hw, _ = resolve(cfg.hardware, "cuda" if gpus else "cpu")
    return hw


def check_memory(cfg: TrainConfig, nproc: int, hw: Any) -> None:
    """Refuse a run whose workers' predicted memory exceeds this host's memory (CPU)."""
    host = host_memory_bytes()
    if host is None:
        return
    from ...cost.estimate import estimate
    from ...specs import ClusterSpec
    per_worker = estimate(cfg.model, ClusterSpec(hw, cfg.plan.world_size), cfg.plan).memory.total
    need = per_worker * nproc
    if need > host:
        raise PtdError(f"{nproc} worker(s) x {per_worker / GiB:.1f} GiB predicted = "
                       f"{need / GiB:.1f} GiB, more than this host's {host / GiB:.1f} GiB of "
                       f"memory; use a smaller model, more sharding (--zero 3) or fewer workers")


def final_step_note(cfg: TrainConfig) -> str | None:
    """The note to print when ``resume``'s checkpoint is already at ``steps`` (or past)."""
    if not cfg.resume:
        return None
    from ..checkpoint import store
    from ..checkpoint.saver import checkpoint_root
    ref = checkpoint_root(cfg) if cfg.resume == "auto" else Path(cfg.resume)
    ckpt = store.newest_good(ref, deep=False)
    if ckpt is None or ckpt.step < cfg.steps:
        return None
    return (f"ptd train: checkpoint {ckpt.path} is at step {ckpt.step}, the run's final step "
            f"is {cfg.steps}: nothing to train (raise --steps to continue)")


def preflight(cfg: TrainConfig, nproc: int, dry_run: bool) -> str | None:
    """Run every check; return a note that means "done, nothing to run", or None."""
    from .launcher import gpu_count
    gpus = gpu_count()
    hw = resolve_hardware(cfg, gpus)
    if not dry_run:
        problem = wrong_hardware(hw, gpus)
        if problem:
            raise PtdError(problem)
    if not gpus and hw.kind == "cpu":  # a dry run may be for several hosts: one worker's share
        check_memory(cfg, 1 if dry_run else nproc, hw)
    check_writable(cfg.out, "--out")
    if cfg.checkpoint.dir:
        check_writable(cfg.checkpoint.dir, "--checkpoint-dir")
    return final_step_note(cfg)

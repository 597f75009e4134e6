"""Everything a worker does to survive failures, in one place the worker calls twice.

:meth:`Recovery.start` (after the trainer is built, before the first step):

1. starts the :class:`~ptd.runtime.resilience.guard.Watch` (collective timeouts that name the rank,
   the operation and the stuck peer) and registers it as a phase hook of the trainer;
2. picks a checkpoint to resume from (``resume``, or this run's own newest good one after
   an elastic restart; :mod:`ptd.runtime.checkpoint.restore`) and loads it -- or, with no
   checkpoint, takes the initial weights from a Hugging Face folder (``init_from``);
3. attaches the :class:`~ptd.runtime.checkpoint.saver.Checkpointer` to the trainer
   (``checkpoint.every``).

:meth:`Recovery.close` (after training) waits for a background save and stops the watch.
"""

from __future__ import annotations

import time
from typing import Any

from ...specs import TrainConfig
from ..checkpoint import restore, store
from ..checkpoint.saver import Checkpointer, checkpoint_root
from .guard import Watch
from ..parallel.mesh import ParallelDims


class Recovery:
    def __init__(self, cfg: TrainConfig, dims: ParallelDims, trainer: Any) -> None:
        self.cfg, self.dims, self.trainer = cfg, dims, trainer
        self.watch: Watch | None = None
        self.checkpointer: Checkpointer | None = None
        self.resumed_from: str | None = None

    @classmethod
    def start(cls, cfg: TrainConfig, dims: ParallelDims, trainer: Any) -> "Recovery":
        r = cls(cfg, dims, trainer)
        r.watch = Watch.for_job(dims.rank, dims.world_size, cfg.plan, cfg.timeout_s)
        trainer.faults.attach(trainer.model)  # PTD_FAULT=nan poisons this module's output
        with r.watch.phase_of("checkpoint_load"):
            r._restore_or_init()
        if cfg.checkpoint.every > 0:
            r.checkpointer = Checkpointer(cfg, dims, trainer)
            trainer.after_step.append(r.checkpointer.after_step)
        trainer.phase_hooks.append(r.watch.hook)
        return r

    def _restore_or_init(self) -> None:
        cfg, dims, trainer = self.cfg, self.dims, self.trainer
        note = trainer.log.note
        t0 = time.perf_counter()
        ckpt = restore.pick(cfg, rank=dims.rank, world=dims.world_size, warn=note)
        if ckpt is not None:
            same = restore.load_into(trainer, ckpt, cfg, dims)
            layout = ckpt.manifest["layout"]
            streams = ("per rank (2-D tp: no activation shared)" if cfg.plan.tp_mode == "2d"
                       else "per replica (tp peers share a stream)")
            rng = ("RNG states restored" if same else
                   f"layout changed from {layout.get('plan')}: RNG reseeded {streams}")
            note(f"ptd: resumed from {ckpt.path} at step {ckpt.step} "
                 f"({time.perf_counter() - t0:.1f} s; {rng})")
            self.resumed_from = str(ckpt.path)
        elif cfg.init_from:
            from ..checkpoint.hf import load_into
            n = load_into(trainer.model, cfg.init_from, cfg.model)
            note(f"ptd: initial weights from {cfg.init_from} ({n} tensors)")
        elif cfg.resume == "auto" or restore.restart_count() > 0:
            note("ptd: no checkpoint to resume from; starting at step 0")
        if dims.is_main and (cfg.checkpoint.every > 0 or cfg.resume or cfg.max_restarts):
            for old, new in store.set_aside_newer(checkpoint_root(cfg), trainer.step):
                note(f"ptd: set aside {old.name} as {new.name}: newer than this run's start at "
                     f"step {trainer.step}, from the history it replaces")

    def close(self) -> None:
        try:
            if self.checkpointer is not None:
                self.checkpointer.close()
        finally:
            if self.watch is not None:
                self.watch.stop()

"""Writing checkpoints: every K steps and at the end, atomically, optionally in the background.

The protocol, for one save at step ``S`` into the root ``R``:

1. every rank checks its parameters and optimizer states for NaN/inf; if any rank finds
   one, *no* rank saves (a poisoned checkpoint would be the one a restart picks);
2. rank 0 creates the empty ``R/.tmp-step_S``; barrier;
3. ``torch.distributed.checkpoint`` writes every rank's shards and rank 0 the ``.metadata``
   (``dcp.save``, or ``dcp.async_save`` on a separate gloo group: training goes on while a
   background thread writes a staged copy);
4. the ranks hash the written files between them (SHA-256, file ``i`` by rank
   ``i mod world``) and gather the hashes on rank 0;
5. rank 0 writes ``metrics.jsonl`` and the manifest ``ptd.json`` (with every file's size and
   hash), fsyncs, writes the ``COMPLETE`` marker holding the manifest's hash, fsyncs, and
   renames the folder to ``R/step_S`` (atomic); then deletes all but the newest ``keep``
   complete checkpoints and any leftover temporary folders; barrier.

A crash anywhere before the rename leaves only a ``.tmp-`` folder, which nothing reads; a
damaged file after it is caught by the sizes and hashes (:mod:`.store`).
"""

from __future__ import annotations

import datetime
import json
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from ...specs import TrainConfig
from ..parallel.mesh import ParallelDims
from ..optim import lr_at
from . import store
from .state import TrainState, nonfinite_anywhere, rng_state


def checkpoint_root(cfg: TrainConfig) -> Path:
    return Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else Path(cfg.out) / "checkpoints"


def layout_of(cfg: TrainConfig, world_size: int) -> dict[str, Any]:
    p = cfg.plan
    return {"world_size": world_size, "pp": p.pp, "dp": p.dp, "tp": p.tp, "zero": p.zero,
            "plan": p.describe()}


def _dcp_files(folder: Path) -> list[str]:
    """What ``torch.distributed.checkpoint`` wrote (not the files rank 0 adds after)."""
    return sorted(f.name for f in folder.iterdir()
                  if f.is_file() and (f.name == store.DCP_METADATA or f.suffix == ".distcp"))


class Checkpointer:
    """Saves ``trainer``'s state every ``cfg.checkpoint.every`` steps and after the last."""

    def __init__(self, cfg: TrainConfig, dims: ParallelDims, trainer: Any) -> None:
        self.cfg = cfg
        self.dims = dims
        self.trainer = trainer
        self.root = checkpoint_root(cfg)
        self.every = cfg.checkpoint.every
        self.keep = cfg.checkpoint.keep
        self.state = TrainState(trainer.model, trainer.optimizer)
        self.async_save = cfg.checkpoint.async_save
        # Async saves run their collectives in a background thread while training uses the
        # default group: they need a group of their own (gloo: DCP plans on the CPU).
        self.group = dist.new_group(backend="gloo") if self.async_save else None
        self._executor = (ThreadPoolExecutor(1, thread_name_prefix="ptd-checkpoint")
                          if self.async_save else None)
        self._pending: Future | None = None
        self.saved: list[Path] = []
        self.skipped: list[int] = []
        self.save_seconds: list[float] = []
        """Time the training loop was held by each save (staging only, when async)."""

    # ------------------------------------------------------------ trainer hook
    def after_step(self, trainer: Any, rec: dict[str, Any]) -> None:
        step = trainer.step
        if step % self.every == 0 or step == self.cfg.steps:
            with trainer.phase("checkpoint_save"):
                self.save(trainer, rec)

    # ------------------------------------------------------------ saving
    def save(self, trainer: Any, rec: dict[str, Any] | None = None) -> bool:
        """Save now (a collective: every rank calls it). ``False`` if refused (non-finite)."""
        t0 = time.perf_counter()
        self.wait()
        step = trainer.step
        sd = self.state.state_dict()
        bad = nonfinite_anywhere(sd, self.dims.rank, self.group, self.dims.device)
        if bad:
            self.skipped.append(step)
            trainer.log.note(f"ptd: warning: not saving the checkpoint of step {step}: {bad} is "
                             f"not finite (the previous checkpoint stays the newest)")
            return False
        sd["rng"] = {f"rank{self.dims.rank}": rng_state(self.dims.device)}
        name = store.step_name(step)
        tmp, final = self.root / f"{store.TMP_PREFIX}{name}", self.root / name
        meta = self._manifest(trainer, rec)
        records = [dict(r) for r in trainer.log.records if r["step"] <= step]
        if self.dims.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        dist.barrier(group=self.group)
        if self.async_save:
            resp = dcp.async_save(sd, checkpoint_id=str(tmp), process_group=self.group)
            upload = getattr(resp, "upload_completion", resp)
            self._pending = self._executor.submit(self._complete, upload, tmp, final, meta, records, t0)
        else:
            try:
                dcp.save(sd, checkpoint_id=str(tmp), process_group=self.group)
                self._complete(None, tmp, final, meta, records, t0)
            except Exception as e:  # noqa: BLE001 - a full disk is one line; the rest re-raised
                disk_full(e, tmp, step, self.saved)
                raise
        self.save_seconds.append(time.perf_counter() - t0)
        if self.dims.is_main and self.async_save:
            trainer.log.note(f"ptd: checkpoint of step {step} staged in {self.save_seconds[-1]:.2f} s; "
                             f"writing in the background")
        return True

    def _manifest(self, trainer: Any, rec: dict[str, Any] | None) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "format": store.FORMAT,
            "step": trainer.step,
            "tokens": trainer.tokens,
            "data": trainer.loader.state_dict(),
            "lr": lr_at(trainer.step, cfg.optim, cfg.steps) if trainer.step else 0.0,
            "loss": rec.get("loss") if rec else None,
            "config": cfg.to_dict(),
            "layout": layout_of(cfg, self.dims.world_size),
            "rng": {"ranks": self.dims.world_size, "keys": "rng.rank<r>.cpu"},
            "saved_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__,
        }

    def _complete(self, upload: Future | None, tmp: Path, final: Path, meta: dict[str, Any],
                  records: list[dict[str, Any]], t0: float) -> None:
        if upload is not None:
            upload.result()
        rank, world = self.dims.rank, self.dims.world_size
        names = _dcp_files(tmp)
        mine = {n: store.file_entry(tmp / n) for i, n in enumerate(names) if i % world == rank}
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mine, group=self.group)
        if self.dims.is_main:
            files: dict[str, Any] = {}
            for part in gathered:
                files.update(part)
            metrics = tmp / store.METRICS
            store.write_durably(metrics, "".join(json.dumps(r) + "\n" for r in records))
            files[store.METRICS] = store.file_entry(metrics)
            text = json.dumps({**meta, "files": files}, indent=1, sort_keys=True)
            store.write_durably(tmp / store.MANIFEST, text)
            import hashlib
            digest = hashlib.sha256(text.encode()).hexdigest()
            store.write_durably(tmp / store.MARKER, json.dumps({"manifest_sha256": digest}) + "\n")
            store.fsync_path(tmp)
            store.replace_dir(tmp, final)
            store.prune(self.root, self.keep, protect=[final])
            size = sum(e["size"] for e in files.values())
            self.trainer.log.note(f"ptd: checkpoint {final} ({size / 2**20:.1f} MiB, "
                                  f"{time.perf_counter() - t0:.2f} s after the step"
                                  f"{', written in the background' if upload is not None else ''})")
        dist.barrier(group=self.group)
        self.saved.append(final)

    def wait(self) -> None:
        """Block until a background save has completed (re-raising its error)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def close(self) -> None:
        self.wait()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


def disk_full(e: BaseException, tmp: Path, step: int, saved: list[Path]) -> None:
    """Remove the partial checkpoint ``tmp``; if ``e`` is a full disk (ENOSPC, also when
    DCP wraps it), raise a one-line :class:`PtdFault` naming the path instead."""
    import errno

    from ...errors import PtdFault
    shutil.rmtree(tmp, ignore_errors=True)  # the previous checkpoint stays the newest
    text = f"{e!r} {e}"
    if getattr(e, "errno", None) == errno.ENOSPC or "No space left on device" in text:
        path = getattr(e, "filename", None) or tmp
        prev = f"{saved[-1]} stays the newest" if saved else "no earlier checkpoint"
        raise PtdFault(f"disk full: no space left on device writing {path} (checkpoint of "
                       f"step {step}); the partial checkpoint was removed, {prev}") from e

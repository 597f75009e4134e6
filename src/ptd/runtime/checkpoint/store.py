"""A checkpoint on disk: names, the manifest, the completion marker, validation, discovery.

No ``torch.distributed`` here: the launcher uses this module to refuse a bad ``--resume``
before any worker starts, and ``ptd export`` to pick a checkpoint.

Layout of a checkpoint root (``OUT/checkpoints`` unless ``checkpoint.dir`` says otherwise)::

    step_00000004/                 a complete checkpoint (renamed into place last)
        .metadata                  torch.distributed.checkpoint metadata (global shapes, chunks)
        __0_0.distcp, __1_0.distcp   tensor data, written by each rank
        metrics.jsonl              the run's logged records up to this step (rank 0)
        ptd.json                   the manifest: step, data position, config, layout, files
        COMPLETE                   the marker: the manifest's SHA-256, written after it
    .tmp-step_00000008/            being written (never read); removed by the next save

Validation (:func:`problems`) checks, cheapest first: the marker exists and names the
manifest's hash; the manifest parses and has this format; every file it lists exists with
its recorded size; and, when ``deep``, every file's SHA-256 (split over ranks by
``share``). A checkpoint that fails is *refused* -- never loaded -- and the caller falls
back to the previous one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ...errors import PtdError

FORMAT = "ptd-checkpoint/1"
MANIFEST = "ptd.json"
MARKER = "COMPLETE"
METRICS = "metrics.jsonl"
DCP_METADATA = ".metadata"
TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"
_STEP_RE = re.compile(r"^step_(\d+)$")


def step_name(step: int) -> str:
    return f"step_{step:08d}"


def step_of(path: Path) -> int | None:
    m = _STEP_RE.match(path.name)
    return int(m.group(1)) if m else None


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def fsync_path(path: Path) -> None:
    """Flush a file's or a directory's entry to disk (best effort on odd filesystems)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_durably(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def file_entry(path: Path) -> dict[str, Any]:
    return {"size": path.stat().st_size, "sha256": sha256_file(path)}


# ----------------------------------------------------------------- discovery
def root_of(ref: str | Path) -> tuple[Path, int | None]:
    """``(checkpoint root, newest step allowed)`` for what a user may pass to ``--resume``:
    a checkpoint folder (``.../step_N``: that one, or an older one if it is refused), a
    checkpoint root (folders ``step_*``), or a run folder (``RUN/checkpoints``)."""
    p = Path(ref)
    step = step_of(p)
    if step is not None or (p / MANIFEST).exists() or (p / MARKER).exists():
        return p.parent, step if step is not None else None
    if (p / "checkpoints").is_dir():
        return p / "checkpoints", None
    return p, None


def candidates(ref: str | Path) -> list[Path]:
    """Checkpoint folders ``ref`` may mean, newest first (complete or not: validation
    decides). A folder that is not named ``step_N`` but holds a manifest is its own only
    candidate."""
    p = Path(ref)
    root, newest = root_of(p)
    if step_of(p) is None and ((p / MANIFEST).exists() or (p / MARKER).exists()):
        return [p]
    if not root.is_dir():
        return []
    found = [(s, d) for d in root.iterdir() if d.is_dir() and (s := step_of(d)) is not None]
    found = [(s, d) for s, d in found if newest is None or s <= newest]
    return [d for _, d in sorted(found, key=lambda t: t[0], reverse=True)]


# ----------------------------------------------------------------- validation
@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint folder whose marker and manifest have been read."""

    path: Path
    manifest: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.manifest["step"])

    @property
    def config(self):  # -> TrainConfig
        from ...specs.config import config_from_dict
        return config_from_dict(self.manifest["config"])


class Refused(Exception):
    """A checkpoint that must not be loaded; ``str()`` is the one-line reason."""


def read(path: str | Path) -> Checkpoint:
    """Marker and manifest, or :class:`Refused` with the reason."""
    path = Path(path)
    if not path.is_dir():
        raise Refused("not a folder")
    marker = path / MARKER
    manifest_path = path / MANIFEST
    if not marker.is_file():
        raise Refused(f"no {MARKER} marker (an interrupted or partial save)")
    if not manifest_path.is_file():
        raise Refused(f"no {MANIFEST} manifest")
    raw = manifest_path.read_bytes()
    try:
        want = json.loads(marker.read_text())["manifest_sha256"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise Refused(f"unreadable {MARKER} marker") from None
    if hashlib.sha256(raw).hexdigest() != want:
        raise Refused(f"{MANIFEST} does not match the hash in {MARKER} (modified or corrupted)")
    try:
        manifest = json.loads(raw)
    except ValueError as e:
        raise Refused(f"{MANIFEST} does not parse: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise Refused(f"unknown format {manifest.get('format') if isinstance(manifest, dict) else None!r}"
                      f" (this ptd reads {FORMAT})")
    for key in ("step", "tokens", "data", "config", "layout", "files"):
        if key not in manifest:
            raise Refused(f"{MANIFEST} lacks {key!r}")
    return Checkpoint(path, manifest)


def problems(ckpt: Checkpoint, *, deep: bool, share: tuple[int, int] = (0, 1)) -> list[str]:
    """What is wrong with the files of ``ckpt`` (empty: nothing found). ``deep`` also
    hashes files; ``share = (rank, world)`` hashes only every ``world``-th file from
    ``rank``, so that the ranks of a job verify a checkpoint together."""
    out = []
    files = ckpt.manifest["files"]
    if DCP_METADATA not in files:
        out.append(f"the manifest lists no {DCP_METADATA}")
    rank, world = share
    for i, (name, entry) in enumerate(sorted(files.items())):
        f = ckpt.path / name
        if not f.is_file():
            out.append(f"{name} is missing")
            continue
        size = f.stat().st_size
        if size != entry["size"]:
            out.append(f"{name} has {size} bytes, the manifest says {entry['size']} (truncated?)")
            continue
        if deep and i % world == rank and sha256_file(f) != entry["sha256"]:
            out.append(f"{name} does not match its SHA-256 (corrupted)")
    return out


def check(path: str | Path, *, deep: bool, share: tuple[int, int] = (0, 1)) -> Checkpoint:
    """Read and validate; :class:`Refused` with every problem on one line."""
    ckpt = read(path)
    found = problems(ckpt, deep=deep, share=share)
    if found:
        raise Refused("; ".join(found))
    return ckpt


def newest_good(ref: str | Path, *, deep: bool, warn=None) -> Checkpoint | None:
    """The newest checkpoint under ``ref`` that passes :func:`check` (single process);
    ``warn(path, reason)`` hears about each one refused on the way."""
    for cand in candidates(ref):
        try:
            return check(cand, deep=deep)
        except Refused as e:
            if warn:
                warn(cand, str(e))
    return None


# ----------------------------------------------------------------- compatibility
_SHAPE_FIELDS = ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab_size",
                 "mlp", "norm", "position", "tied_embeddings", "bias", "head_dim", "norm_eps",
                 "rope_theta", "n_experts", "top_k")


def model_differences(saved, mine, fields: Iterable[str] = _SHAPE_FIELDS) -> list[str]:
    """``field a != b`` for every architectural field two ModelSpecs disagree on."""
    out = [f"{f} {getattr(saved, f)!r} != {getattr(mine, f)!r}" for f in fields
           if getattr(saved, f) != getattr(mine, f)]
    if saved.position == "learned" and saved.max_seq_len != mine.max_seq_len:
        out.append(f"max_seq_len {saved.max_seq_len} != {mine.max_seq_len}")
    return out


def check_compatible(ckpt: Checkpoint, cfg) -> None:
    """Refuse (:class:`PtdError`, one line) to resume ``cfg`` from ``ckpt`` when they are not
    the same training run: another model, seed, sequence length, global batch or data.
    The layout (dp, tp, pp, ZeRO, micro-batch, recompute, dtype) may differ freely; optimizer
    settings and ``steps`` may too (the learning rate follows this run's schedule)."""
    saved = ckpt.config
    where = f"checkpoint {ckpt.path}"
    diffs = model_differences(saved.model, cfg.model)
    if diffs:
        raise PtdError(f"{where} holds another model ({', '.join(diffs)})")
    pairs = [("seed", saved.seed, cfg.seed), ("seq_len", saved.plan.seq_len, cfg.plan.seq_len),
             ("global_batch", saved.plan.global_batch, cfg.plan.global_batch),
             ("data.paths", list(saved.data.paths), list(cfg.data.paths)),
             ("data.val_fraction", saved.data.val_fraction, cfg.data.val_fraction)]
    for name, a, b in pairs:
        if a != b:
            raise PtdError(f"{where} was written with {name} = {a!r}, this run has {b!r}; "
                           f"resuming needs the same")
    if ckpt.step > cfg.steps:
        raise PtdError(f"{where} is at step {ckpt.step}, beyond this run's steps = {cfg.steps}")


# ----------------------------------------------------------------- housekeeping
def prune(root: Path, keep: int, protect: Iterable[Path] = ()) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints (marker present) and any
    leftover temporary folders; return what was deleted. Folders without a marker that are
    not temporary (damaged checkpoints) are left for a person to look at."""
    keep_paths = {Path(p).resolve() for p in protect}
    complete = sorted(((s, d) for d in root.iterdir()
                       if d.is_dir() and (s := step_of(d)) is not None and (d / MARKER).is_file()),
                      key=lambda t: t[0], reverse=True)
    doomed = [d for _, d in complete[keep:] if d.resolve() not in keep_paths]
    doomed += [d for d in root.iterdir() if d.is_dir() and d.name.startswith((TMP_PREFIX, TRASH_PREFIX))]
    for d in doomed:
        shutil.rmtree(d, ignore_errors=True)
    return doomed


def set_aside_newer(root: Path, step: int) -> list[tuple[Path, Path]]:
    """Rename the checkpoint folders of ``root`` newer than ``step`` to ``abandoned-step_N-T``
    (kept for a person, never a candidate again). A run that starts at ``step`` -- fresh, or
    resumed from an older checkpoint -- begins a new history: an elastic restart or
    ``resume = auto`` must not later pick a checkpoint of the history it replaced."""
    if not root.is_dir():
        return []
    stamp = time.strftime("%Y%m%d-%H%M%S")
    moved = []
    for d in sorted(root.iterdir()):
        s = step_of(d)
        if d.is_dir() and s is not None and s > step:
            target = d.with_name(f"abandoned-{d.name}-{stamp}")
            os.rename(d, target)
            moved.append((d, target))
    return moved


def replace_dir(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final`` (atomic on one filesystem); an existing ``final`` (an
    older or damaged checkpoint of the same step) is moved aside first and then deleted."""
    if final.exists():
        trash = final.with_name(f"{TRASH_PREFIX}{final.name}")
        shutil.rmtree(trash, ignore_errors=True)
        os.rename(final, trash)
        os.rename(tmp, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(tmp, final)
    fsync_path(final.parent)


def read_metrics(ckpt: Checkpoint) -> list[dict[str, Any]]:
    f = ckpt.path / METRICS
    if not f.is_file():
        return []
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()]

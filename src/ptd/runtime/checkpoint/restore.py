"""Choosing a checkpoint to resume from, checking it, and loading it into a run.

Which checkpoints are considered, newest first:

* ``resume = "auto"``, or any elastic restart (``TORCHELASTIC_RESTART_COUNT > 0`` on any
  rank: a replacement node's agent counts from 0): this run's own checkpoint root (``checkpoint.dir`` or ``OUT/checkpoints``);
* ``resume = DIR`` (a run folder, a checkpoint root, or one ``step_N`` folder and the older
  ones beside it): after the run's own on a restart, before it otherwise.

The first candidate that passes validation -- marker, manifest, every file's size and
SHA-256 (the ranks hash a share each and agree), and its ``.metadata`` agreeing with the
model its manifest describes -- is used; each one refused on the way is reported with its
reason. A usable checkpoint of *another* run (model, seed, sequence length, global batch or
data differ) is an error, not a fallback. An explicit ``resume`` with nothing usable is an
error; so is ``auto`` when every checkpoint there is refused; ``auto`` with no checkpoint at
all starts from scratch (as does an elastic restart before the first checkpoint).

What a resume restores: parameters and AdamW states (resharded to the new layout by
``torch.distributed.checkpoint``), the optimizer step, the data position (a global sample
counter: it means the same on any number of replicas), the logged metrics up to the step,
and -- when the layout is the same -- each rank's RNG state. On another layout each rank is
reseeded from ``(seed, its random stream, step)`` (``ParallelDims.seed_rng``: one stream per
replica and pipeline rank, shared by tensor-parallel peers, as at the start): saved RNG
states belong to ranks of the old layout and do not survive resharding. The learning rate is a function of the step and this run's config.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from ...errors import PtdError
from ...specs import ModelSpec, TrainConfig
from . import store
from .saver import checkpoint_root, layout_of
from .state import TrainState, rng_template, set_rng_state


def expected_params(spec: ModelSpec, tp: int = 1) -> dict[str, tuple[int, ...]]:
    """``{fqn: shape}`` of every distinct parameter of the whole model (meta device), its
    vocabulary padded for tensor parallelism ``tp``."""
    from ..model.transformer import build_model
    model = build_model(spec, "meta", tp)
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def metadata_problems(ckpt: store.Checkpoint) -> list[str]:
    """Does the checkpoint's ``.metadata`` hold the model (and, past step 0, the optimizer
    states) that its own manifest describes, with the right global shapes?"""
    from torch.distributed.checkpoint import FileSystemReader
    try:
        md = FileSystemReader(str(ckpt.path)).read_metadata()
    except Exception as e:  # noqa: BLE001 - any failure to read it is a damaged checkpoint
        return [f"{store.DCP_METADATA} does not load ({type(e).__name__}: {str(e)[:80]})"]
    try:
        expected = expected_params(ckpt.config.model, ckpt.config.plan.tp_split)
    except PtdError as e:
        return [f"its manifest's config is invalid: {e}"]
    sdm = md.state_dict_metadata
    missing, wrong = [], []
    for fqn, shape in expected.items():
        m = sdm.get(f"model.{fqn}")
        if m is None:
            missing.append(f"model.{fqn}")
        elif tuple(getattr(m, "size", ())) != shape:
            wrong.append(f"model.{fqn} {tuple(m.size)} != {shape}")
        if ckpt.step > 0 and f"optim.state.{fqn}.exp_avg" not in sdm:
            missing.append(f"optim.state.{fqn}.exp_avg")
    out = []
    if missing:
        out.append(f"{len(missing)} tensor(s) its config implies are not in {store.DCP_METADATA} "
                   f"(first: {missing[0]})")
    if wrong:
        out.append(f"{len(wrong)} tensor shape(s) disagree with its config (first: {wrong[0]})")
    return out


def validate(path: Path, *, deep: bool, share: tuple[int, int] = (0, 1)) -> store.Checkpoint:
    """:func:`store.check` plus :func:`metadata_problems`; :class:`store.Refused` if bad."""
    ckpt = store.check(path, deep=deep, share=share)
    found = metadata_problems(ckpt)
    if found:
        raise store.Refused("; ".join(found))
    return ckpt


def restart_count() -> int:
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    except ValueError:
        return 0


def job_restart(world: int = 1) -> int:
    """The job's restart number: the highest of its ranks' (a collective when ``world > 1``).
    A node started to replace a lost one runs a fresh torchrun agent whose count is 0, while
    the surviving nodes' agents count their restarts; all ranks must resume alike."""
    restart = restart_count()
    if world > 1 and dist.is_initialized():
        counts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(counts, restart)
        restart = max(counts)
    return restart


def sources(cfg: TrainConfig, restart: int) -> list[Path]:
    out = []
    if restart > 0 or cfg.resume == "auto":
        out.append(checkpoint_root(cfg))
    if cfg.resume and cfg.resume != "auto":
        out.append(Path(cfg.resume))
    return out


def _agree(reason: str | None, group: dist.ProcessGroup | None = None) -> str | None:
    """Every rank's verdict on a candidate, combined: refused if any rank refused it."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return reason
    reasons: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(reasons, reason, group=group)
    seen = []
    for r in reasons:
        if r and r not in seen:
            seen.append(r)
    return "; ".join(seen) or None


def pick(cfg: TrainConfig, *, rank: int = 0, world: int = 1,
         warn: Callable[[str], None] = lambda s: None) -> store.Checkpoint | None:
    """The checkpoint this run resumes from (see the module docstring), chosen the same way
    on every rank; ``None``: start from scratch. A collective when ``world > 1``."""
    restart = job_restart(world)
    refused: list[str] = []
    for ref in sources(cfg, restart):
        for cand in store.candidates(ref):
            try:
                validate(cand, deep=True, share=(rank, world))
                reason = None
            except store.Refused as e:
                reason = str(e)
            reason = _agree(reason) if world > 1 else reason
            if reason:
                warn(f"ptd: warning: checkpoint {cand} refused: {reason}")
                refused.append(f"{cand.name}: {reason}")
                continue
            ckpt = store.read(cand)
            store.check_compatible(ckpt, cfg)
            return ckpt
    if cfg.resume and restart == 0 and (cfg.resume != "auto" or refused):
        # auto with checkpoints that are all damaged is not a fresh start either.
        raise PtdError(no_usable(cfg.resume if cfg.resume != "auto" else checkpoint_root(cfg), refused))
    return None


def no_usable(ref: str | Path, refused: list[str]) -> str:
    if not refused:
        return f"resume: no checkpoint in {ref}"
    more = f" (and {len(refused) - 1} older refused)" if len(refused) > 1 else ""
    return f"resume: no usable checkpoint in {ref}; newest refused: {refused[0]}{more}"


def precheck(cfg: TrainConfig) -> None:
    """The launcher's check of ``resume`` before any worker starts (no hashing: the
    workers hash, between them): refuse with one line if an explicit ``resume`` has no
    usable checkpoint, or its newest usable one belongs to another run."""
    if not cfg.resume:
        return
    if cfg.resume != "auto" and not Path(cfg.resume).exists():
        raise PtdError(f"resume: {cfg.resume} does not exist")
    refused: list[str] = []
    ref = checkpoint_root(cfg) if cfg.resume == "auto" else Path(cfg.resume)
    for cand in store.candidates(ref):
        try:
            ckpt = validate(cand, deep=False)
        except store.Refused as e:
            refused.append(f"{cand.name}: {e}")
            continue
        store.check_compatible(ckpt, cfg)
        return
    if cfg.resume != "auto" or refused:
        raise PtdError(no_usable(cfg.resume if cfg.resume != "auto" else ref, refused))


def same_layout(ckpt: store.Checkpoint, cfg: TrainConfig, world_size: int) -> bool:
    saved = ckpt.manifest["layout"]
    mine = layout_of(cfg, world_size)
    return all(saved.get(k) == mine[k] for k in ("world_size", "pp", "dp", "tp"))


def rebuild_ddp_buckets(model: Any, device: torch.device) -> bool:
    """Make a resumed DDP run reduce gradients in the same buckets as an uninterrupted one.

    DDP starts with buckets in reverse parameter order and rebuilds them, in the order the
    gradients became ready, at the second forward pass. A fresh run's step 1 uses the first
    layout, every later step the rebuilt one; a run resumed at step S would use the first
    layout at step S+1. With more than two ranks the all-reduce's summation order depends on
    where a value sits in its bucket, so that one step would differ in the last bits (seen:
    1e-7 relative at dp 4). One forward/backward of a zero loss (gradients zero, RNG state
    kept) records the order; the first real step then rebuilds exactly as the fresh run did."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    if not isinstance(model, DDP):
        return False
    rng = torch.get_rng_state()
    tokens = torch.zeros((1, 8), dtype=torch.long, device=device)
    out = model(tokens)
    (out.float().sum() * 0.0).backward()
    model.zero_grad(set_to_none=True)
    torch.set_rng_state(rng)
    return True


def _vocab_repadding(target: dict[str, Any], ckpt: store.Checkpoint
                     ) -> list[tuple[str, str, torch.Tensor]]:
    """Vocabulary tensors saved with another padding (another tp, or another
    ``vocab_multiple``): DCP reshards only between equal global shapes, so each is swapped
    for a whole tensor of the saved shape, read in full, and cut or padded after the load
    (:func:`_finish_repadding`). Returns ``(section, key, the run's tensor)`` per swap."""
    from torch.distributed.checkpoint import FileSystemReader
    from ..model.transformer import is_vocab_tensor
    sdm = FileSystemReader(str(ckpt.path)).read_metadata().state_dict_metadata
    swaps = []
    for section in ("model", "optim"):
        for key, t in target[section].items():
            saved = getattr(sdm.get(f"{section}.{key}"), "size", None)
            if (isinstance(t, torch.Tensor) and is_vocab_tensor(key) and saved is not None
                    and tuple(saved) != tuple(t.shape) and tuple(saved[1:]) == tuple(t.shape[1:])):
                swaps.append((section, key, t))
                target[section][key] = torch.zeros(tuple(saved), dtype=t.dtype)
    return swaps


@torch.no_grad()
def _finish_repadding(target: dict[str, Any], swaps: list[tuple[str, str, torch.Tensor]],
                      vocab: int) -> None:
    """Copy the real vocabulary rows of each swapped tensor into the run's own (its shard of
    them under tp/FSDP), padding rows zero, and put the run's tensor back in ``target``."""
    from ..model.init import assign_full
    from ..model.transformer import fit_vocab_rows
    for section, key, mine in swaps:
        assign_full(mine, fit_vocab_rows(target[section][key], mine.shape[0], vocab).to(mine.device))
        target[section][key] = mine


def load_into(trainer: Any, ckpt: store.Checkpoint, cfg: TrainConfig, dims: Any) -> bool:
    """Load ``ckpt`` into ``trainer`` (a collective); returns whether RNG states were
    restored (same layout) rather than reseeded."""
    state = TrainState(trainer.model, trainer.optimizer)
    parts = state.state_dicts()
    target: dict[str, Any] = {"model": {}, "optim": {}}
    for msd, osd in parts:
        target["model"].update(msd)
        target["optim"].update(osd)
    keep_rng = same_layout(ckpt, cfg, dims.world_size)
    key = f"rank{dims.rank}"
    if keep_rng:
        target["rng"] = {key: rng_template(dims.device)}
    repad = _vocab_repadding(target, ckpt)
    dcp.load(target, checkpoint_id=str(ckpt.path))
    _finish_repadding(target, repad, cfg.model.vocab_size)
    state.load(target, parts)
    if keep_rng:
        set_rng_state(target["rng"][key], dims.device)
    else:
        # a stream per replica, shared by tp peers, as at the start (never the global rank:
        # tp peers would then draw different masks for the activations they share; 2-D tp
        # shares none, its ranks draw their own: ParallelDims.rng_stream)
        dims.seed_rng(cfg.seed, ckpt.step)
    if ckpt.step > 0:
        rebuild_ddp_buckets(trainer.model, dims.device)
    trainer.step = ckpt.step
    trainer.tokens = int(ckpt.manifest["tokens"])
    trainer.loader.load_state_dict(ckpt.manifest["data"])
    for rec in store.read_metrics(ckpt):
        if rec.get("step", 0) <= ckpt.step:
            trainer.log.record(rec)
    return keep_rng

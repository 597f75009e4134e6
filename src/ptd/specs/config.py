"""TrainConfig: everything that decides a training run, read from and written to TOML.

``ptd train`` resolves its flags and ``--config`` file into one of these, validates it
before any worker starts, and writes it back as ``OUT/config.toml`` with every model field
spelled out, so that ``ptd train --config OUT/config.toml`` reproduces the run.

TOML layout::

    [model]            # preset = "small" plus overrides, or every ModelSpec field
    [plan]             # ParallelPlan fields
    [optim]            # OptimConfig fields
    [data]             # DataConfig fields
    [checkpoint]       # CheckpointConfig fields
    steps = 200        # top-level: the TrainConfig scalars below
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..errors import PtdError
from . import tomlio
from .model import ModelSpec, get_preset, load_model
from .plan import ParallelPlan, plan_from_dict
from .typecheck import check_fields


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warm-up then cosine decay to ``min_lr_ratio * lr``."""

    lr: float = 3e-3
    """Peak learning rate."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of ``lr``."""
    warmup_steps: int = 10
    """Optimizer steps of linear warm-up from 0."""
    weight_decay: float = 0.1
    """Decoupled weight decay on matrices (norm weights, biases and embeddings excluded)."""
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    """Clip the global gradient norm (over all shards) to this; 0 disables clipping."""

    def validate(self) -> None:
        if self.lr <= 0 or not 0 <= self.min_lr_ratio <= 1:
            raise PtdError("optim: lr must be positive and min_lr_ratio in [0, 1]")
        if self.warmup_steps < 0 or self.weight_decay < 0 or self.grad_clip < 0 or self.eps <= 0:
            raise PtdError("optim: warmup_steps, weight_decay and grad_clip must be non-negative")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise PtdError("optim: betas must be in [0, 1)")


@dataclass(frozen=True)
class DataConfig:
    """Where tokens come from."""

    paths: tuple[str, ...] = ()
    """Text files, folders or globs (byte-level tokens), or pre-tokenised ``uint16`` ``.bin``
    files. Empty: the Python standard library's own ``.py`` files, in sorted order."""
    val_fraction: float = 0.0
    """Fraction of the token stream held out (from its end) for validation loss; 0 = none."""

    def validate(self) -> None:
        if not 0 <= self.val_fraction < 1:
            raise PtdError("data: val_fraction must be in [0, 1)")


@dataclass(frozen=True)
class CheckpointConfig:
    """Distributed checkpoints (``torch.distributed.checkpoint``)."""

    every: int = 0
    """Save every this many optimizer steps (and at the end); 0 disables."""
    keep: int = 2
    """Keep the newest this many complete checkpoints."""
    async_save: bool = False
    """Write in the background while training continues."""
    dir: str = ""
    """Where checkpoints go; empty means ``OUT/checkpoints``."""

    def validate(self) -> None:
        if self.every < 0 or self.keep < 1:
            raise PtdError("checkpoint: every must be >= 0 and keep >= 1")


@dataclass(frozen=True)
class MeasureConfig:
    """What each run measures beside training (see ``ptd.runtime.measure``)."""

    memory_step: int = 2
    """Step whose forward+backward is memory-tracked (model states, activation peak); 0: none."""
    profile_steps: int = 3
    """Steps profiled with ``torch.profiler`` right after the memory step (the measured
    step-time breakdown is their mean); 0: none."""

    def validate(self) -> None:
        if self.memory_step < 0 or self.profile_steps < 0:
            raise PtdError("measure: memory_step and profile_steps must be >= 0")


@dataclass(frozen=True)
class TrainConfig:
    """A whole training run."""

    model: ModelSpec = field(default_factory=lambda: get_preset("small"))
    """The model (preset ``small`` by default: a ~3M-parameter Llama-style model)."""
    plan: ParallelPlan = field(default_factory=lambda: ParallelPlan(
        dp=4, micro_batch=4, global_batch=16, seq_len=256))
    """The parallel layout; its world size is the number of workers."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(warmup_steps=20))
    """AdamW; the default run warms up over its first 10% of steps."""
    data: DataConfig = field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    steps: int = 200
    """Optimizer steps to run (the default run: ~3 minutes with 4 workers on 2 CPU cores,
    819,200 tokens; see docs/training.md)."""
    seed: int = 0
    """Seeds weights, data order and dropout: the same seed gives the same run on any layout."""
    out: str = "runs/latest"
    """Output folder: metrics.jsonl, summary.json, config.toml, checkpoints."""
    hardware: str = "auto"
    """Hardware preset or calibrated profile the prediction is made for; ``auto``: the
    profile ``ptd calibrate`` wrote (``$PTD_HOME/hardware/calibrated.toml``) if there is
    one, else the device's preset (``cpu``)."""
    compile: bool = False
    """Wrap each transformer block in ``torch.compile``."""
    threads: int = 1
    """Intra-op threads per worker (1: workers on a CPU box do not fight over cores)."""
    log_every: int = 1
    """Update the progress bar and metrics every this many steps."""
    eval_every: int = 0
    """Validation loss every this many steps (needs ``data.val_fraction``); 0 = never."""
    tensorboard: bool = False
    """Also write TensorBoard event files to ``OUT/tb``."""
    timeout_s: float = 300.0
    """Collective timeout: a stuck peer becomes an error naming the rank and operation."""
    on_nan: Literal["stop", "skip"] = "stop"
    """A non-finite loss stops the run, or skips that step's update."""
    resume: str = ""
    """Checkpoint folder to resume from (``auto``: the newest good one under the run's)."""
    init_from: str = ""
    """Hugging Face folder (safetensors + config.json) to take initial weights from."""
    max_restarts: int = 0
    """Elastic restarts torchrun may make after a worker dies (resuming from checkpoints)."""

    def validate(self, world_size: int | None = None) -> None:
        """Everything that can be checked before a worker starts."""
        self.plan.validate(self.model, world_size)
        self.optim.validate()
        self.data.validate()
        self.checkpoint.validate()
        self.measure.validate()
        if self.steps < 1:
            raise PtdError(f"steps must be at least 1, got {self.steps}")
        if self.threads < 1 or self.log_every < 1 or self.eval_every < 0 or self.max_restarts < 0:
            raise PtdError("threads and log_every must be >= 1, eval_every and max_restarts >= 0")
        if not 0 < self.timeout_s <= 1e7:
            raise PtdError(f"timeout_s must be positive and at most 1e7 s, got {self.timeout_s}")
        if not 0 <= self.seed < 2**32:
            raise PtdError(f"seed must be in [0, 2**32), got {self.seed}")
        if self.on_nan not in ("stop", "skip"):
            raise PtdError(f"on_nan must be 'stop' or 'skip', got {self.on_nan!r}")
        if self.eval_every and not self.data.val_fraction:
            raise PtdError("eval_every needs data.val_fraction > 0")

    def replace(self, **changes: Any) -> "TrainConfig":
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------ TOML
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            d[f.name] = dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
        d["data"]["paths"] = list(self.data.paths)
        return d

    def to_toml(self) -> str:
        return tomlio.dumps(self.to_dict())

    def save(self, path: str | Path) -> None:
        from ..safeio import atomic_write_text  # a reader never sees half a config
        atomic_write_text(path, self.to_toml())


_SECTIONS = {"optim": OptimConfig, "data": DataConfig, "checkpoint": CheckpointConfig,
             "measure": MeasureConfig}


def _section(cls: type, d: dict[str, Any], name: str) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise PtdError(f"[{name}]: unknown field(s) {', '.join(unknown)}")
    if cls is DataConfig and isinstance(d.get("paths"), str):
        d = dict(d, paths=[d["paths"]])
    check_fields(cls, d, f"[{name}] ")
    if cls is DataConfig and "paths" in d:
        d = dict(d, paths=tuple(d["paths"]))
    try:
        return cls(**d)
    except TypeError as e:
        raise PtdError(f"[{name}]: {e}") from None


def config_from_dict(d: dict[str, Any], base: TrainConfig | None = None) -> TrainConfig:
    """Overlay a parsed TOML table on ``base`` (the defaults when omitted)."""
    cfg = base or TrainConfig()
    d = dict(d)
    changes: dict[str, Any] = {}
    if "model" in d:
        m = d.pop("model")
        if isinstance(m, dict):
            check_fields(ModelSpec, m, "[model] ")
        changes["model"] = load_model(m if isinstance(m, (dict, str)) else str(m))
    if "plan" in d:
        p = d.pop("plan")
        if not isinstance(p, dict):
            raise PtdError("[plan] must be a table")
        check_fields(ParallelPlan, p, "[plan] ")
        changes["plan"] = plan_from_dict({**cfg.plan.to_dict(), **p})
    for name, cls in _SECTIONS.items():
        if name in d:
            sub = d.pop(name)
            if not isinstance(sub, dict):
                raise PtdError(f"[{name}] must be a table")
            changes[name] = _section(cls, {**dataclasses.asdict(getattr(cfg, name)), **sub}, name)
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise PtdError(f"unknown config field(s) {', '.join(unknown)}")
    check_fields(TrainConfig, d, "")
    changes.update(d)
    try:
        return dataclasses.replace(cfg, **changes)
    except TypeError as e:
        raise PtdError(f"config: {e}") from None


def load_config(path: str | Path, base: TrainConfig | None = None) -> TrainConfig:
    return config_from_dict(tomlio.load(path), base)

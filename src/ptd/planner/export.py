"""A planned layout written for ptd and for three other frameworks, each as that framework
runs it unchanged.

* ``ptd``: a TOML :class:`~ptd.specs.TrainConfig` that ``ptd train --config FILE`` runs;
* ``torchtitan`` (0.3.x): a launch script ``torchrun ... -m torchtitan.train --module llama3
  --config ... --section.field value ... activation-checkpoint:MODE``
  (:mod:`.export_torchtitan`);
* ``megatron`` (Megatron-LM core_r0.19.x): a launch script ``torchrun ... pretrain_gpt.py
  <arguments>`` with ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (:mod:`.export_megatron`);
* ``deepspeed`` (0.19.x): a plain ds_config JSON, and beside it a launch script holding what
  ds_config cannot (:mod:`.export_deepspeed`).

What a framework cannot express for the exported plan is written into the export as
``# not expressible:`` comments (for DeepSpeed, into the launch script beside the JSON) and
returned in :attr:`Export.notes`, which ``ptd plan`` prints on stderr: nothing is dropped in
silence. The settings are the plan's and those of the ``TrainConfig`` ``ptd train`` would run
(optimizer, learning-rate schedule, steps, seed). Nothing here imports those frameworks;
tests/test_export_interop.py feeds the exports to their own code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..cost.estimate import CostOptions, Estimate
from ..specs.stages import stage_split
from ..errors import PtdError
from ..fmt import duration, gib, si
from ..specs.config import TrainConfig

FORMATS = ("ptd", "torchtitan", "megatron", "deepspeed")

LIMITS: dict[str, list[str]] = {
    "ptd": [
        "Data settings are ptd's defaults (TrainConfig); edit the file for a real run.",
    ],
    "torchtitan": [
        "ZeRO-1, and DDP combined with tensor or pipeline parallelism, have no torchtitan "
        "setting: they are written as FSDP without resharding after forward (ZeRO-2-like).",
        "Selective recompute is torchtitan's per-op SAC, which saves other tensors than ptd's.",
        "Only llama3 8B/70B/405B have torchtitan config functions; other models need one "
        "registered with the printed shape. fp16 compute has no mixed_precision_param value.",
    ],
    "megatron": [
        "Schedules are 1F1B and interleaved 1F1B only: GPipe is written as 1F1B, zero-bubble "
        "as interleaved 1F1B (ZB-V's V-shaped placement becomes round-robin).",
        "Offload moves optimizer states only (--optimizer-cpu-offload with the "
        "precision-aware optimizer).",
        "The tokenizer is written as NullTokenizer; replace it with the run's tokenizer.",
    ],
    "deepspeed": [
        "ds_config holds no pipeline degree (deepspeed.pipe.PipelineModule in code) and no "
        "exact stage split; its pipeline engine runs one 1F1B-like schedule with ZeRO 0/1.",
        "Tensor parallelism is AutoTP (Hugging Face models) or Megatron-DeepSpeed's own; "
        "Megatron-style sequence parallelism and selective recompute have no key.",
    ],
}


@dataclass(frozen=True)
class Export:
    """One export: the main file, what the framework cannot express, files written beside."""

    text: str
    """The file itself (TOML, launch script or JSON)."""
    notes: list[str] = field(default_factory=list)
    """What the framework cannot express for this plan (also written into the export)."""
    beside: dict[str, str] = field(default_factory=dict)
    """File name -> text of the files written next to the main one (DeepSpeed's launch)."""


def export(e: Estimate, fmt: str, *, hardware: str = "", steps: int | None = None,
           out: str | None = None, options: CostOptions = CostOptions()) -> str:
    """The text of the export (TOML, launch script or JSON)."""
    return export_files(e, fmt, hardware=hardware, steps=steps, out=out, options=options).text


def export_files(e: Estimate, fmt: str, *, hardware: str = "", steps: int | None = None,
                 out: str | None = None, options: CostOptions = CostOptions(),
                 name: str | None = None) -> Export:
    """The export with its notes and companion files (``name``: the main file's name, which
    DeepSpeed's launch script refers to)."""
    from . import export_deepspeed, export_megatron, export_torchtitan
    from .search import runtime_refuses
    runtime_refuses(e.model, e.plan)  # a plan ptd train would refuse is refused here too
    if e.plan.tp_mode != "1d" and fmt != "ptd":  # a 1-D config would be another layout
        raise PtdError(f"{fmt} has no {e.plan.tp_mode} tensor parallelism (tp_mode); export "
                       f"this plan as ptd")
    cfg = TrainConfig()
    if steps:
        cfg = cfg.replace(steps=steps)
    if fmt == "ptd":
        return Export(to_ptd(e, hardware or e.cluster.hardware.name, steps, out))
    if fmt == "torchtitan":
        return Export(*export_torchtitan.script(e, stages(e), steps, cfg, _summary(e)))
    if fmt == "megatron":
        return Export(*export_megatron.script(e, stages(e), steps, cfg, _summary(e), options))
    if fmt == "deepspeed":
        ds, notes = export_deepspeed.config(e, cfg, options)
        kw, pnotes = export_deepspeed.pipeline(e, stages(e))
        notes = notes + pnotes
        name = name or default_filename("deepspeed")
        launch = export_deepspeed.launch(e, stages(e), cfg, name, _summary(e), notes)
        return Export(export_deepspeed.dumps(ds), notes, {launch_filename(name): launch})
    raise PtdError(f"unknown export format {fmt!r}; choose from {', '.join(FORMATS)}")


def launch_filename(name: str) -> str:
    """The DeepSpeed launch script beside ``name`` (``ds.json`` -> ``ds.launch.sh``)."""
    stem = name.rsplit("/", 1)[-1]
    stem = stem[:-5] if stem.endswith(".json") else stem
    return f"{stem}.launch.sh"


def _summary(e: Estimate) -> str:
    c = e.cluster
    return (f"{e.model.name} on {c.n_devices} x {c.hardware.name}: {e.plan.describe()} seq "
            f"{e.plan.seq_len} {e.plan.dtype}; predicted step {duration(e.step.total)}, "
            f"{gib(e.memory.total)} per device, {si(e.tokens_per_s)} tokens/s, "
            f"MFU {100 * e.mfu:.1f}%")


def stages(e: Estimate) -> tuple[int, ...]:
    """Layers per virtual pipeline stage, in stage order (ptd's cost-balanced split)."""
    return stage_split(e.model, e.plan.n_stages, e.plan.seq_len, e.plan.uneven_stages)


# ------------------------------------------------------------------------- ptd
def train_config(e: Estimate, hardware: str, steps: int | None = None,
                 out: str | None = None) -> TrainConfig:
    """The :class:`TrainConfig` ``ptd train`` runs for this plan, validated."""
    cfg = TrainConfig(model=e.model, plan=e.plan, hardware=hardware)
    if steps:
        cfg = cfg.replace(steps=steps)
    if out:
        cfg = cfg.replace(out=out)
    cfg.validate(e.plan.world_size)
    return cfg


def to_ptd(e: Estimate, hardware: str, steps: int | None = None, out: str | None = None) -> str:
    cfg = train_config(e, hardware, steps, out)
    head = [f"# ptd plan: {_summary(e)}",
            f"# run it: ptd train --config FILE   ({e.plan.world_size} workers)"]
    return "\n".join(head) + "\n\n" + cfg.to_toml()


def default_filename(fmt: str) -> str:
    return {"ptd": "plan.toml", "torchtitan": "torchtitan_launch.sh",
            "megatron": "megatron_launch.sh", "deepspeed": "ds_config.json"}[fmt]


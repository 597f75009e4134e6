"""The DeepSpeed (0.19.x) export: a plain ds_config JSON, as ``deepspeed.initialize(config=)``,
``--deepspeed_config FILE`` and the Hugging Face Trainer's ``--deepspeed FILE`` read it, and a
launch script beside it for what ds_config cannot hold (pipeline stages, tensor-parallel
runtime, notes). Keys from DeepSpeed's ``docs/_pages/config-json.md``.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from ..cost.estimate import CostOptions, Estimate
from ..specs.config import TrainConfig


def config(e: Estimate, cfg: TrainConfig,
           options: CostOptions = CostOptions()) -> tuple[dict[str, Any], list[str]]:
    """``(ds_config, notes on what it cannot hold)``."""
    p, opt = e.plan, cfg.optim
    notes: list[str] = []
    zero: dict[str, Any] = {"stage": p.zero}
    if p.zero >= 2:
        zero.update(overlap_comm=options.dp_overlap, contiguous_gradients=True)
    if p.offload:
        zero["offload_optimizer"] = {"device": "cpu"}
        if p.zero == 3:
            zero["offload_param"] = {"device": "cpu"}
    ds: dict[str, Any] = {
        "train_batch_size": p.global_batch,
        "train_micro_batch_size_per_gpu": p.micro_batch,
        "gradient_accumulation_steps": p.n_microbatches,
        "gradient_clipping": opt.grad_clip,
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {"lr": opt.lr, "betas": [opt.beta1, opt.beta2],
                                                  "eps": opt.eps,
                                                  "weight_decay": opt.weight_decay}},
        # linear warm-up then cosine decay to min_lr_ratio * lr, as ptd trains
        "scheduler": {"type": "WarmupCosineLR", "params": {
            "total_num_steps": cfg.steps, "warmup_num_steps": opt.warmup_steps,
            "warmup_type": "linear", "warmup_min_ratio": 0.0, "cos_min_ratio": opt.min_lr_ratio}},
        "steps_per_print": 10,
        "seed": cfg.seed,
    }
    if p.dtype == "bf16":
        ds["bf16"] = {"enabled": True}
    elif p.dtype == "fp16":
        ds["fp16"] = {"enabled": True}
    if p.tp > 1:
        ds["tensor_parallel"] = {"autotp_size": p.tp}
        notes.append("tensor parallelism is written as AutoTP (Hugging Face models); with "
                     "Megatron-DeepSpeed pass its --tensor-model-parallel-size instead")
    if p.sp and p.tp > 1:
        notes.append("Megatron-style sequence parallelism has no ds_config key")
    if p.cp > 1:
        notes.append("context parallelism (all-gather attention over cp ranks) has no ds_config "
                     "key; DeepSpeed-Ulysses splits heads instead")
    if e.model.is_moe:
        notes += moe_notes(e)
    if p.recompute != "none":
        ds["activation_checkpointing"] = {"partition_activations": False,
                                          "cpu_checkpointing": False,
                                          "contiguous_memory_optimization": False,
                                          "synchronize_checkpoint_boundary": False,
                                          "profile": False}
        notes.append("recompute: activation_checkpointing configures deepspeed.checkpointing, "
                     "which the model's code must call per block")
        if p.recompute == "selective":
            notes.append("selective recompute has no DeepSpeed equivalent; recompute the "
                         "attention core in the model's code")
    if p.grad_compression != "none":
        notes.append(f"gradient compression {p.grad_compression} has no ds_config key")
    return ds, notes


def moe(e: Estimate) -> dict[str, Any] | None:
    """``deepspeed.moe.layer.MoE`` keyword arguments for the model's expert layers (None for
    a dense model): DeepSpeed builds experts in the model's code, not from ds_config."""
    m, p = e.model, e.plan
    if not m.is_moe:
        return None
    kw: dict[str, Any] = {"num_experts": m.n_experts, "ep_size": p.ep, "k": m.top_k}
    if m.capacity_factor:
        kw.update(capacity_factor=m.capacity_factor, drop_tokens=True)
    else:
        kw["drop_tokens"] = False  # dropless, as ptd routes
    return kw


def moe_notes(e: Estimate) -> list[str]:
    m, p = e.model, e.plan
    notes = [f"the {m.n_experts} experts (top-{m.top_k} routing) and expert parallelism ep "
             f"{p.ep} have no ds_config key: deepspeed.moe.layer.MoE("
             + ", ".join(f"{k}={v!r}" for k, v in (moe(e) or {}).items())
             + ") in the model's code, its l_aux added to the loss times "
             f"{m.aux_loss_coef}"]
    if m.z_loss_coef:
        notes.append(f"the router z-loss (coefficient {m.z_loss_coef}) has no DeepSpeed "
                     f"equivalent")
    if m.n_shared_experts:
        notes.append(f"{m.n_shared_experts} shared expert(s): DeepSpeed's MoE(use_residual=True) "
                     f"holds one, as a residual MLP mixed by a learned coefficient")
    if p.zero == 3:
        notes.append("ZeRO-3 with DeepSpeed's MoE layer: its engine has asserted 'MoE not "
                     "supported with Stage 3' (DeepSpeed issue #2870, open); ptd shards the "
                     "experts over dp/ep under ZeRO-3, DeepSpeed may need zero 2")
    return notes


def pipeline(e: Estimate, split: tuple[int, ...]) -> tuple[dict[str, Any] | None, list[str]]:
    """``deepspeed.pipe.PipelineModule`` keyword arguments (None without pp) and notes."""
    p = e.plan
    if p.pp == 1:
        return None, []
    notes = ["the pipeline degree has no ds_config key: it is "
             "deepspeed.pipe.PipelineModule(num_stages=pp) in the training script"]
    kw = {"num_stages": p.pp,
          "partition_method": "uniform" if len(set(split)) == 1 else "parameters",
          "activation_checkpoint_interval": 1 if p.recompute == "full" else 0}
    if p.schedule != "1f1b" or p.stages_per_rank > 1:
        notes.append(f"schedule {p.schedule} (vpp {p.vpp}) cannot be expressed: DeepSpeed's "
                     f"pipeline engine runs its own 1F1B-like schedule")
    if len(set(split)) > 1:
        notes.append(f"stages {list(split)} cannot be given exactly: partition_method "
                     f"'parameters' balances parameter counts")
    if p.zero >= 2:
        notes.append(f"DeepSpeed's pipeline engine supports ZeRO 0 and 1 only; ZeRO {p.zero} "
                     f"with pp > 1 cannot run there")
    return kw, notes


def launch(e: Estimate, split: tuple[int, ...], cfg: TrainConfig, config_name: str,
           summary: str, notes: list[str]) -> str:
    """The launch script written beside the ds_config."""
    c, p = e.cluster, e.plan
    nproc = min(p.world_size, c.devices_per_node)
    nnodes = p.world_size // nproc
    kw, _ = pipeline(e, split)
    lines = ["#!/usr/bin/env bash",
             f"# DeepSpeed 0.19 launch exported by ptd plan -- {summary}",
             f"# {config_name} is a plain ds_config: deepspeed.initialize(config=...), "
             f"--deepspeed_config FILE, or the Hugging Face Trainer's --deepspeed FILE",
             f"# parallel degrees: data {p.dp}"
             + (f" (expert parallel {p.ep} within it)" if p.ep > 1 else "")
             + (f" x context {p.cp}" if p.cp > 1 else "")
             + f" x tensor {p.tp} x pipeline {p.pp} = {p.world_size} ranks on {nnodes} node(s)"]
    if kw is not None:
        lines.append(f"# in the training script: deepspeed.pipe.PipelineModule(layers, "
                     f"{', '.join(f'{k}={v!r}' for k, v in kw.items())})")
    mkw = moe(e)
    if mkw is not None:
        lines.append(f"# in the model's code, each expert layer: deepspeed.moe.layer.MoE("
                     f"hidden_size={e.model.hidden}, expert=<the MLP>, "
                     f"{', '.join(f'{k}={v!r}' for k, v in mkw.items())})")
    lines += [f"# not expressible: {n}" for n in notes]
    lines += ["set -euo pipefail", 'TRAIN_SCRIPT=${TRAIN_SCRIPT:?set TRAIN_SCRIPT to your training script}',
              f"deepspeed --num_nodes {nnodes} --num_gpus {nproc} ${{HOSTFILE:+--hostfile $HOSTFILE}} "
              f'"$TRAIN_SCRIPT" --deepspeed_config {shlex.quote(config_name)} "$@"']
    return "\n".join(lines) + "\n"


def dumps(ds: dict[str, Any]) -> str:
    return json.dumps(ds, indent=2) + "\n"

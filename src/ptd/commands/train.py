"""ptd train: train a transformer with a parallel plan on torch.distributed.

The defaults (src/ptd/specs/config.py) train the `small` Llama-style model on the Python
standard library's own source files with 4 workers. Flags override `--config FILE.toml`,
which overrides the defaults; the fully resolved config is written to OUT/config.toml, and
`ptd train --config OUT/config.toml` repeats the run.

  ptd train                                          # the default run, 4 workers
  ptd train --nproc 2 --zero 3 --model tiny --steps 20
  ptd train --nproc 1 --dtype bf16 --recompute full --data 'docs/**/*.md'
  ptd train --nproc 8 --pp 2 --dp 2 --tp 2 --zero 1 --sp --model tiny --global-batch 8
  ptd train --nproc 4 --tp 4 --tp-mode 2d --model tiny --micro-batch 4   # 2-D tensor parallel
  ptd train --config run.toml --dry-run --nproc 16   # validate and write OUT/config.toml only
  ptd train --model tiny --checkpoint-every 50 --max-restarts 3   # survive a lost worker
  ptd train --resume runs/latest --nproc 2 --zero 1   # continue that run on another layout
  ptd train --init-from hf/tiny --steps 100          # start from a Hugging Face folder

With --nproc N (default: the plan's world size) N workers start on this host through
torchrun, one intra-op thread each unless --threads says otherwise; --nproc without --dp
sets dp = N/(tp*pp). Several nodes: the same command on each node with --nnodes N
--node-rank R --rdzv-endpoint HOST:PORT (torchrun's names); --slurm-script FILE writes an
sbatch script that does that (docs/launching.md). Output in OUT (--out, default runs/latest):
metrics.jsonl (one line per step), summary.json, config.toml.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from .args import fraction, nonneg_int, path_arg, positive_float, positive_int
from ..errors import PtdError

HELP = "train a model with a parallel plan (torchrun; gloo on CPU, NCCL on GPU)"


def add(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=path_arg, metavar="FILE", help="TOML config (see OUT/config.toml of any run)")
    p.add_argument("--nproc", type=positive_int, help="workers on this host (default: dp*tp*pp)")
    p.add_argument("--model", help="preset, model .toml, or Hugging Face config.json/folder")
    g = p.add_argument_group("plan")
    g.add_argument("--dp", type=positive_int, help="data-parallel replicas")
    g.add_argument("--tp", type=positive_int, help="tensor-parallel degree (consecutive ranks)")
    g.add_argument("--tp-mode", choices=("1d", "2d"),
                   help="1d: Megatron (heads and MLP columns split; default); 2d: weights and "
                        "activations in blocks on a q x q mesh, tp = q^2 (docs/parallelism-cp.md)")
    g.add_argument("--pp", type=positive_int, help="pipeline-parallel stages (ranks)")
    g.add_argument("--ep", type=positive_int,
                   help="expert-parallel degree, carved out of dp (MoE models; docs/moe.md)")
    g.add_argument("--capacity-factor", type=positive_float,
                   help="MoE expert capacity factor (default: dropless)")
    g.add_argument("--cp", type=positive_int,
                   help="context-parallel degree: each sequence split zig-zag over cp ranks, "
                        "K/V passed around a ring per layer (seq-len divisible by 2*cp; RoPE)")
    g.add_argument("--vpp", type=positive_int, help="virtual pipeline stages per rank")
    g.add_argument("--sp", action="store_true", default=None,
                   help="sequence parallel (norms sharded along the sequence; needs tp > 1)")
    g.add_argument("--schedule", choices=("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"),
                   help="pipeline schedule (pp > 1)")
    g.add_argument("--uneven-stages", action="store_true", default=None,
                   help="allow layers not divisible by the stages (cost-balanced split)")
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3),
                   help="0 DDP, 1 sharded optimizer states, 2 +gradients, 3 +parameters (FSDP)")
    g.add_argument("--micro-batch", type=positive_int,
                   help="sequences per micro-batch per replica (4; with --pp > 1 and no "
                        "--config, at most what leaves pp micro-batches a step)")
    g.add_argument("--global-batch", type=positive_int, help="sequences per optimizer step")
    g.add_argument("--seq-len", type=positive_int, help="tokens per sequence")
    g.add_argument("--recompute", choices=("none", "selective", "full"), help="activation checkpointing")
    g.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), help="compute precision")
    g.add_argument("--offload", action="store_true", default=None,
                   help="keep sharded states in host memory (zero 3)")
    g.add_argument("--grad-compression", choices=("none", "fp16", "powersgd"),
                   help="DDP gradient compression hook (lossy)")
    o = p.add_argument_group("run")
    o.add_argument("--steps", type=positive_int, help="optimizer steps")
    o.add_argument("--lr", type=positive_float, help="peak learning rate")
    o.add_argument("--warmup", type=nonneg_int, help="linear warm-up steps")
    o.add_argument("--seed", type=nonneg_int, help="seeds weights and data order")
    o.add_argument("--data", action="append", type=path_arg, metavar="PATH",
                   help="text file, folder, glob or uint16 .bin (repeatable; default: Python stdlib)")
    o.add_argument("--val-fraction", type=fraction, help="tail of the data held out for validation")
    o.add_argument("--eval-every", type=nonneg_int, help="validation loss every N steps")
    o.add_argument("--out", type=path_arg, metavar="DIR", help="output folder (default runs/latest)")
    o.add_argument("--compile", action="store_true", default=None, help="torch.compile each block")
    o.add_argument("--threads", type=positive_int, help="intra-op threads per worker (1)")
    o.add_argument("--timeout", type=positive_float, help="collective timeout, seconds (300)")
    o.add_argument("--max-restarts", type=nonneg_int, help="torchrun --max-restarts (0)")
    o.add_argument("--log-every", type=positive_int, help="metrics every N steps (1)")
    o.add_argument("--hardware", help="preset or calibrated profile the prediction uses "
                   "(default auto: ~/.ptd/hardware/calibrated.toml if present, else cpu)")
    o.add_argument("--profile-steps", type=nonneg_int,
                   help="steps profiled for the measured breakdown, after the memory step (3)")
    o.add_argument("--memory-step", type=nonneg_int,
                   help="step whose memory is tracked (2; 0: none)")
    o.add_argument("--tensorboard", action="store_true", default=None,
                   help="also write TensorBoard event files to OUT/tb")
    o.add_argument("--on-nan", choices=("stop", "skip"),
                   help="a non-finite loss stops the run (default) or skips that update")
    c = p.add_argument_group("checkpoints (docs/checkpoints.md)")
    c.add_argument("--checkpoint-every", type=nonneg_int, metavar="K",
                   help="save every K steps and at the end (0: never, the default)")
    c.add_argument("--checkpoint-keep", type=positive_int, metavar="N",
                   help="keep the newest N complete checkpoints (2)")
    c.add_argument("--checkpoint-async", action="store_true", default=None,
                   help="write checkpoints in the background while training goes on")
    c.add_argument("--checkpoint-dir", type=path_arg, metavar="DIR", help="where checkpoints go (OUT/checkpoints)")
    c.add_argument("--resume", type=path_arg, metavar="DIR|auto",
                   help="continue from a checkpoint: a run folder, a checkpoint folder, or auto "
                        "(this run's newest good one); without --config the run's config comes "
                        "from the checkpoint and flags change it (e.g. another layout)")
    c.add_argument("--init-from", type=path_arg, metavar="HF_DIR",
                   help="initial weights from a Hugging Face folder (config.json + safetensors); "
                        "without --model/--config the model comes from its config.json")
    n = p.add_argument_group("several nodes (docs/launching.md)")
    n.add_argument("--nnodes", type=positive_int, default=1, help="nodes in the job (1)")
    n.add_argument("--node-rank", type=nonneg_int, default=0, help="this node's rank (0)")
    n.add_argument("--rdzv-endpoint", metavar="HOST:PORT",
                   help="where the nodes' torchrun agents meet (c10d rendezvous)")
    n.add_argument("--rdzv-id", default="ptd", help="job id shared by every node (ptd)")
    n.add_argument("--slurm-script", type=path_arg, metavar="FILE",
                   help="write OUT/config.toml and an sbatch script for --nnodes nodes; start nothing")
    o.add_argument("--force", action="store_true",
                   help="train into an --out that holds an earlier run (replacing its results), "
                        "or replace an existing --slurm-script")
    o.add_argument("--dry-run", action="store_true",
                   help="validate and write OUT/config.toml, start nothing (--nproc = total world)")


_PLAN_FLAGS = ("dp", "tp", "tp_mode", "pp", "ep", "cp", "vpp", "sp", "schedule", "uneven_stages", "zero", "micro_batch",
               "global_batch", "seq_len", "recompute", "dtype", "offload", "grad_compression")
_TOP_FLAGS = {"steps": "steps", "seed": "seed", "out": "out", "compile": "compile",
              "threads": "threads", "timeout": "timeout_s", "max_restarts": "max_restarts",
              "log_every": "log_every", "eval_every": "eval_every", "hardware": "hardware",
              "tensorboard": "tensorboard", "on_nan": "on_nan", "resume": "resume",
              "init_from": "init_from"}
_CHECKPOINT_FLAGS = {"checkpoint_every": "every", "checkpoint_keep": "keep",
                     "checkpoint_async": "async_save", "checkpoint_dir": "dir"}


def base_config(a: argparse.Namespace):  # -> TrainConfig
    """--config, else (with --resume) the config the checkpoint was written with, else the
    defaults. A checkpoint's config makes ``ptd train --resume RUN`` continue RUN as it was,
    with any flag given changing it (``--nproc 4`` to reshard)."""
    from ..specs import TrainConfig, load_config
    if a.config:
        return load_config(a.config)
    if a.resume:
        from ..runtime.checkpoint import store
        ref = a.resume
        if ref == "auto":
            ref = str(Path(a.out or TrainConfig().out) / "checkpoints")
        ckpt = store.newest_good(ref, deep=False)
        if ckpt is not None:
            try:
                return ckpt.config
            except PtdError:
                pass  # the resume check refuses it with its reason
    return TrainConfig()


def _enough_micro_batches(plan):  # (ParallelPlan) -> ParallelPlan
    """The default micro-batch, made smaller where it would leave a pipeline fewer
    micro-batches a step than stages (every schedule ptd runs needs at least pp): the
    largest that divides a replica's batch into pp or more. Unchanged where none does
    (the plan's check then says why)."""
    if plan.global_batch % plan.dp:
        return plan
    per = plan.global_batch // plan.dp
    if per // plan.micro_batch >= plan.pp:
        return plan
    fits = [mb for mb in range(1, per + 1) if per % mb == 0 and per // mb >= plan.pp]
    return plan.replace(micro_batch=max(fits)) if fits else plan


def resolve(a: argparse.Namespace):  # -> tuple[TrainConfig, int]
    """Defaults < --config < flags; returns the config and the number of workers."""
    from ..specs import load_model
    cfg = base_config(a)
    if a.model:
        cfg = cfg.replace(model=load_model(a.model))
    elif a.init_from and not a.config and not a.resume and (Path(a.init_from) / "config.json").is_file():
        cfg = cfg.replace(model=load_model(a.init_from))  # the check of init_from explains the rest
    if a.capacity_factor is not None:
        cfg = cfg.replace(model=cfg.model.replace(capacity_factor=a.capacity_factor))
    plan = cfg.plan.replace(**{k: getattr(a, k) for k in _PLAN_FLAGS if getattr(a, k) is not None})
    if a.nproc is not None and a.dp is None:
        per_replica = plan.tp * plan.pp * plan.cp
        if a.nproc % per_replica:
            what = "tp*pp*cp" if plan.cp > 1 else "tp*pp"
            raise PtdError(f"--nproc {a.nproc} is not divisible by {what} = {per_replica}")
        plan = plan.replace(dp=a.nproc // per_replica)
    if a.micro_batch is None and not a.config and not a.resume and plan.pp > 1:
        plan = _enough_micro_batches(plan)
    optim = cfg.optim
    if a.lr is not None:
        optim = dataclasses.replace(optim, lr=a.lr)
    if a.warmup is not None:
        optim = dataclasses.replace(optim, warmup_steps=a.warmup)
    data = cfg.data
    if a.data:
        data = dataclasses.replace(data, paths=tuple(a.data))
    if a.val_fraction is not None:
        data = dataclasses.replace(data, val_fraction=a.val_fraction)
    measure = cfg.measure
    if a.profile_steps is not None:
        measure = dataclasses.replace(measure, profile_steps=a.profile_steps)
    if a.memory_step is not None:
        measure = dataclasses.replace(measure, memory_step=a.memory_step)
    ckpt = dataclasses.replace(cfg.checkpoint, **{field: getattr(a, flag) for flag, field
                                                   in _CHECKPOINT_FLAGS.items()
                                                   if getattr(a, flag) is not None})
    top = {field: getattr(a, flag) for flag, field in _TOP_FLAGS.items() if getattr(a, flag) is not None}
    cfg = cfg.replace(plan=plan, optim=optim, data=data, measure=measure, checkpoint=ckpt, **top)
    return cfg, a.nproc if a.nproc is not None else plan.world_size


def run(a: argparse.Namespace) -> int:
    from ..runtime.launch.launcher import train
    from ..runtime.launch.nodes import Nodes, per_node, slurm_script
    cfg, nproc = resolve(a)
    from .. import flagcheck
    flagcheck.train(a, cfg)  # flags that would be ignored or cannot hold on this host
    if a.slurm_script:
        rc = train(cfg, nproc, dry_run=True)  # validates and writes OUT/config.toml
        per = per_node(nproc, a.nnodes)
        Path(a.slurm_script).write_text(slurm_script(str(Path(cfg.out) / "config.toml"),
                                                     a.nnodes, per, gpus=cfg.hardware != "cpu"))
        print(f"ptd: wrote {a.slurm_script} ({a.nnodes} nodes x {per} workers); "
              f"submit it with sbatch {a.slurm_script}")
        return rc
    if a.nnodes == 1:
        return train(cfg, nproc, dry_run=a.dry_run)
    if not a.rdzv_endpoint:
        raise PtdError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (where the nodes meet)")
    nodes = Nodes(a.nnodes, a.node_rank, a.rdzv_endpoint, a.rdzv_id)
    return train(cfg, per_node(nproc, a.nnodes), dry_run=a.dry_run, nodes=nodes)

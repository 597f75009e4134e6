"""The torchtitan 0.3.x export: a launch script that ``torchtitan.train`` parses as it is.

torchtitan 0.3 reads no job file: ``--module llama3 --config llama3_8b`` picks a config
function (``torchtitan/models/llama3/config_registry.py``), and ``--section.field value``
flags plus one ``activation-checkpoint:{none,selective,full}`` subcommand override it
(parsed by tyro in ``torchtitan.config.manager.ConfigManager``). Every flag written here
is a field of ``torchtitan/config/configs.py`` (0.3.0); what has no field is written as a
``# not expressible:`` comment and printed on stderr by ``ptd plan``.
"""

from __future__ import annotations

import shlex

from ..cost.estimate import Estimate
from ..specs.config import TrainConfig
from ..specs.model import ModelSpec
from ..specs.plan import ParallelPlan

# ptd preset -> torchtitan 0.3 config function of module llama3
CONFIGS = {"llama3-8b": "llama3_8b", "llama3-70b": "llama3_70b", "llama3.1-405b": "llama3_405b"}
SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}


def schedule(p: ParallelPlan) -> str:
    """torch.distributed.pipelining schedule name (torchtitan passes it to
    ``get_schedule_class``)."""
    if p.schedule == "zero-bubble":
        return "ZBVZeroBubble" if p.stages_per_rank == 2 else "InterleavedZeroBubble"
    return SCHEDULES[p.schedule]


def model_parts(n_layers: int, split: tuple[int, ...]) -> list[list[str]]:
    """Module names of each pipeline stage (virtual stages in order): ptd's exact split,
    embeddings on the first, final norm and output head on the last."""
    parts, start = [], 0
    for i, n in enumerate(split):
        names = [f"layers.{j}" for j in range(start, start + n)]
        start += n
        if i == 0:
            names.insert(0, "tok_embeddings")
        if i == len(split) - 1:
            names += ["norm", "lm_head"]
        parts.append(names)
    assert start == n_layers
    return parts


def _model(m: ModelSpec) -> tuple[str, str, list[str]]:
    """``(module, config function, notes)``: the llama3 config of the same shape, else a
    debug config of a module with the model's kind of MLP (torchtitan 0.3 reads no model
    shape from the command line)."""
    notes: list[str] = []
    config = CONFIGS.get(m.name)
    module = "llama3"
    if config is None:
        shape = (f"dim={m.hidden}, n_layers={m.n_layers}, n_heads={m.n_heads}, "
                 f"n_kv_heads={m.n_kv_heads}, ffn hidden={m.ffn_hidden}, "
                 f"vocab_size={m.vocab_size}")
        if m.is_moe:
            # llama3 has no MoE layer, so expert parallelism would have nothing to split
            module, config = "qwen3", "qwen3_moe_debug"
            shape += (f", num_experts={m.n_experts}, top_k={m.top_k}, moe hidden="
                      f"{m.ffn_hidden}, shared experts={m.n_shared_experts}, load-balance "
                      f"coefficient={m.aux_loss_coef}")
            if m.capacity_factor:
                shape += f", capacity factor={m.capacity_factor}"
        else:
            config = "llama3_debugmodel"
        notes.append(f"{m.name} has no torchtitan config function: written as {module} "
                     f"{config}; register one with {shape}")
        if m.mlp != "swiglu" or m.norm != "rmsnorm" or m.position != "rope":
            notes.append(f"{m.name} is {m.mlp}/{m.norm}/{m.position}; torchtitan's {module} is "
                         f"SwiGLU/RMSNorm/RoPE")
        if module == "qwen3":
            notes.append("qwen3's attention normalises queries and keys (QK-norm), which "
                         f"{m.name} does not")
    if config == "llama3_405b":
        notes.append("config llama3_405b converts linear layers to float8 and compiles the "
                     "model; ptd planned plain bf16 matmuls (no CLI field removes the converter)")
    return module, config, notes


def arguments(e: Estimate, split: tuple[int, ...], steps: int | None,
              cfg: TrainConfig) -> tuple[list[str], list[str]]:
    """``(argv after -m torchtitan.train, notes on what cannot be expressed)``."""
    m, p = e.model, e.plan
    module, config, notes = _model(m)
    a = ["--module", module, "--config", config]

    def f(name: str, value: object) -> None:
        a.extend([f"--{name}", str(value)])

    _parallelism(m, p, split, a, f, notes)
    _training(p, steps, cfg, a, f, notes)
    a.append(f"activation-checkpoint:{p.recompute}")  # the subcommand comes last
    return a, notes


def _parallelism(m: ModelSpec, p: ParallelPlan, split: tuple[int, ...], a: list[str],  # type: ignore[no-untyped-def]
                 f, notes: list[str]) -> None:
    """The ``parallelism`` section: data (replicate or shard), tensor, context, expert and
    pipeline degrees, the schedule and the stage split."""
    if p.zero == 0 and p.tp == 1 and p.pp == 1 and p.ep == 1:
        f("parallelism.data-parallel-replicate-degree", p.dp)
        f("parallelism.data-parallel-shard-degree", 1)
    else:
        if p.zero == 0 and p.dp > 1:
            notes.append("DDP (ZeRO 0) with tp/pp/ep > 1 has no torchtitan setting: written "
                         "as FSDP without resharding after forward")
        if p.zero == 1 and p.dp > 1:
            notes.append("ZeRO-1 has no torchtitan setting: written as FSDP without resharding "
                         "after forward (ZeRO-2-like)")
        f("parallelism.data-parallel-replicate-degree", 1)
        f("parallelism.data-parallel-shard-degree", p.dp)
        f("parallelism.fsdp-reshard-after-forward", "always" if p.zero == 3 else "never")
    f("parallelism.tensor-parallel-degree", p.tp)
    if p.cp > 1:
        f("parallelism.context-parallel-degree", p.cp)
        # ptd's zig-zag layout: rank i holds chunks i and 2cp-1-i of the sequence
        f("parallelism.context-parallel-load-balancer", "headtail")
    if m.is_moe:
        # torchtitan takes the ep ranks from dp_shard * cp * tp; ptd from dp, which divides it
        f("parallelism.expert-parallel-degree", p.ep)
    if p.tp > 1:
        a.append("--parallelism.enable-sequence-parallel" if p.sp
                 else "--parallelism.no-enable-sequence-parallel")
    f("parallelism.pipeline-parallel-degree", p.pp)
    if p.pp > 1:
        f("parallelism.pipeline-parallel-schedule", schedule(p))
        f("parallelism.pipeline-parallel-microbatch-size", p.micro_batch)
        a.append("--parallelism.module-fqns-per-model-part")
        a.extend(",".join(part) for part in model_parts(m.n_layers, split))


def _training(p: ParallelPlan, steps: int | None, cfg: TrainConfig, a: list[str], f,  # type: ignore[no-untyped-def]
              notes: list[str]) -> None:
    """Batches, steps, precision, offload, AdamW, the learning-rate schedule, seed."""
    opt = cfg.optim
    # with a pipeline the local batch is the replica's; without, more is gradient accumulation
    f("training.local-batch-size", p.global_batch // p.dp if p.pp > 1 else p.micro_batch)
    if p.pp > 1 or p.ep > 1:
        # pipeline schedules, and the all-to-all token dispatch (it syncs with the host),
        # run outside CUDA graphs; torchtitan refuses either otherwise
        a.append("--training.disable-cuda-graphs")
    f("training.global-batch-size", p.global_batch)
    f("training.seq-len", p.seq_len)
    f("training.steps", steps or cfg.steps)
    if p.dtype == "fp16":
        notes.append("fp16 has no mixed_precision_param value: written as bfloat16")
    f("training.mixed-precision-param", "float32" if p.dtype == "fp32" else "bfloat16")
    a.append("--training.enable-cpu-offload" if p.offload else "--training.no-enable-cpu-offload")
    f("training.max-norm", opt.grad_clip)
    g = "optimizer.param-groups.0.optimizer-kwargs"
    f(f"{g}.lr", opt.lr)
    a.extend([f"--{g}.betas", str(opt.beta1), str(opt.beta2)])
    f(f"{g}.eps", opt.eps)
    f(f"{g}.weight-decay", opt.weight_decay)
    f("lr-scheduler.warmup-steps", opt.warmup_steps)
    f("lr-scheduler.decay-type", "cosine")
    f("lr-scheduler.min-lr-factor", opt.min_lr_ratio)
    f("debug.seed", cfg.seed)
    if p.grad_compression != "none":
        notes.append(f"gradient compression {p.grad_compression} has no torchtitan field")
    if p.recompute == "selective":
        notes.append("selective recompute is torchtitan's per-op SAC, which saves a different "
                     "set of tensors than ptd's attention-core recompute (--stack torchtitan "
                     "prices the per-op policy)")


def script(e: Estimate, split: tuple[int, ...], steps: int | None, cfg: TrainConfig,
           summary: str) -> tuple[str, list[str]]:
    """The launch script and its notes."""
    args, notes = arguments(e, split, steps, cfg)
    c, p = e.cluster, e.plan
    nproc = min(p.world_size, c.devices_per_node)
    nnodes = p.world_size // nproc
    head = ["#!/usr/bin/env bash",
            f"# torchtitan 0.3.x launch exported by ptd plan -- {summary}",
            f"# run on each of the {nnodes} node(s) with MASTER_ADDR/MASTER_PORT of the first"]
    head += [f"# not expressible: {n}" for n in notes]
    cmd = ["torchrun", f"--nnodes={nnodes}", f"--nproc-per-node={nproc}",
           "--rdzv-backend=c10d", '--rdzv-endpoint="${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}"',
           "-m", "torchtitan.train"]
    lines = [" ".join(cmd)] + _pairs(args)
    return "\n".join(head) + "\nset -euo pipefail\n" + " \\\n  ".join(lines) + "\n", notes


def _pairs(args: list[str]) -> list[str]:
    """One flag with its values per line."""
    out: list[str] = []
    for t in args:
        if t.startswith("--") or t.startswith("activation-checkpoint:") or not out:
            out.append(shlex.quote(t))
        else:
            out[-1] += " " + shlex.quote(t)
    return out

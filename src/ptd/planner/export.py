"""A planned layout written for ptd and for three other frameworks.

* ``ptd``: a TOML :class:`~ptd.specs.TrainConfig` (model written out in full, the plan,
  training defaults) that ``ptd train --config FILE`` runs as is;
* ``torchtitan``: a job-config TOML (``[training]``, ``[parallelism]``,
  ``[activation_checkpoint]`` ...; key names from ``torchtitan/config/job_config.py``);
* ``megatron``: Megatron-LM command-line arguments (names from
  ``megatron/training/arguments.py``, core v0.14);
* ``deepspeed``: a JSON object with the ``ds_config`` (keys from DeepSpeed's
  ``docs/_pages/config-json.md``), the ``deepspeed.pipe.PipelineModule`` arguments, and the
  parallel degrees that ds_config cannot hold.

What a framework cannot express is listed in :data:`LIMITS` (and the README); the notes
that apply to the exported plan are written into the export itself, as comments (or a
``notes`` list in JSON). Nothing here imports those frameworks.
"""

from __future__ import annotations

import json
from typing import Any

from ..cost.estimate import CostOptions, Estimate
from ..cost.params import layers_per_rank, stage_split
from ..errors import PtdError
from ..fmt import duration, gib, si
from ..specs import tomlio
from ..specs.config import OptimConfig, TrainConfig
from ..specs.plan import ParallelPlan

FORMATS = ("ptd", "torchtitan", "megatron", "deepspeed")

LIMITS: dict[str, list[str]] = {
    "ptd": [
        "Data, steps and optimizer settings are ptd's defaults (TrainConfig); edit the file "
        "for a real run.",
    ],
    "torchtitan": [
        "ZeRO-1, and DDP combined with tensor or pipeline parallelism, have no torchtitan "
        "setting (its DDP is one-dimensional and there is no optimizer-only sharding): they "
        "are written as FSDP without resharding after forward (ZeRO-2-like).",
        "Tensor parallelism always shards norms along the sequence: sequence parallel off "
        "with tp > 1 cannot be expressed.",
        "Selective recompute is written as per-op SAC (selective_ac_option = \"op\"), which "
        "saves a different set of tensors than ptd's attention-core recompute.",
        "Models are flavours registered in code; only llama3 8B/70B/405B map to one. Other "
        "models get flavor \"ptd-<name>\", which must be registered with the printed shape.",
        "fp16 compute has no mixed_precision_param value (bfloat16 or float32 only).",
        "Uneven pipeline stages are written as explicit pipeline_parallel_split_points.",
    ],
    "megatron": [
        "ZeRO-1 is the distributed optimizer (--use-distributed-optimizer); ZeRO-2/3 are "
        "Megatron FSDP (--use-megatron-fsdp with --data-parallel-sharding-strategy "
        "optim_grads / optim_grads_params).",
        "Schedules are 1F1B and interleaved 1F1B only: GPipe is written as 1F1B (same bubble, "
        "less memory); zero-bubble has no Megatron-LM core schedule and is written as "
        "interleaved 1F1B (vpp > 2) or 1F1B (ZB-V).",
        "Uneven stages: only the first and last stage may differ from the others "
        "(--decoder-first/last-pipeline-num-layers), and not with virtual stages.",
        "Offload moves optimizer states only (--optimizer-cpu-offload).",
        "The tokenizer is written as NullTokenizer (--vocab-size V-1: it adds an "
        "end-of-document id); replace it with the run's tokenizer.",
    ],
    "deepspeed": [
        "ds_config holds no pipeline degree: it is deepspeed.pipe.PipelineModule(num_stages=pp) "
        "in code (written under pipeline_module).",
        "Tensor parallelism is AutoTP (tensor_parallel.autotp_size, Hugging Face models) or "
        "Megatron-DeepSpeed's own; Megatron-style sequence parallelism has no ds_config key "
        "(DeepSpeed-Ulysses is a different scheme).",
        "The pipeline engine runs one schedule (1F1B-like): GPipe, interleaved and zero-bubble "
        "cannot be expressed; with pp > 1 only ZeRO 0 and 1 are supported.",
        "Recompute: activation_checkpointing configures deepspeed.checkpointing, which the "
        "model must call; PipelineModule's activation_checkpoint_interval=1 is full "
        "recompute; selective has no equivalent.",
        "PipelineModule partitions by 'parameters', 'uniform' or layer type: an exact uneven "
        "split (layers per stage) cannot be given.",
    ],
}

TORCHTITAN_FLAVORS = {"llama3-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B"),
                      "llama3.1-405b": ("llama3", "405B")}
TORCHTITAN_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}


def export(e: Estimate, fmt: str, *, hardware: str = "", steps: int | None = None,
           out: str | None = None, options: CostOptions = CostOptions()) -> str:
    """The text of the export (TOML, argument lines or JSON)."""
    if fmt == "ptd":
        return to_ptd(e, hardware or e.cluster.hardware.name, steps, out)
    if fmt == "torchtitan":
        return to_torchtitan(e, steps)
    if fmt == "megatron":
        return to_megatron(e, steps, options)
    if fmt == "deepspeed":
        return to_deepspeed(e, options)
    raise PtdError(f"unknown export format {fmt!r}; choose from {', '.join(FORMATS)}")


def _summary(e: Estimate) -> str:
    c = e.cluster
    return (f"{e.model.name} on {c.n_devices} x {c.hardware.name}: {e.plan.describe()} seq "
            f"{e.plan.seq_len} {e.plan.dtype}; predicted step {duration(e.step.total)}, "
            f"{gib(e.memory.total)} per device, {si(e.tokens_per_s)} tokens/s, "
            f"MFU {100 * e.mfu:.1f}%")


def stages(e: Estimate) -> tuple[int, ...]:
    """Layers per virtual pipeline stage, in stage order (ptd's cost-balanced split)."""
    return stage_split(e.model, e.plan.n_stages, e.plan.seq_len)


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


# ------------------------------------------------------------------ torchtitan
def to_torchtitan(e: Estimate, steps: int | None = None) -> str:
    m, p = e.model, e.plan
    notes: list[str] = []
    opt = OptimConfig()
    if m.name in TORCHTITAN_FLAVORS:
        name, flavor = TORCHTITAN_FLAVORS[m.name]
    else:
        name, flavor = "llama3", f"ptd-{m.name}"
        notes.append(f"no torchtitan flavour has this model's shape: register {flavor!r} with "
                     f"dim={m.hidden}, n_layers={m.n_layers}, n_heads={m.n_heads}, "
                     f"n_kv_heads={m.n_kv_heads}, ffn hidden={m.ffn_hidden}, "
                     f"vocab_size={m.vocab_size}")
        if m.mlp != "swiglu" or m.norm != "rmsnorm" or m.position != "rope":
            notes.append(f"{m.name} is GPT-style ({m.mlp}, {m.norm}, {m.position} positions); "
                         f"torchtitan's llama3 model is SwiGLU/RMSNorm/RoPE")
    par: dict[str, Any] = {}
    if p.zero == 0 and (p.tp > 1 or p.pp > 1) and p.dp > 1:
        notes.append("DDP (zero 0) with tp/pp > 1 has no torchtitan setting: written as FSDP "
                     "without resharding after forward")
    if p.zero == 1 and p.dp > 1:
        notes.append("ZeRO-1 has no torchtitan setting: written as FSDP without resharding "
                      "after forward (ZeRO-2-like)")
    if p.zero == 0 and p.tp == 1 and p.pp == 1:
        par.update(data_parallel_replicate_degree=p.dp, data_parallel_shard_degree=1)
    else:
        par.update(data_parallel_replicate_degree=1, data_parallel_shard_degree=p.dp,
                   fsdp_reshard_after_forward="always" if p.zero == 3 else "never")
    par.update(tensor_parallel_degree=p.tp, enable_async_tensor_parallel=False)
    if p.tp > 1 and not p.sp:
        notes.append("sequence parallel off cannot be expressed: torchtitan's tensor "
                     "parallelism shards norms along the sequence")
    par["pipeline_parallel_degree"] = p.pp
    if p.cp > 1:
        par["context_parallel_degree"] = p.cp
    training: dict[str, Any] = {"global_batch_size": p.global_batch, "seq_len": p.seq_len}
    if p.pp > 1:
        par["pipeline_parallel_schedule"] = _titan_schedule(p)
        par["pipeline_parallel_microbatch_size"] = p.micro_batch
        split = stages(e)
        starts = [sum(split[:i]) for i in range(1, len(split))]
        par["pipeline_parallel_split_points"] = [f"layers.{s}" for s in starts]
        training["local_batch_size"] = p.global_batch // p.dp
    else:
        training["local_batch_size"] = p.micro_batch  # more is gradient accumulation
    if p.dtype == "fp16":
        notes.append("fp16 has no mixed_precision_param value: written as bfloat16")
    training.update(steps=steps or TrainConfig().steps,
                    mixed_precision_param="float32" if p.dtype == "fp32" else "bfloat16",
                    enable_cpu_offload=p.offload, max_norm=opt.grad_clip)
    ac: dict[str, Any] = {"mode": p.recompute}
    if p.recompute == "selective":
        ac["selective_ac_option"] = "op"
        notes.append("selective recompute written as per-op SAC, which saves a different set "
                     "of tensors than ptd's attention-core recompute")
    doc = {"job": {"description": f"ptd plan: {m.name} {p.describe()}"},
           "model": {"name": name, "flavor": flavor},
           "optimizer": {"name": "AdamW", "lr": opt.lr, "beta1": opt.beta1, "beta2": opt.beta2,
                         "eps": opt.eps, "weight_decay": opt.weight_decay},
           "lr_scheduler": {"warmup_steps": opt.warmup_steps, "decay_type": "cosine",
                            "lr_min": opt.min_lr_ratio},
           "training": training, "parallelism": par, "activation_checkpoint": ac}
    head = [f"# torchtitan job config exported by ptd plan -- {_summary(e)}",
            f"# launch {p.world_size} ranks (e.g. NGPU and torchrun --nnodes over your nodes)"]
    head += [f"# note: {n}" for n in notes]
    return "\n".join(head) + "\n\n" + tomlio.dumps(doc)


def _titan_schedule(p: ParallelPlan) -> str:
    if p.schedule == "zero-bubble":
        return "ZBVZeroBubble" if p.stages_per_rank == 2 else "InterleavedZeroBubble"
    return TORCHTITAN_SCHEDULES[p.schedule]


# -------------------------------------------------------------------- megatron
def megatron_args(e: Estimate, steps: int | None = None,
                  options: CostOptions = CostOptions()) -> tuple[list[tuple[str, Any]], list[str]]:
    """``([(flag, value or None)], notes)`` for Megatron-LM's ``pretrain_gpt.py``."""
    m, p = e.model, e.plan
    opt = OptimConfig()
    args: list[tuple[str, Any]] = []
    notes: list[str] = []

    def a(flag: str, value: Any = None) -> None:
        args.append((flag, value))

    # model
    a("--num-layers", m.n_layers)
    a("--hidden-size", m.hidden)
    a("--ffn-hidden-size", m.ffn_hidden)
    a("--num-attention-heads", m.n_heads)
    if m.n_kv_heads != m.n_heads:
        a("--group-query-attention")
        a("--num-query-groups", m.n_kv_heads)
    if m.head_dim * m.n_heads != m.hidden:
        a("--kv-channels", m.head_dim)
    a("--seq-length", p.seq_len)
    a("--max-position-embeddings", m.max_seq_len)
    a("--position-embedding-type", "rope" if m.position == "rope" else "learned_absolute")
    if m.position == "rope":
        a("--rotary-base", int(m.rope_theta) if float(m.rope_theta).is_integer() else m.rope_theta)
    a("--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm")
    a("--norm-epsilon", m.norm_eps)
    if m.mlp == "swiglu":
        a("--swiglu")
    if not m.tied_embeddings:
        a("--untie-embeddings-and-output-weights")
    if not m.bias:
        a("--disable-bias-linear")
    a("--attention-dropout", m.dropout)
    a("--hidden-dropout", m.dropout)
    if m.is_moe:
        a("--num-experts", m.n_experts)
        a("--moe-router-topk", m.top_k)
    a("--init-method-std", m.init_std)
    # NullTokenizer adds one end-of-document id to --vocab-size; padding to a multiple of
    # 1 * tp then leaves the model's own vocabulary (tp divides it)
    a("--tokenizer-type", "NullTokenizer")
    a("--vocab-size", m.vocab_size - 1)
    a("--make-vocab-size-divisible-by", 1)
    a("--attention-backend", "flash" if options.attention == "flash" else "unfused")
    # parallelism
    a("--tensor-model-parallel-size", p.tp)
    a("--pipeline-model-parallel-size", p.pp)
    if p.cp > 1:
        a("--context-parallel-size", p.cp)
    if p.sp:
        a("--sequence-parallel")
    split = stages(e)
    if p.pp > 1:
        v = p.stages_per_rank
        if p.schedule == "gpipe":
            notes.append("Megatron-LM has no GPipe schedule: 1F1B runs the same bubble with "
                         "less activation memory")
        if p.schedule == "zero-bubble":
            notes.append("zero-bubble has no Megatron-LM core schedule: written as "
                         + ("1F1B" if v == 2 else f"interleaved 1F1B with {v} virtual stages"))
        interleaved = (p.schedule == "interleaved-1f1b") or (p.schedule == "zero-bubble" and v > 2)
        if interleaved:
            if len(set(split)) == 1:
                a("--num-layers-per-virtual-pipeline-stage", split[0])
            else:
                a("--num-virtual-stages-per-pipeline-rank", v)
                notes.append(f"uneven virtual stages {list(split)} cannot be expressed; "
                             f"Megatron-LM splits them its own way")
        else:
            per_rank = layers_per_rank(e.model, p)
            if len(set(per_rank)) > 1:
                if len(set(per_rank[1:-1])) <= 1:
                    a("--decoder-first-pipeline-num-layers", per_rank[0])
                    a("--decoder-last-pipeline-num-layers", per_rank[-1])
                else:
                    notes.append(f"uneven stages {list(per_rank)} cannot be expressed (only the "
                                 f"first and last stage may differ)")
    # batch, precision, memory
    a("--micro-batch-size", p.micro_batch)
    a("--global-batch-size", p.global_batch)
    if p.dtype == "bf16":
        a("--bf16")
    elif p.dtype == "fp16":
        a("--fp16")
    if p.recompute == "selective":
        a("--recompute-granularity", "selective")
    elif p.recompute == "full":
        a("--recompute-granularity", "full")
        a("--recompute-method", "uniform")
        a("--recompute-num-layers", 1)
    if p.zero == 1:
        a("--use-distributed-optimizer")
    elif p.zero >= 2:
        a("--use-megatron-fsdp")
        a("--data-parallel-sharding-strategy", "optim_grads" if p.zero == 2 else "optim_grads_params")
    if p.offload:
        a("--optimizer-cpu-offload")
        notes.append("offload: Megatron-LM offloads optimizer states only")
    if options.dp_overlap and p.dp > 1:
        a("--overlap-grad-reduce")
        if p.zero == 1:
            a("--overlap-param-gather")
    if p.grad_compression != "none":
        notes.append(f"gradient compression {p.grad_compression} has no Megatron-LM argument")
    # optimizer and run
    a("--train-iters", steps or TrainConfig().steps)
    a("--lr", opt.lr)
    a("--min-lr", opt.lr * opt.min_lr_ratio)
    a("--lr-decay-style", "cosine")
    a("--lr-warmup-iters", opt.warmup_steps)
    a("--weight-decay", opt.weight_decay)
    a("--adam-beta1", opt.beta1)
    a("--adam-beta2", opt.beta2)
    a("--adam-eps", opt.eps)
    a("--clip-grad", opt.grad_clip)
    a("--seed", TrainConfig().seed)
    return args, notes


def to_megatron(e: Estimate, steps: int | None = None,
                options: CostOptions = CostOptions()) -> str:
    args, notes = megatron_args(e, steps, options)
    p, c = e.plan, e.cluster
    head = [f"# Megatron-LM arguments (pretrain_gpt.py) exported by ptd plan -- {_summary(e)}",
            f"# data parallel = world size / (tp*pp) = {p.dp}: launch {p.world_size} ranks, e.g. "
            f"torchrun --nnodes {c.n_nodes} --nproc-per-node {c.devices_per_node} pretrain_gpt.py "
            f"<these arguments> <data arguments>"]
    head += [f"# note: {n}" for n in notes]
    lines = [f"  {flag}" if v is None else f"  {flag} {_arg(v)}" for flag, v in args]
    return "\n".join(head) + "\n" + " \\\n".join(lines) + "\n"


def _arg(v: Any) -> str:
    return format(v, ".10g") if isinstance(v, float) else str(v)


# ------------------------------------------------------------------- deepspeed
def deepspeed_config(e: Estimate, options: CostOptions = CostOptions()) -> dict[str, Any]:
    """``{"ds_config": ..., "pipeline_module": ..., "parallel": ..., "notes": [...]}``."""
    p = e.plan
    opt = OptimConfig()
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
        "steps_per_print": 10,
    }
    if p.dtype == "bf16":
        ds["bf16"] = {"enabled": True}
    elif p.dtype == "fp16":
        ds["fp16"] = {"enabled": True}
    if p.tp > 1:
        ds["tensor_parallel"] = {"autotp_size": p.tp}
        notes.append("tensor parallelism as AutoTP (Hugging Face models); with Megatron-DeepSpeed "
                     "use its --tensor-model-parallel-size instead")
    if p.sp:
        notes.append("Megatron-style sequence parallelism has no ds_config key")
    if p.cp > 1:
        notes.append("context parallelism (ring/all-gather attention) has no ds_config key; "
                     "DeepSpeed-Ulysses splits heads instead")
    if p.recompute != "none":
        ds["activation_checkpointing"] = {"partition_activations": False,
                                          "cpu_checkpointing": False,
                                          "contiguous_memory_optimization": False,
                                          "number_checkpoints": None,
                                          "synchronize_checkpoint_boundary": False,
                                          "profile": False}
        if p.recompute == "selective":
            notes.append("selective recompute has no DeepSpeed equivalent; recompute the "
                         "attention core in the model's code")
    out: dict[str, Any] = {"ds_config": ds}
    if p.pp > 1:
        split = stages(e)
        out["pipeline_module"] = {"num_stages": p.pp,
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
    out["parallel"] = {"data_parallel": p.dp, "tensor_parallel": p.tp, "pipeline_parallel": p.pp,
                       "world_size": p.world_size}
    out["notes"] = [f"ptd plan: {_summary(e)}"] + notes
    return out


def to_deepspeed(e: Estimate, options: CostOptions = CostOptions()) -> str:
    return json.dumps(deepspeed_config(e, options), indent=2) + "\n"


def default_filename(fmt: str) -> str:
    return {"ptd": "plan.toml", "torchtitan": "torchtitan.toml", "megatron": "megatron_args.txt",
            "deepspeed": "deepspeed.json"}[fmt]


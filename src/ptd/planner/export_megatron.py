"""The Megatron-LM (core_r0.19.x) export: a launch script for ``pretrain_gpt.py``.

The argument names and the rules they must satisfy are those of
``megatron/training/arguments.py`` (``parse_args`` + ``validate_args``) at Megatron-LM
core_r0.19.0; the argument list was run through that function (docs/exports.md says how).
What Megatron-LM cannot express is written as a ``# not expressible:`` comment and printed on
stderr by ``ptd plan``.
"""

from __future__ import annotations

from typing import Any

from ..cost.estimate import CostOptions, Estimate
from ..specs.config import TrainConfig
from ..specs.model import ModelSpec
from ..specs.plan import ParallelPlan


def layout(split: tuple[int, ...]) -> str:
    """``--pipeline-model-parallel-layout``: one ``|``-separated entry per (virtual) stage in
    stage order, stage ``s`` on pipeline rank ``s % pp`` (Megatron's
    ``PipelineParallelLayerLayout``); ``E`` embedding, ``t*n`` n decoder layers, ``L`` loss."""
    stages = [f"t*{n}" for n in split]
    stages[0] = "E" + stages[0]
    stages[-1] += "L"
    return "|".join(stages)


def _pipeline(p: ParallelPlan, split: tuple[int, ...], a, notes: list[str]) -> None:
    if p.pp == 1:
        return
    v = p.stages_per_rank
    if p.schedule == "gpipe":
        notes.append("Megatron-LM has no GPipe schedule: written as 1F1B (same bubble, less "
                     "activation memory)")
    if p.schedule == "zero-bubble":
        notes.append("zero-bubble has no Megatron-LM core schedule: written as "
                     + (f"interleaved 1F1B with {v} virtual stages per rank (ZB-V's V-shaped "
                        "stage placement becomes round-robin)" if v > 1 else "1F1B"))
    # ptd's exact split, also when it is even: Megatron's default would be the same then,
    # but stating it leaves nothing to Megatron's own rules.
    a("--pipeline-model-parallel-layout", layout(split))


def arguments(e: Estimate, split: tuple[int, ...], steps: int | None, cfg: TrainConfig,
              options: CostOptions = CostOptions()) -> tuple[list[tuple[str, Any]], list[str]]:
    """``([(flag, value or None)], notes)`` for ``pretrain_gpt.py``."""
    args: list[tuple[str, Any]] = []
    notes: list[str] = []

    def a(flag: str, value: Any = None) -> None:
        args.append((flag, value))

    _model(e.model, e.plan, options, a, notes)
    _parallel(e.plan, split, options, a, notes)
    _training(e.plan, steps, cfg, a)
    return args, notes


def _model(m: ModelSpec, p: ParallelPlan, options: CostOptions, a, notes: list[str]) -> None:  # type: ignore[no-untyped-def]
    """The architecture, its initialisation and the vocabulary."""
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
        _moe(m, p, a, notes)
    a("--init-method-std", m.init_std)
    # NullTokenizer's vocabulary is --vocab-size itself (end-of-document is id V-1); Megatron
    # pads it to a multiple of make-vocab-size-divisible-by * tp, the rows ptd's runtime pads to.
    a("--tokenizer-type", "NullTokenizer")
    a("--vocab-size", m.vocab_size)
    a("--make-vocab-size-divisible-by", m.vocab_multiple)
    a("--attention-backend", "flash" if options.attention == "flash" else "unfused")


def _parallel(p: ParallelPlan, split: tuple[int, ...], options: CostOptions, a,  # type: ignore[no-untyped-def]
              notes: list[str]) -> None:
    """Degrees, pipeline split and schedule, batches, precision, recompute, ZeRO."""
    a("--tensor-model-parallel-size", p.tp)
    a("--pipeline-model-parallel-size", p.pp)
    if p.cp > 1:
        a("--context-parallel-size", p.cp)
        a("--cp-comm-type", "all_gather")  # ptd gathers K/V over the cp group
    if p.sp and p.tp > 1:
        a("--sequence-parallel")
    _pipeline(p, split, a, notes)
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
    _memory(p, options, a, notes)


def _training(p: ParallelPlan, steps: int | None, cfg: TrainConfig, a) -> None:  # type: ignore[no-untyped-def]
    """Steps, the learning-rate schedule, AdamW, clipping, seed."""
    opt = cfg.optim
    a("--train-iters", steps or cfg.steps)
    a("--lr", opt.lr)
    a("--min-lr", opt.lr * opt.min_lr_ratio)
    a("--lr-decay-style", "cosine")
    a("--lr-warmup-iters", opt.warmup_steps)
    a("--weight-decay", opt.weight_decay)
    a("--adam-beta1", opt.beta1)
    a("--adam-beta2", opt.beta2)
    a("--adam-eps", opt.eps)
    a("--clip-grad", opt.grad_clip)
    a("--seed", cfg.seed)


def _moe(m: ModelSpec, p: ParallelPlan, a, notes: list[str]) -> None:
    """Experts, routing and expert parallelism (Megatron's ``--moe-*`` arguments)."""
    a("--num-experts", m.n_experts)
    a("--moe-router-topk", m.top_k)
    a("--moe-ffn-hidden-size", m.ffn_hidden)
    if m.n_shared_experts:
        a("--moe-shared-expert-intermediate-size", m.n_shared_experts * m.ffn_hidden)
    a("--moe-router-load-balancing-type", "aux_loss")
    a("--moe-aux-loss-coeff", m.aux_loss_coef)
    if m.z_loss_coef:
        a("--moe-z-loss-coeff", m.z_loss_coef)
    if m.capacity_factor:
        a("--moe-expert-capacity-factor", m.capacity_factor)
        a("--moe-token-dispatcher-type", "alltoall")
    # ptd carves expert parallelism out of data parallelism, as Megatron does (experts
    # split over ep of the data-parallel ranks, tensor parallelism unchanged inside)
    a("--expert-model-parallel-size", p.ep)
    if p.tp > 1:
        notes.append("experts over tp: Megatron shards each expert over tp "
                     "(--expert-tensor-parallel-size defaults to tp) and wants sequence "
                     "parallelism with experts and tp > 1; ptd keeps every expert whole on each "
                     "tp rank, without sequence parallelism")


def _memory(p: ParallelPlan, options: CostOptions, a, notes: list[str]) -> None:
    """ZeRO stage, offload and overlap."""
    if p.zero == 1:
        a("--use-distributed-optimizer")
    elif p.zero >= 2:
        # ZeRO-2/3 are Megatron-FSDP, which saves only its own checkpoint format
        a("--use-megatron-fsdp")
        a("--data-parallel-sharding-strategy", "optim_grads" if p.zero == 2 else "optim_grads_params")
        a("--ckpt-format", "fsdp_dtensor")
    if p.offload:
        if p.zero != 1:
            a("--use-distributed-optimizer")  # the precision-aware offload needs it
        a("--optimizer-cpu-offload")
        a("--use-precision-aware-optimizer")
        notes.append("offload: Megatron-LM offloads optimizer states only; parameters and "
                     "gradients stay on the GPU")
    if options.dp_overlap and p.dp > 1:
        a("--overlap-grad-reduce")
        if p.zero == 1:
            a("--overlap-param-gather")
    if p.grad_compression != "none":
        notes.append(f"gradient compression {p.grad_compression} has no Megatron-LM argument")


def script(e: Estimate, split: tuple[int, ...], steps: int | None, cfg: TrainConfig,
           summary: str, options: CostOptions = CostOptions()) -> tuple[str, list[str]]:
    args, notes = arguments(e, split, steps, cfg, options)
    c, p = e.cluster, e.plan
    nproc = min(p.world_size, c.devices_per_node)
    nnodes = p.world_size // nproc
    head = ["#!/usr/bin/env bash",
            f"# Megatron-LM core_r0.19 launch exported by ptd plan -- {summary}",
            f"# data parallel = world size / (tp*pp) = {p.dp}; run in a Megatron-LM checkout on "
            f"each of the {nnodes} node(s), NODE_RANK and MASTER_ADDR/MASTER_PORT set; add the "
            f"data arguments (--data-path ..., or --mock-data)"]
    head += [f"# not expressible: {n}" for n in notes]
    env = ["set -euo pipefail"]
    if p.zero >= 2:
        # validate_args refuses Megatron-FSDP with CUDA_DEVICE_MAX_CONNECTIONS=1
        env.append("unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron-FSDP needs it unset or > 1")
        if p.tp > 1:
            head.append("# note: Megatron warns that tensor parallelism (wants "
                        "CUDA_DEVICE_MAX_CONNECTIONS=1) and Megatron-FSDP (wants it unset) "
                        "overlap best under different settings")
    else:
        # tensor/sequence-parallel overlap needs kernels queued in order; validate_args
        # refuses tp > 1 without it (before Blackwell), and it is harmless otherwise
        env.append("export CUDA_DEVICE_MAX_CONNECTIONS=1")
    cmd = (f"torchrun --nnodes {nnodes} --nproc-per-node {nproc} --node-rank ${{NODE_RANK:-0}} "
           f"--master-addr ${{MASTER_ADDR:-localhost}} --master-port ${{MASTER_PORT:-6000}} "
           f"pretrain_gpt.py")
    lines = [cmd] + [flag if v is None else f"{flag} {_arg(v)}" for flag, v in args] + ['"$@"']
    return "\n".join(head + env) + "\n" + " \\\n  ".join(lines) + "\n", notes


def _arg(v: Any) -> str:
    if isinstance(v, float):
        return format(v, ".10g")
    s = str(v)
    return f"'{s}'" if any(ch in s for ch in "|*()") else s

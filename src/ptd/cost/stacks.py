"""Training stacks: what each framework does that changes the step time of the same plan.

A plan (tp, pp, dp, ZeRO, micro-batch, recompute) does not fix the step time: frameworks
differ in how they run it. ``--stack`` names one of the stacks below; each is a small set of
named behaviours, every one cited to the project's paper or documentation, which the cost
model reads through :class:`ptd.cost.estimate.CostOptions`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import PtdError
from .estimate import CostOptions


@dataclass(frozen=True)
class Stack:
    name: str
    attention: str
    """``flash``: fused attention kernels (no s x s scores in memory, causal tiles skipped);
    ``scores``: QK^T materialised, softmax and dropout as separate passes."""
    dp_overlap: bool
    """Data-parallel gradient reduction overlaps the backward pass."""
    recompute_early_stop: bool
    """Full recompute stops before each block's last product (PyTorch's non-reentrant
    checkpoint) rather than re-running the whole forward."""
    tp_grad_per_linear: bool
    """Without sequence parallelism, each column-parallel layer's input gradient is reduced
    on its own (PyTorch DTensor) rather than summed first (fused QKV and MLP input)."""
    schedules: tuple[str, ...]
    """Pipeline schedules the stack implements."""
    sources: str
    zero3_gather: str = "unit"
    """ZeRO-3's parameter gathers (:class:`ptd.cost.estimate.CostOptions`): ``unit``, one
    per block, prefetched; ``param-sync``, one per tensor, synchronous, again in recompute."""
    elementwise: str = "fused"
    """Memory-bound operators (:mod:`ptd.cost.eager`): ``fused`` kernels, ``eager`` PyTorch
    operators in the compute dtype, or ``autocast`` (eager, fp32 weights under autocast;
    ptd's runtime, whose ZeRO-1/2/3 runs are ``eager``: :func:`ptd.cost.eager.for_plan`)."""
    dp_overlap_model_parallel: bool = True
    """Zero-0 gradient reduction overlaps the backward with tp, pp, cp or ep > 1 as well
    (:class:`ptd.cost.estimate.CostOptions`)."""
    fsdp_copy_out: bool = False
    """ZeRO's gathered buffer is copied out into the parameters (PyTorch FSDP2) rather than
    the parameters being views of it (Megatron-LM's distributed optimizer, DeepSpeed)."""
    selective: str = "attention"
    """What selective recompute repeats (:data:`ptd.cost.compute.SELECTIVE`)."""
    dp_overlap_pipeline: bool = True
    """Gradient reduction overlaps the backward under pipeline parallelism too
    (:class:`ptd.cost.estimate.CostOptions`)."""
    convention: str = "ptd"
    """Model-state bytes (:mod:`ptd.cost.memory`): ``ptd``, ``zero`` or ``megatron``."""
    fused_swiglu: bool = False
    """SwiGLU keeps only its input for backward (:class:`ptd.cost.estimate.CostOptions`)."""
    expert_tp: bool = False
    """Routed experts split over tp, their tokens gathered over it
    (:class:`ptd.cost.estimate.CostOptions`, :mod:`ptd.cost.moe`)."""
    sp_gathered: bool = False
    """Under sequence parallelism the column-parallel layers keep the gathered sequence for
    backward (PyTorch DTensor) rather than their shard (Megatron-LM)
    (:class:`ptd.cost.estimate.CostOptions`)."""


_DEEPSPEED = Stack(
    "deepspeed", "scores", True, False, False, ("1f1b",),
    "Megatron-DeepSpeed (Smith et al. 2022, arXiv 2201.11990; BLOOM 2022): Megatron's 2021 "
    "kernels with DeepSpeed's ZeRO, whose reduction overlaps the backward (ZeRO config "
    "overlap_comm); with pipeline parallelism DeepSpeed's PipelineEngine reduces the "
    "gradients after the schedule instead (deepspeed/runtime/pipe/schedule.py, "
    "TrainSchedule: ReduceGrads at the end of the batch).", dp_overlap_pipeline=False)

STACKS: dict[str, Stack] = {s.name: s for s in (
    Stack("ptd", "flash", True, True, True, ("1f1b", "interleaved-1f1b", "zero-bubble", "gpipe"),
          "ptd's runtime: PyTorch SDPA, DDP bucketed all-reduce and FSDP2 reduce-scatter "
          "during backward, torch.utils.checkpoint(use_reentrant=False), DTensor tensor "
          "parallelism (src/ptd/runtime); in 16-bit, fp32 weights under torch.autocast "
          "with ZeRO-0 and FSDP's MixedPrecisionPolicy (16-bit parameters and "
          "activations, no autocast) with ZeRO-1/2/3 (runtime/precision.py; "
          "tests/test_fsdp_mixed_precision_saves.py); its norms, "
          "rotary embedding, activation and loss as eager PyTorch operators; with tp, "
          "pp, cp or ep > 1 and no ZeRO the gradients are all-reduced after the backward "
          "(runtime/parallel/ddp.py GradAllReduce: DDP holds no DTensors); under sequence "
          "parallelism each column-parallel layer keeps the all-gathered sequence "
          "(runtime/parallel/tp.py; tests/test_sp_saved_tensors.py counts it on two ranks).",
          elementwise="autocast", dp_overlap_model_parallel=False, fsdp_copy_out=True,
          sp_gathered=True),
    Stack("megatron-2021", "scores", False, False, False, ("1f1b", "interleaved-1f1b"),
          "Narayanan et al. 2021 (arXiv 2104.04473) and Korthikanti et al. 2022 (arXiv "
          "2205.05198): unfused attention with a fused scale-mask-softmax kernel, the "
          "gradient all-reduce after the backward pass (overlap came with "
          "--overlap-grad-reduce, NVIDIA/Megatron-LM#391, 2023), full recompute re-runs the "
          "block's forward, fused QKV / MLP-input projections (one all-reduce each); "
          "pipeline schedules 1F1B and interleaved 1F1B (the paper's section 2.2). "
          "Megatron-LM's defaults kept these kernels until 2024: flash attention an opt-in "
          "flag from 2023-01 (commit 285068c8), gradient-reduction overlap an opt-in flag "
          "from 2023-09 (2d5220a424), Transformer Engine the default from 2024-04 "
          "(e7b74a4b7e)."),
    Stack("megatron-core", "flash", True, False, False, ("1f1b", "interleaved-1f1b"),
          "Megatron-Core (NVIDIA/Megatron-LM README 2024, performance table run with "
          "--overlap-grad-reduce --overlap-param-gather --tp-comm-overlap): Transformer "
          "Engine fused attention, overlapped gradient reduce-scatter, fused projections. "
          "Memory as Megatron-LM lays it out: bf16 parameters, fp32 gradients and 12 bytes "
          "of optimizer state, 6 + 12/d bytes a parameter with the distributed optimizer "
          "over d = dp x cp (docs/source/distrib_optimizer.md; the optimizer's group is "
          "get_data_parallel_group(with_context_parallel=True)); SwiGLU by the fused "
          "bias_swiglu_impl (megatron/core/fusions/fused_bias_swiglu.py), which saves only "
          "its input and recomputes the activation in backward. Mixture-of-experts: each "
          "routed expert split over tp (expert_tensor_parallel_size defaults to "
          "tensor_model_parallel_size, megatron/core/model_parallel_config.py), the "
          "all-to-all dispatcher sending each tp rank's sequence-parallel tokens over ep, "
          "then all-gathering them over tp and reduce-scattering the experts' output "
          "(megatron/core/transformer/moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher).",
          convention="megatron", fused_swiglu=True, expert_tp=True),
    Stack("torchtitan", "flash", True, True, True,
          ("1f1b", "interleaved-1f1b", "zero-bubble", "gpipe"),
          "torchtitan (Liang et al. 2024, arXiv 2410.06511): FSDP2 with prefetching, PyTorch "
          "SDPA, non-reentrant activation checkpointing, DTensor tensor parallelism; FSDP2 "
          "mixed precision (bf16 parameters cast in the all-gather); the Llama model of "
          "facebookresearch/llama's model.py: torchtitan/models/norms.py RMSNorm, the "
          "default norm_type 'rmsnorm' (fused_rmsnorm, a Triton kernel, optional), runs "
          "_norm(x.float()).type_as(x) * weight as separate operators; models/llama/model.py "
          "repeat_kv copies K/V to the query heads; rotary embedding and SwiGLU eager; "
          "docs/performance.md names no torch.compile; selective activation "
          "checkpointing per operator (parallelisms/parallelize_llama.py at 041336434916, "
          "2024-04, selective_ac_option 'op'; torchtitan 0.3.0's SelectiveAC, the "
          "version ptd plan --export torchtitan writes for) or, then by default, every "
          "second block in full (config_manager.py selective_ac_option '2'). Sequence "
          "parallelism by DTensor (SequenceParallel norms, PrepareModuleInput to Replicate "
          "before the column-parallel layers, parallelize_llama.py), whose layers keep the "
          "gathered sequence for backward.",
          elementwise="llama-ref", fsdp_copy_out=True, selective="op", sp_gathered=True),
    _DEEPSPEED,
    # the same kernels and overlap; only ZeRO-3's gathers differ
    dataclasses.replace(
        _DEEPSPEED, name="deepspeed-2021", zero3_gather="param-sync", sources=
          "DeepSpeed as of 2021 (ZeRO-3 released March 2021; the engine Narayanan et al. "
          "2021 compare with): Megatron's 2021 kernels and reentrant checkpointing; ZeRO-3 "
          "gathers each parameter tensor with its own all-gather and waits for it "
          "(deepspeedai/DeepSpeed#1069, June 2021: one all-gather per parameter, a "
          "synchronisation before the next; #1188 batched them per module later that "
          "year), again when recompute re-runs a module's forward (#4784); gradient "
          "reduce-scatter overlaps the backward (overlap_comm)."),
)}


def stack_options(name: str, hardware: object = None) -> CostOptions:
    """The cost model's options for stack ``name``."""
    try:
        s = STACKS[name]
    except KeyError:
        raise PtdError(f"unknown stack {name!r}; known: {', '.join(STACKS)}") from None
    return CostOptions(attention=s.attention, dp_overlap=s.dp_overlap,  # type: ignore[arg-type]
                       recompute_early_stop=s.recompute_early_stop,
                       tp_grad_per_linear=s.tp_grad_per_linear, schedules=s.schedules,
                       zero3_gather=s.zero3_gather, elementwise=s.elementwise,
                       dp_overlap_model_parallel=s.dp_overlap_model_parallel,
                       fsdp_copy_out=s.fsdp_copy_out, selective=s.selective,
                       dp_overlap_pipeline=s.dp_overlap_pipeline,
                       convention=s.convention, fused_swiglu=s.fused_swiglu,  # type: ignore[arg-type]
                       expert_tp=s.expert_tp, sp_gathered=s.sp_gathered)

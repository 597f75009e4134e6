"""One estimate: a model on a cluster under a plan -> memory, step time, throughput, MFU.

:func:`estimate` prices a complete plan. :func:`choose` fills in the knobs a user left out
(micro-batch, ZeRO stage, recomputation, virtual stages, schedule, sequence parallelism) with
the combination the cost model predicts fastest among those that fit in memory.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..errors import PtdError
from ..specs.hardware import ClusterSpec, HardwareSpec
from ..specs.model import ModelSpec
from ..specs.plan import ParallelPlan
from . import eager as EAGER
from . import metrics
from .flops import FlopsPerToken, flops_per_token
from .memory import AttentionKind, Convention, MemoryBreakdown, memory
from .step import StepBreakdown, step_time


@dataclass(frozen=True)
class CostOptions:
    """Modelling choices that follow the runtime, not the user's plan."""

    convention: Convention = "ptd"
    """Model-state bytes: ``ptd`` (fp32 params and grads, 8-byte Adam), ``zero`` (2+2+12) or
    ``megatron`` (2+4+12, the distributed optimizer over dp x cp); :mod:`ptd.cost.memory`."""
    fused_swiglu: bool = False
    """SwiGLU by one kernel that keeps only its input (Megatron-Core): 3 F activation
    elements a token instead of eager PyTorch's 4; :func:`ptd.cost.memory.activation_bytes_per_layer`."""
    expert_tp: bool = False
    """Routed experts split over the tensor-parallel group like a dense MLP, their tokens
    all-gathered over it after the all-to-all and reduce-scattered before the way back
    (Megatron-Core's default ``expert_tensor_parallel_size = tp``); False: whole on every tp
    rank (ptd's runtime). See :mod:`ptd.cost.moe`."""
    sp_gathered: bool = True
    """Under sequence parallelism the column-parallel layers keep their all-gathered,
    whole-sequence input for backward (PyTorch DTensor: ptd's runtime, torchtitan); False:
    the sequence shard, gathered again in backward (Megatron-LM). See
    :func:`ptd.cost.memory.activation_bytes_per_layer`."""
    attention: AttentionKind = "flash"
    """``flash``: fused attention keeps no s x s scores (PyTorch SDPA); ``scores``: it does."""
    gqa_expanded: bool = False
    """K and V are expanded to the query heads before attention (stored at query width)."""
    dp_overlap: bool = True
    """Data-parallel gradient reduction overlaps backward (PyTorch DDP and FSDP do; Megatron-LM
    added it only in 2023, ``--overlap-grad-reduce``, NVIDIA/Megatron-LM#391)."""
    recompute_early_stop: bool = True
    """Full recompute stops before each block's last product (PyTorch's non-reentrant
    checkpoint); False re-runs the whole forward (Megatron-LM)."""
    fused_norm: bool | None = None
    """RMSNorm by a fused kernel that keeps only its input and statistics (GPUs: PyTorch's
    CUDA ``rms_norm``, apex, Megatron), or by PyTorch's composite ``rms_norm`` that also
    keeps the normalised input (the CPU). None: by the hardware's ``kind``."""
    tp_grad_per_linear: bool = True
    """Without sequence parallelism, each column-parallel layer's input gradient is
    all-reduced on its own (PyTorch DTensor: 5 per SwiGLU block backward); False: summed
    first, 2 per block (Megatron-LM)."""
    schedules: tuple[str, ...] = ("1f1b", "interleaved-1f1b", "zero-bubble", "gpipe")
    """Pipeline schedules the stack offers, for knobs left to the cost model to choose."""
    moe_imbalance: float = 1.0
    """Mixture-of-experts: the busiest expert-parallel rank's load over the mean (>= 1;
    ``ptd train`` measures ``moe_imbalance`` per step); see :mod:`ptd.cost.moe`."""
    zero3_gather: str = "unit"
    """ZeRO-3's parameter gathers: ``unit`` (one all-gather per block, prefetched one block
    ahead behind compute: PyTorch FSDP, ptd's runtime) or ``param-sync`` (one all-gather per
    parameter tensor, each waited for before the next, and again when full recompute re-runs
    the forward: DeepSpeed's ZeRO-3 of 2021, see :mod:`ptd.cost.stacks`)."""
    fsdp_copy_out: bool = True
    """ZeRO's gathers land in one buffer that is copied out into the parameters (PyTorch
    FSDP2's ``split_with_sizes_copy``: ptd's runtime, torchtitan), a memory-bound pass on the
    compute stream per gather; False where the parameters are views of the gathered buffer
    (Megatron-LM's distributed optimizer, DeepSpeed). See :func:`ptd.cost.dp.fsdp_copy_time`."""
    dp_overlap_model_parallel: bool = False
    """Whether zero-0 gradient reduction overlaps the backward when tp, pp, cp or ep > 1 too.
    ptd's runtime then reduces after the backward (``GradAllReduce``: DDP cannot hold
    DTensors and does not run a pipeline schedule's backward): False. Megatron-LM's
    ``--overlap-grad-reduce`` and DeepSpeed overlap there as well: True."""
    dp_overlap_pipeline: bool = True
    """Whether data-parallel gradient reduction overlaps the backward under pipeline
    parallelism. False for DeepSpeed's ``PipelineEngine``, whose schedule reduces the
    gradients as an instruction after the last micro-batch's backward
    (``deepspeed/runtime/pipe/schedule.py``, ``TrainSchedule``: ``ReduceTiedGrads``,
    ``ReduceGrads``, ``OptimizerStep`` at the end of the batch; 2021 and 2026 alike)."""
    elementwise: str = "autocast"
    """Memory-bound operators (:mod:`ptd.cost.eager`): ``fused``, the fewest passes (fused
    kernels: Megatron-LM, Transformer Engine); ``eager``, one pass per PyTorch operator in
    the compute dtype (torchtitan); ``autocast``, eager with fp32 weights under autocast,
    casts included (ptd's runtime with ZeRO-0; with ZeRO-1/2/3 it runs ``eager``:
    :func:`ptd.cost.eager.for_plan`)."""
    ps_servers: int = 0
    """0: data-parallel gradients by collectives; S > 0: pushed to and pulled from S
    synchronous parameter servers (:mod:`ptd.cost.ps`; ZeRO 0/1 only)."""
    selective: str = "attention"
    """What ``recompute="selective"`` repeats: ``attention`` (the attention core: Korthikanti
    et al. 2022, Megatron-LM, ptd's runtime), ``op`` or ``layer`` (torchtitan's policies); see
    :data:`ptd.cost.compute.SELECTIVE`."""


@dataclass(frozen=True)
class Estimate:
    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    flops: FlopsPerToken
    memory: MemoryBreakdown
    step: StepBreakdown
    tokens: float
    """Tokens the time-to-train is for."""
    chosen: dict[str, Any] = field(default_factory=dict)
    """Knobs :func:`choose` picked, with their values."""

    @property
    def n_devices(self) -> int:
        return self.plan.world_size

    @property
    def tokens_per_s(self) -> float:
        return metrics.throughput(self.plan.tokens_per_step, self.step.total)

    @property
    def samples_per_s(self) -> float:
        return metrics.throughput(self.plan.global_batch, self.step.total)

    @property
    def peak(self) -> float:
        return self.cluster.hardware.peak(self.plan.dtype)

    @property
    def mfu(self) -> float:
        return metrics.mfu(self.flops.model, self.tokens_per_s, self.peak, self.n_devices)

    @property
    def hfu(self) -> float:
        return metrics.hfu(self.flops.hardware, self.tokens_per_s, self.peak, self.n_devices)

    @property
    def time_to_train_s(self) -> float:
        return self.tokens / self.tokens_per_s

    @property
    def efficiency(self) -> float:
        """Compute share of the step (T_compute / T_total)."""
        return metrics.efficiency(self.step.compute, self.step.total)

    def to_json(self) -> dict[str, Any]:
        n = self.n_devices
        return {
            "model": self.model.name,
            "hardware": self.cluster.hardware.name,
            "gpus": n,
            "plan": self.plan.to_dict(),
            "chosen": self.chosen,
            "params": self.model.param_count(),
            "flops_per_token": {"model": self.flops.model, "hardware": self.flops.hardware},
            "memory_per_device_bytes": {k: v for k, v in self.memory.to_dict().items()},
            "memory_capacity_bytes": self.cluster.hardware.usable_memory,
            "fits": self.memory.fits,
            "step_time_s": self.step.to_dict(),
            "bound": self.step.largest,
            "bound_text": self.step.bound(),
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_device": self.tokens_per_s / n,
            "samples_per_s": self.samples_per_s,
            "tflops_per_device": {
                "model": self.flops.model * self.tokens_per_s / n / 1e12,
                "hardware": self.flops.hardware * self.tokens_per_s / n / 1e12,
            },
            "peak_tflops_per_device": self.peak / 1e12,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "efficiency": self.efficiency,
            "tokens": self.tokens,
            "time_to_train_s": self.time_to_train_s,
        }


def plan_memory(model: ModelSpec, plan: ParallelPlan, hardware: HardwareSpec,
                options: CostOptions) -> MemoryBreakdown:
    """:func:`ptd.cost.memory.memory` of ``plan`` on ``hardware`` under ``options`` (the
    one place the options map onto the memory count: estimate and the planner share it)."""
    return memory(model, plan, hardware.usable_memory, options.convention, options.attention,
                  options.gqa_expanded, fused_norm(options, hardware), autocast(options, plan),
                  options.selective, options.fused_swiglu, options.expert_tp,
                  options.sp_gathered)


def estimate(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
             tokens: float | None = None, options: CostOptions = CostOptions(),
             validate: bool = True) -> Estimate:
    """Price ``plan``. ``tokens`` (for the time to train) defaults to 20 per parameter, the
    compute-optimal budget of Hoffmann et al. 2022 (Chinchilla)."""
    if validate:
        plan.validate(model, cluster.n_devices)
    fl = flops_per_token(model, plan.seq_len, plan.recompute, options.recompute_early_stop,
                         options.selective)
    mem = plan_memory(model, plan, cluster.hardware, options)
    st = step_time(model, plan, cluster, options.attention, dp_overlap(options, plan),
                   options.recompute_early_stop, options.tp_grad_per_linear,
                   options.moe_imbalance, options.ps_servers, options.zero3_gather,
                   options.elementwise, options.fsdp_copy_out, options.selective,
                   options.expert_tp)
    d = float(tokens) if tokens else 20.0 * model.param_count()
    return Estimate(model, cluster, plan, fl, mem, st, d)


def dp_overlap(options: CostOptions, plan: ParallelPlan) -> bool:
    """``options.dp_overlap`` for this plan: off where the runtime reduces zero-0 gradients
    after the backward (``dp_overlap_model_parallel`` False and tp, pp, cp or ep > 1) or
    after the pipeline schedule (``dp_overlap_pipeline`` False and pp > 1)."""
    model_parallel = plan.tp > 1 or plan.pp > 1 or plan.cp > 1 or plan.ep > 1
    if plan.zero == 0 and model_parallel and not options.dp_overlap_model_parallel:
        return False
    if plan.pp > 1 and not options.dp_overlap_pipeline:
        return False
    return options.dp_overlap


def autocast(options: CostOptions, plan: ParallelPlan) -> bool:
    """Whether activations are those of fp32 weights under autocast (ptd's runtime, its
    byte convention, ZeRO-0 only: :func:`ptd.cost.eager.for_plan`): see
    :func:`ptd.cost.memory.activation_bytes_per_layer`."""
    return (EAGER.for_plan(options.elementwise, plan.zero) == "autocast"
            and options.convention == "ptd")


def fused_norm(options: CostOptions, hw: Any) -> bool:
    """Whether norms are fused kernels on this hardware (see ``CostOptions.fused_norm``)."""
    return options.fused_norm if options.fused_norm is not None else hw.kind != "cpu"


# ------------------------------------------------------------------- choosing
FREE_KNOBS = ("micro_batch", "zero", "recompute", "vpp", "schedule", "sp")


def divisors(n: int) -> list[int]:
    """Every divisor of ``n`` in increasing order, by trial division up to sqrt(n) (a global
    batch of 10^11 took minutes when every integer up to n was tried)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def zero_stages(dp: int, offload: bool) -> list[int]:
    """The ZeRO stages worth trying (estimate's free knob, the planner's search): at dp 1 there
    is nothing to shard -- every stage holds zero 0's states -- so only 0 (3 with offload,
    which needs it)."""
    if dp > 1:
        return [0, 1, 2, 3]
    return [3] if offload else [0]


def candidates(model: ModelSpec, base: ParallelPlan, free: Iterable[str],
               schedules: Iterable[str] = ("1f1b", "interleaved-1f1b", "zero-bubble", "gpipe"),
               auto_uneven: bool = False) -> Iterable[ParallelPlan]:
    """Every valid plan that differs from ``base`` only in the ``free`` knobs (a free
    schedule among ``schedules``). With ``auto_uneven`` each candidate splits its layers by
    cost exactly when they do not divide over its own stages (as ``ptd plan`` does), so a
    free vpp that divides them is not labelled uneven for the default's sake."""
    free = set(free)
    per_replica = base.global_batch // base.dp if base.global_batch % base.dp == 0 else 0
    mbs = divisors(per_replica) if "micro_batch" in free and per_replica else [base.micro_batch]
    zeros = zero_stages(base.dp, base.offload) if "zero" in free else [base.zero]
    rcs = ["none", "selective", "full"] if "recompute" in free else [base.recompute]
    sps = [False, True] if ("sp" in free and base.tp > 1) else [base.sp]
    if base.pp > 1:
        per_rank = model.n_layers // base.pp if model.n_layers % base.pp == 0 else 0
        vpps = divisors(per_rank) if "vpp" in free and per_rank else [base.vpp]
        scheds = list(schedules) if "schedule" in free else [base.schedule]
    else:
        vpps, scheds = [1], [base.schedule]
    for mb, z, rc, sp, vpp, sch in itertools.product(mbs, zeros, rcs, sps, vpps, scheds):
        if base.pp > 1:
            # keep only the schedule that uses this vpp (interleaved for vpp>1, ZB-V for 2)
            if vpp > 1 and sch in ("1f1b", "gpipe"):
                continue
            if vpp == 1 and sch == "interleaved-1f1b":
                continue
        p = base.replace(micro_batch=mb, zero=z, recompute=rc, sp=sp, vpp=vpp, schedule=sch)
        if auto_uneven and p.pp > 1:
            p = p.replace(uneven_stages=model.n_layers % p.n_stages != 0)
        try:
            p.validate(model)
        except PtdError:
            continue
        yield p


def stack_refuses(model: ModelSpec, plan: ParallelPlan, options: CostOptions) -> str | None:
    """Why the priced stack itself would not run ``plan``, or None. Megatron-LM (the stack
    with ``expert_tp``) refuses a mixture of experts under tp > 1 without sequence
    parallelism: its argument check asserts it for any MoE model ("When using MoE and
    tensor parallelism, sequence parallelism must be used", megatron/training/arguments.py
    of the 2024 releases), and Megatron-Core's ModelParallelConfig raised a ValueError for
    ep > 1 with tp > 1 (a warning by megatron-core 0.16)."""
    if options.expert_tp and model.is_moe and plan.tp > 1 and not plan.sp:
        return ("the megatron-core stack runs a mixture of experts with tp > 1 only under "
                "sequence parallelism (--sp)")
    return None


def choose(model: ModelSpec, cluster: ClusterSpec, base: ParallelPlan, free: Iterable[str],
           tokens: float | None = None, options: CostOptions = CostOptions(),
           refuse: Any = None, auto_uneven: bool = False) -> Estimate:
    """The fastest plan that fits among :func:`candidates`; if none fits, the one needing
    the least memory (its ``fits`` is False). ``refuse(plan)``, if given, returns why a
    candidate is dropped, or None (``ptd estimate`` passes the runtime's rules, so that it
    picks a plan ptd trains). ``auto_uneven``: see :func:`candidates`."""
    refused: str | None = None
    free = [k for k in FREE_KNOBS if k in set(free)]
    best: Estimate | None = None
    smallest: Estimate | None = None
    stack_no: str | None = None
    for p in candidates(model, base, free, options.schedules, auto_uneven):
        no = stack_refuses(model, p, options)
        if no:
            stack_no = stack_no or no
            continue
        why = refuse(p) if refuse is not None else None
        if why:
            refused = refused or why
            continue
        e = estimate(model, cluster, p, tokens, options, validate=False)
        if e.memory.fits:
            if best is None or (e.step.total, e.memory.total) < (best.step.total, best.memory.total):
                best = e
        elif smallest is None or e.memory.total < smallest.memory.total:
            smallest = e
    pick = best or smallest
    if pick is None:
        base.validate(model, cluster.n_devices)  # raises the reason
        if stack_no and refused:
            raise PtdError(f"{stack_no}; with it ptd train refuses the plan ({refused})")
        if stack_no:
            raise PtdError(stack_no)
        if refused:
            raise PtdError(f"ptd train refuses it: {refused}")
        raise PtdError("no valid plan with these settings")
    chosen = {k: getattr(pick.plan, k) for k in free}
    return Estimate(pick.model, pick.cluster, pick.plan, pick.flops, pick.memory, pick.step,
                    pick.tokens, chosen)


def default_global_batch(seq_len: int, dp: int, tokens: int = 2**22) -> int:
    """About 4M tokens per step (Llama 2's batch), rounded up to a multiple of dp."""
    seqs = max(1, round(tokens / seq_len))
    return max(dp, math.ceil(seqs / dp) * dp)

"""Memory per device: model states, activations, buffers.

**Model states** (Rajbhandari et al. 2020, ZeRO, arXiv 1910.02054). Two byte conventions:

* ``"ptd"`` (default; what ptd's runtime allocates): parameters and gradients are fp32
  tensors whatever the compute dtype (bf16 compute copies are transient, counted in
  buffers), Adam keeps two fp32 moments: 4 + 4 + 8 bytes per parameter.
* ``"zero"`` (the ZeRO paper's mixed-precision Adam): fp16 parameters and gradients and
  K = 12 bytes of optimizer state (fp32 master copy, momentum, variance): 2 + 2 + 12. In
  fp32 training both conventions are 4 + 4 + 8.
* ``"megatron"`` (Megatron-LM's mixed precision, the ``megatron-core`` stack): 16-bit
  parameters, fp32 gradients (its ``main_grad`` buffer: bf16 training accumulates and
  reduces gradients in fp32 by default) and 12 bytes of fp32 optimizer state: 18 bytes per
  parameter, or ``6 + 12/d`` with the distributed optimizer (ZeRO-1 here), whose ``d`` is
  the data-parallel group *with* context parallelism, ``dp x cp`` (Megatron-LM
  docs/source/distrib_optimizer.md, "bf16 param, fp32 grads: 18 / 6 + 12/d"; the
  optimizer's group is ``get_data_parallel_group(with_context_parallel=True)``). ZeRO-2/3,
  which the distributed optimizer does not do, are filed as under ``"zero"``.

Stage 1 shards optimizer states over ``dp``, stage 2 also gradients, stage 3 also
parameters. ptd runs all three with FSDP2 (:mod:`ptd.runtime.parallel.fsdp`), which shards
every tensor's dim 0 evenly (``torch.chunk`` rows; counts exact per rank, see
:mod:`ptd.cost.params`); the stages differ in what is held *unsharded* during a step, and
the two conventions file that differently:

* ``"zero"`` (the paper's ``P_os`` / ``P_os+g`` / ``P_os+g+p``): stage 1 holds the 16-bit
  parameters and gradients in full and ``K`` bytes per parameter over ``dp``; stage 2 the
  16-bit parameters in full and ``(2 + K)`` bytes over ``dp``; stage 3 all over ``dp``. The
  gathered parameters of stages 1/2 *are* the paper's full 16-bit parameters (FSDP keeps
  every block gathered from its forward until its backward), and the fp32 shard is part of K.
* ``"ptd"`` (the tensors a rank keeps from one step to the next, what the runtime's
  measurement counts): under every stage the fp32 shards of parameters, gradients and the
  two moments, 16 bytes per parameter over ``dp``. What stages 1 and 2 hold unsharded
  during the step is in **buffers**: the gathered parameters (compute dtype, every local
  parameter) and, under stage 1 with gradient accumulation (or any stage under a pipeline
  schedule, which defers FSDP's reduction to its last backward), the unsharded fp32
  gradients, else those of one FSDP unit (``k`` blocks of at least 25 MiB, or the root's).

**Activations** generalise Korthikanti et al. 2022 (arXiv 2205.05198, section 4): the bytes
each block keeps for backward, tensor by tensor, with ``a_b`` bytes per activation element,
1-byte dropout masks, and ``t`` the tp degree::

    norm inputs            2 x a_b s b h           (/t with sequence parallel)
    QKV input              a_b s b h               (/t with sequence parallel)
    Q, K, V                a_b s b (q + 2 kv) / t  (K and V at query width if expanded)
    softmax output         a_b a s^2 b / t         (only if the s x s scores are stored)
    attention dropout      (1 + a_b) a s^2 b / t   (mask + output; stored scores, dropout>0)
    attention-out input    a_b s b q / t
    MLP input              a_b s b h               (/t with sequence parallel)
    GELU MLP               2 a_b s b F / t         (GELU input, second matmul input)
    SwiGLU MLP             4 a_b s b F / t         (gate, SiLU(gate), up, product)
    dropout masks          2 s b h                 (if dropout; /t with sequence parallel)
    flash-attention stats  4 a s b / t             (fp32 log-sum-exp, when not storing scores)

For the paper's GPT block (16-bit, dropout, stored scores, F = 4h, LayerNorm) this is
``s b h (34 + 5 a s / h)`` without parallelism, ``s b h (10 + 24/t + 5 a s / h t)`` with tensor
parallelism, ``s b h / t (34 + 5 a s / h)`` with sequence parallelism too, and ``34 s b h / t``
with selective recompute (the s x s terms are recomputed); full recompute keeps only each
block's input, ``a_b s b h`` (/t with sequence parallelism). The tests check all four.

Micro-batches in flight per pipeline rank follow the schedule (Narayanan et al. 2021,
Korthikanti et al. 2022): GPipe keeps all ``m``; 1F1B keeps ``p - r`` on rank ``r``;
interleaved 1F1B keeps ``2(p - r - 1) + (v - 1) p + 1`` chunk-micro-batches; ZB-V keeps ``p``
micro-batches on every rank.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, Literal

from .context import kv_buffer_bytes
from ..specs.hardware import DTYPE_BYTES
from ..specs.model import ModelSpec
from ..specs.plan import ParallelPlan
from . import params as P
from .memo import memo
from .moe import expert_split

Convention = Literal["ptd", "zero", "megatron"]
AttentionKind = Literal["flash", "scores"]


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on the most loaded device."""

    params: float
    grads: float
    optimizer: float
    activations: float
    buffers: float
    capacity: float = 0.0
    """Device memory, bytes (0: unknown)."""

    @property
    def model_states(self) -> float:
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.buffers

    @property
    def fits(self) -> bool:
        return self.capacity <= 0 or self.total <= self.capacity

    @property
    def largest(self) -> str:
        parts = {k: getattr(self, k) for k in ("params", "grads", "optimizer", "activations", "buffers")}
        return max(parts, key=parts.get)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, float]:
        d = asdict(self)
        d.pop("capacity")
        d["total"] = self.total
        return d


# --------------------------------------------------------------- model states
def state_bytes_per_param(dtype: str, convention: Convention = "ptd") -> tuple[int, int, int]:
    """(parameter, gradient, optimizer) bytes per parameter for Adam."""
    if convention == "zero" and dtype in ("bf16", "fp16"):
        return 2, 2, 12
    if convention == "megatron" and dtype in ("bf16", "fp16"):
        return 2, 4, 12
    return 4, 4, 8


@dataclass(frozen=True)
class ModelStates:
    """Elements (not bytes) of parameters, gradients and optimizer-state owners on one rank."""

    params: int
    grads: int
    optimizer: int


def model_state_elements(model: ModelSpec, plan: ParallelPlan, pp_rank: int,
                         dp_rank: int, convention: Convention = "ptd",
                         expert_tp: bool = False) -> ModelStates:
    """Exact element counts on one rank (``tp`` ranks are alike up to replicated tensors,
    which every tp rank holds in full). See the module docstring for the conventions.
    ``expert_tp``: routed experts split over tp too (:mod:`ptd.cost.moe`)."""
    full = P.local_numel(model, plan, pp_rank, expert_tp)
    if plan.zero == 0:
        return ModelStates(full, full, full)
    if convention == "megatron" and plan.zero == 1:
        # the distributed optimizer's even split over dp x cp (its buffers are padded to
        # it); routed experts have buffers of their own, split over the dp x cp / ep ranks
        # that hold the same experts (Megatron-Core's expert data-parallel group)
        d = plan.dp * plan.cp
        experts = P.local_expert_numel(model, plan, pp_rank, expert_tp) if plan.ep > 1 else 0
        opt = -(-(full - experts) // d) + -(-experts // max(1, d // plan.ep))
        return ModelStates(full, full, opt)
    sharded = P.rank_fsdp_numel(model, plan, pp_rank, dp_rank)
    if expert_tp and plan.tp > 1 and model.is_moe:
        # ptd's shards hold whole experts on every tp rank; split over tp they hold 1/tp
        whole = P.local_expert_numel(model, plan, pp_rank)
        sharded -= (whole - P.local_expert_numel(model, plan, pp_rank, True)) // max(
            1, plan.dp // plan.ep)
    if plan.zero >= 3 or convention == "ptd":
        return ModelStates(sharded, sharded, sharded)
    return ModelStates(full, full if plan.zero == 1 else sharded, sharded)  # P_os, P_os+g


@memo
def _max_state_elements(model: ModelSpec, key: tuple) -> ModelStates:
    """Element counts of the rank with the most model-state bytes. ``key``: the layout
    (:func:`ptd.cost.params.layout_plan`), tp, dp, ZeRO stage, ep and convention -- all
    they depend on."""
    layout, tp, dp, zero, ep, convention, cp, expert_tp = key
    plan = P.layout_plan(layout, tp=tp, dp=dp, zero=zero, ep=ep).replace(cp=cp)
    best, best_key = ModelStates(0, 0, 0), -1.0
    seen = set()
    for r in range(plan.pp):
        sig = P.rank_signature(model, plan, r)
        if sig in seen:  # holds the same tensors as an earlier rank, which won any tie
            continue
        seen.add(sig)
        e = model_state_elements(model, plan, r, 0, convention, expert_tp)  # torch.chunk: rank 0 the most
        k = e.params + e.grads + 2.0 * e.optimizer
        if k > best_key:
            best, best_key = e, k
    return best


def model_state_bytes(model: ModelSpec, plan: ParallelPlan, convention: Convention = "ptd",
                      pp_rank: int | None = None, dp_rank: int | None = None,
                      expert_tp: bool = False) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes on the most loaded rank, or on the given one."""
    pb, gb, ob = state_bytes_per_param(plan.dtype, convention)
    worst = pp_rank is None or dp_rank is None
    expert_tp = expert_tp and plan.tp > 1 and model.is_moe
    if worst:
        e = _max_state_elements(model, (P.layout_key(plan), plan.tp, plan.dp, plan.zero, plan.ep,
                                        convention, plan.cp if convention == "megatron" else 1,
                                        expert_tp))
    else:
        e = model_state_elements(model, plan, pp_rank, dp_rank, convention,  # type: ignore[arg-type]
                                 expert_tp)
    return e.params * pb, e.grads * gb, e.optimizer * ob


def zero_paper_model_states(n_params: float, dp: int, stage: int, k: int = 12) -> float:
    """ZeRO paper Fig. 1 per-device model states for ``n_params`` (Psi) parameters:
    baseline (2 + 2 + K) Psi; stage 1 4 Psi + K Psi / Nd; stage 2 2 Psi + (2 + K) Psi / Nd;
    stage 3 (2 + 2 + K) Psi / Nd."""
    psi = n_params
    if stage == 0:
        return (4 + k) * psi
    if stage == 1:
        return 4 * psi + k * psi / dp
    if stage == 2:
        return 2 * psi + (2 + k) * psi / dp
    return (4 + k) * psi / dp


# ----------------------------------------------------------------- activations
def activation_bytes_per_layer(model: ModelSpec, seq_len: int, micro_batch: int, tp: int = 1,
                               sp: bool = False, recompute: str = "none", act_bytes: int = 2,
                               attention: AttentionKind = "flash", gqa_expanded: bool = False,
                               dropout: bool | None = None, fused_norm: bool = True,
                               autocast: bool = False, selective: str = "attention",
                               fused_swiglu: bool = False, expert_tp: bool = False,
                               sp_gathered: bool = False) -> float:
    """Bytes one block keeps for its backward, for one micro-batch (see module docstring).
    ``fused_norm=False``: RMSNorm runs as PyTorch's composite ``rms_norm`` (what the CPU
    runs), which keeps the normalised input ``x * rsqrt(mean(x^2) + eps)`` for the weight's
    gradient beside the norm's input: one more ``s b h`` per norm, and both in fp32 whatever
    the input's dtype (torch 2.13 upcasts a 16-bit input and keeps the upcast, not the
    input: ``tests/test_fsdp_mixed_precision_saves.py``).
    ``autocast``: fp32 weights under ``torch.autocast`` in a 16-bit ``act_bytes`` (ptd's
    runtime): the residual stream and the norms stay fp32 (4 bytes), and each linear layer
    keeps its own cast copy of its input (q, k and v three, the MLP's gate and up two), where
    a 16-bit model shares one per projection group (counted with saved-tensor hooks in
    tests/test_cost_vs_runtime.py). ``selective``: what selective recompute repeats
    (:data:`ptd.cost.compute.SELECTIVE`); ``layer`` keeps half of each block's bytes with
    and without full recompute, ``op`` the block's input, the kept products' outputs and
    the fused attention's output and log-sum-exp. ``fused_swiglu``: SwiGLU by one kernel that
    keeps only its input (gate and up) and recomputes the rest in backward (Megatron-Core's
    ``bias_swiglu_impl``, on by default: ``--no-bias-swiglu-fusion`` turns it off), so with
    the second product's input 3 F a token instead of eager PyTorch's 4 (in routed experts
    too). ``expert_tp``: routed experts split over tp (:func:`moe_bytes_per_token`).
    ``sp_gathered``: under sequence parallelism the column-parallel layers keep the
    all-gathered, whole-sequence input for their weight gradient (PyTorch's DTensor plan,
    ``SequenceParallel`` then ``PrepareModuleInput`` to ``Replicate`` before
    ``ColwiseParallel``: the gather's output is what the linear saves; ptd's runtime and
    torchtitan), where Megatron-LM keeps the sequence shard and gathers it again in backward
    (``LinearWithGradAccumulationAndAsyncCommunication`` saves its sharded ``input``;
    Korthikanti et al. 2022, section 4.2.2): ``tp`` times the bytes of those inputs."""
    kw = dict(attention=attention, gqa_expanded=gqa_expanded, dropout=dropout,
              fused_norm=fused_norm, autocast=autocast, fused_swiglu=fused_swiglu,
              expert_tp=expert_tp, sp_gathered=sp_gathered)
    if recompute == "selective" and selective == "layer":
        return 0.5 * sum(activation_bytes_per_layer(model, seq_len, micro_batch, tp, sp, rc,
                                                    act_bytes, **kw) for rc in ("none", "full"))
    if recompute == "selective" and selective == "op":
        return _op_policy_bytes(model, seq_len, micro_batch, tp, sp, act_bytes, autocast,
                                attention == "scores")
    s, b, h, a, t = seq_len, micro_batch, model.hidden, model.n_heads, tp
    q = model.q_dim
    kv = q if gqa_expanded else model.kv_dim
    # the MLP split over tp: the dense one, or a MoE layer's shared experts
    f = model.ffn_hidden * (model.n_shared_experts if model.is_moe else 1)
    drop = model.dropout > 0 if dropout is None else dropout
    sbh = s * b * h
    seq_div = t if sp else 1  # the replicated (non-tensor-parallel) regions
    ab = act_bytes
    cast = autocast and ab < 4
    nb = 4 if cast else ab  # the stream and the norms
    if recompute == "full":
        return nb * sbh / seq_div
    # a composite RMSNorm (torch's rms_norm on a CPU) computes in fp32 whatever its input's
    # dtype: from a 16-bit stream it keeps the fp32 upcast of its input, not the input
    composite = not fused_norm and model.norm == "rmsnorm"
    nn_ = 4 if composite else nb
    total = 0.0
    total += 2 * nn_ * sbh / seq_div                      # two norm inputs
    inputs = 3 + (2 if model.mlp == "swiglu" else 1) if cast else 2
    in_div = 1 if sp_gathered else seq_div  # (DTensor keeps the gathered sequence)
    total += inputs * ab * sbh / in_div                   # QKV input, MLP input (or each cast)
    if composite:
        total += 2 * nn_ * sbh / seq_div                  # composite RMSNorm: x * rstd, twice
    total += ab * s * b * (q + 2 * kv) / t                # Q, K, V
    total += ab * s * b * q / t                           # attention-output input
    total += (2 if model.mlp == "gelu" else 3 if fused_swiglu else 4) * ab * s * b * f / t
    if drop:
        total += 2 * sbh / seq_div                        # residual-dropout masks
    if attention == "scores":
        if recompute != "selective":
            total += ab * a * s * s * b / t               # softmax output
            if drop:
                total += (1 + ab) * a * s * s * b / t     # dropout mask + output
    else:
        total += 4 * a * s * b / t                        # fp32 log-sum-exp
    if model.is_moe:
        # and per micro-batch the assignment shares (fp32) and each grouped product's group
        # offsets (int32), E each
        total += s * b * moe_bytes_per_token(model, ab, fused_swiglu, expert_split(t, expert_tp)) \
            + 4 * model.n_experts * (
            1 + (3 if model.mlp == "swiglu" else 2))
    return total


def _op_policy_bytes(model: ModelSpec, seq_len: int, micro_batch: int, tp: int, sp: bool,
                     act_bytes: int, autocast: bool, scores: bool) -> float:
    """Bytes a block keeps under torchtitan's ``op`` policy: its input (the residual stream),
    the outputs of the products it keeps (q, v, the MLP's first input product and its down
    projection for a bias-free block: the first, third, ... in forward order; none with
    biases), and the fused attention's output and fp32 log-sum-exp. Column-parallel outputs
    are split over tp; the down projection's output is the whole partial sum on each rank.
    A dense MLP stands for a MoE block's (its routed products are not counted here)."""
    s, b, h, t = seq_len, micro_batch, model.hidden, tp
    ab = act_bytes
    nb = 4 if autocast and ab < 4 else ab
    seq_div = t if sp else 1
    f = model.ffn_hidden
    outs = [model.q_dim / t, model.kv_dim / t, model.kv_dim / t, h,
            *([f / t] * (2 if model.mlp == "swiglu" else 1)), h]
    kept = 0.0 if model.bias else sum(outs[0::2])
    total = nb * s * b * h / seq_div + ab * s * b * kept
    total += ab * s * b * model.q_dim / t + 4 * model.n_heads * s * b / t
    if scores:  # an unfused attention keeps its scores' softmax for the backward
        total += ab * model.n_heads * s * s * b / t
    return total


def moe_bytes_per_token(model: ModelSpec, act_bytes: int, fused_swiglu: bool = False,
                        split: int = 1) -> float:
    """What a MoE layer keeps per token beyond its shared experts (ptd.runtime.model.moe,
    counted tensor by tensor with saved-tensor hooks in tests/test_cost_vs_runtime.py). Per
    assignment (``top_k`` per token), whole on every tp rank (routed experts are not split
    over tp): the gathered input and the experts' output before and after weighting (3h),
    the products' intermediates (SwiGLU: w1 and w3 outputs, SiLU, their product, 4F; GELU:
    2F), its routing weight, and three int64 indices (expert, sort order, token) plus the
    fp32 top-k weight. Per token: the router logits and their softmax in fp32 (2 x 4E) and
    the z-loss's log-sum-exp (4). ``fused_swiglu``: SwiGLU keeps 3F (see
    :func:`activation_bytes_per_layer`). ``split``: each expert split that many ways over tp
    (expert tensor parallelism, :mod:`ptd.cost.moe`): every tp rank still holds all the
    assignments, gathered over tp, with ``F / split`` of their intermediates; the rest is
    counted as above, an approximation of Megatron-Core's dispatcher, whose buffers are
    not ptd's runtime's."""
    h, f, ab = model.hidden, model.ffn_hidden / split, act_bytes
    per_f = 2 if model.mlp == "gelu" else 3 if fused_swiglu else 4
    per_assignment = (3 * h + per_f * f + 1) * ab + 3 * 8 + 4
    return model.top_k * per_assignment + 8 * model.n_experts + 4


def output_activation_bytes(model: ModelSpec, seq_len: int, micro_batch: int, tp: int = 1,
                            sp: bool = False, act_bytes: int = 2, fused_norm: bool = True,
                            autocast: bool = False, sp_gathered: bool = False) -> float:
    """What the final norm, output layer and cross-entropy keep: the norm input and output
    layer input (``a_b s b h`` each, /t with sp -- the output layer's whole under
    ``sp_gathered``, :func:`activation_bytes_per_layer`; a composite RMSNorm also its
    normalised input, both fp32 whatever the input's dtype; under ``autocast`` the norm's
    tensors fp32) and the fp32
    log-probabilities (``4 s b V / t``, V padded) that the loss's backward needs."""
    sbh = seq_len * micro_batch * model.hidden
    composite = not fused_norm and model.norm == "rmsnorm"
    nb = 4 if ((autocast and act_bytes < 4) or composite) else act_bytes  # (composite: fp32)
    norm = 2 if composite else 1
    seq_div = tp if sp else 1
    return (norm * nb * sbh / seq_div + act_bytes * sbh / (1 if sp_gathered else seq_div)
            + 4 * seq_len * micro_batch * model.padded_vocab(tp) / tp)


def output_transient_bytes(model: ModelSpec, seq_len: int, micro_batch: int, tp: int = 1) -> float:
    """Working memory of the loss at its peak: NLL's backward writes the dense gradient of
    the log-probabilities, and log-softmax's backward allocates the logits' gradient while
    that one is still alive (fp32, ``4 s b V / t`` each)."""
    return 2 * 4 * seq_len * micro_batch * model.padded_vocab(tp) / tp


def in_flight(plan: ParallelPlan, pp_rank: int) -> float:
    """Micro-batches whose activations a pipeline rank holds at its peak, in units of "one
    micro-batch through all of the rank's layers"."""
    return _in_flight(plan.pp, plan.n_microbatches, plan.stages_per_rank, plan.schedule, pp_rank)


def _in_flight(p: int, m: int, v: int, schedule: str, pp_rank: int) -> float:
    if p == 1:
        return 1.0
    if schedule == "gpipe":
        return float(m)
    if schedule == "1f1b":
        return float(min(m, p - pp_rank))
    if schedule == "zero-bubble" and v == 2:
        return float(min(m, p))
    # interleaved 1F1B (and interleaved zero-bubble): chunk-micro-batches / chunks per rank
    chunks = min(m * v, 2 * (p - pp_rank - 1) + (v - 1) * p + 1)
    return chunks / v


@memo
def _held_layers(model: ModelSpec, layout: tuple, m: int, v: int, schedule: str
                 ) -> tuple[tuple[float, ...], float | None]:
    """Per pipeline rank, micro-batches in flight times blocks held (what multiplies one
    block's activation bytes), and the largest of these over the ranks that hold neither the
    embeddings nor the output layer (None if there are none)."""
    p = layout[0]
    layers = P.layout_layers(model, layout)
    first, last = P.ends_of(layout)
    held = tuple(_in_flight(p, m, v, schedule, r) * layers[r] for r in range(p))
    plain = [h for r, h in enumerate(held) if r != first and r != last]
    return held, (max(plain) if plain else None)


def activation_bytes(model: ModelSpec, plan: ParallelPlan, attention: AttentionKind = "flash",
                     gqa_expanded: bool = False, pp_rank: int | None = None,
                     fused_norm: bool = True, autocast: bool = False,
                     selective: str = "attention", fused_swiglu: bool = False,
                     expert_tp: bool = False, sp_gathered: bool = False) -> float:
    """Peak activation bytes on the most loaded pipeline rank (or the given one);
    ``autocast``, ``fused_swiglu``, ``expert_tp``, ``sp_gathered``: see
    :func:`activation_bytes_per_layer`."""
    ab = DTYPE_BYTES[plan.dtype]
    per_layer = activation_bytes_per_layer(model, plan.seq_len, plan.micro_batch, plan.tp,
                                           plan.sp, plan.recompute, ab, attention, gqa_expanded,
                                           fused_norm=fused_norm, autocast=autocast,
                                           selective=selective, fused_swiglu=fused_swiglu,
                                           expert_tp=expert_tp, sp_gathered=sp_gathered)
    out_keep = output_activation_bytes(model, plan.seq_len, plan.micro_batch, plan.tp, plan.sp, ab,
                                       fused_norm, autocast, sp_gathered)
    out_work = output_transient_bytes(model, plan.seq_len, plan.micro_batch, plan.tp)
    # the embedding's dropout mask: a sequence shard under sp, except with learned positions,
    # whose embedding the runtime keeps whole over tp (runtime/parallel/tp.py) until block 0
    emb_shard = plan.tp if plan.sp and model.position != "learned" else 1
    emb = ab * plan.seq_len * plan.micro_batch * model.hidden / emb_shard
    layout = P.layout_key(plan)
    first, last = P.ends_of(layout)
    m, v = plan.n_microbatches, plan.stages_per_rank
    held, plain = _held_layers(model, layout, m, v, plan.schedule)
    best = 0.0
    if pp_rank is None:
        # every other rank differs only in what it holds; per_layer > 0 keeps the order
        if plain is not None:
            best = plain * per_layer
        ranks: Iterable[int] = (first,) if first == last else (first, last)
    else:
        ranks = (pp_rank,)
    for r in ranks:
        k = _in_flight(plan.pp, m, v, plan.schedule, r)
        total = held[r] * per_layer
        if r == first:
            total += k * emb if model.dropout > 0 else 0.0
        if r == last:
            # the last stage runs each micro-batch's backward right after its forward
            # (except GPipe, which keeps all of them)
            n_out = m if (plan.pp > 1 and plan.schedule == "gpipe") else 1
            total += n_out * out_keep + out_work
        best = max(best, total)
    return best


# --------------------------------------------------------------------- buffers
def buffer_bytes(model: ModelSpec, plan: ParallelPlan, pp_rank: int = 0,
                 convention: Convention = "ptd", expert_tp: bool = False) -> float:
    """Transient and communication buffers on the most loaded rank.

    * bf16/fp16 compute copies of the local parameters (autocast's weight cache under DDP,
      kept alive by backward): ``2 x`` local parameters -- under the ``"zero"`` and
      ``"megatron"`` conventions the parameters already are that 16-bit copy (2 bytes each
      in model states), so it is not counted again;
    * ZeRO-3: two gathered blocks (the one computing and the one prefetched) in the
      compute dtype, plus one block's unsharded fp32 gradient before reduce-scatter;
    * ZeRO-1/2 (FSDP without resharding after forward): under the ``"ptd"`` convention
      every local parameter gathered in the compute dtype (held from each block's forward
      to its backward; under ``"zero"`` these are the model states' parameters); then the
      unsharded fp32 gradients of every local parameter where the reduction waits for the
      last micro-step -- ZeRO-1 with gradient accumulation, either stage under a pipeline
      schedule -- (counted in the ``"zero"`` convention's ZeRO-1 gradients already), else
      the largest FSDP unit's before its reduce-scatter (:func:`zero12_largest_unit`);
    * pipeline: one activation send and one receive buffer per neighbour;
    * DDP buckets are views of the gradients (``gradient_as_bucket_view``): no extra copy.
    """
    ab = DTYPE_BYTES[plan.dtype]
    local = P.max_local_numel(model, plan, expert_tp)
    # (with its experts, E / ep of them; split over tp under expert_tp, :mod:`ptd.cost.moe`)
    block = P.local_block_numel(model, plan.tp, plan.ep, expert_tp)
    total = 0.0
    if plan.zero == 3:
        total += 2 * block * ab + block * 4
    elif plan.zero in (1, 2):
        if convention == "ptd":
            total += local * ab
        if not (convention != "ptd" and plan.zero == 1):  # (there: in the gradients)
            total += 4 * (local if zero12_full_grads(plan) else zero12_largest_unit(model, plan))
    elif ab < 4 and convention == "ptd":
        total += local * ab
    if plan.pp > 1:
        act = ab * plan.seq_len * plan.micro_batch * model.hidden / (plan.tp if plan.sp else 1)
        total += 4 * act
    return total


def autocast_weight_copies(model: ModelSpec, plan: ParallelPlan, pp_rank: int) -> int:
    """Elements of the 16-bit weight copies ``torch.autocast`` makes in one forward on pipeline
    rank ``pp_rank`` under ZeRO-0 (ptd's runtime): every matrix a product reads -- the
    blocks', this rank's ``E / ep`` routed experts (cast by hand,
    ``runtime.model.moe.GroupedExperts``), the output layer's, and the token embedding where
    the output product reads it (tied, one stage) -- but no embedding lookup and no vector.
    Made in the forward and held by the backward, so they lie under the measured activation
    peak; :func:`buffer_bytes` counts them (more roughly, every parameter) among buffers."""
    first, last = P.ends_of(P.layout_key(plan))
    tied_here = model.tied_embeddings and first == last == pp_rank
    n = 0
    for p in P.rank_params(model, plan, pp_rank):
        if len(p.shape) < 2 or ("embeddings" in p.name and not (tied_here and p.name.startswith("tok"))):
            continue
        k = math.prod(p.local_shape(plan.tp, plan.tp_mode))
        n += k // plan.ep if P.is_routed_expert(p) else k
    return n


def zero12_largest_unit(model: ModelSpec, plan: ParallelPlan) -> int:
    """Parameters of the largest ZeRO-1/2 FSDP unit without a pipeline (pp = 1): ``k``
    blocks, or the root's (the ``n_layers % k`` blocks left, embeddings, norm, output), or
    under ep > 1 one layer's ``E / ep`` routed experts (a unit of their own; the blocks'
    units then hold the rest of each block)."""
    block = P.unit_block_numel(model, plan.tp, plan.ep)
    k, nl = P.zero12_unit_blocks(model, plan.tp, plan.ep), model.n_layers
    experts = (P.local_block_numel(model, plan.tp, plan.ep) - block) if plan.ep > 1 else 0
    root = P.local_numel(model, plan, 0) - (nl // k) * k * block - nl * experts
    return max(k * block if nl >= k else 0, root, experts)


def zero12_full_grads(plan: ParallelPlan) -> bool:
    """Whether ZeRO-1/2 hold every local gradient unsharded until the step's last backward:
    ZeRO-1 with gradient accumulation (its reduction is deferred to the last micro-step), and
    both under a pipeline schedule (torch's schedules defer FSDP's reduction to the end)."""
    return plan.pp > 1 or (plan.zero == 1 and plan.n_microbatches > 1)


def memory(model: ModelSpec, plan: ParallelPlan, capacity: float = 0.0,
           convention: Convention = "ptd", attention: AttentionKind = "flash",
           gqa_expanded: bool = False, fused_norm: bool = True,
           autocast: bool = False, selective: str = "attention",
           fused_swiglu: bool = False, expert_tp: bool = False,
           sp_gathered: bool = False) -> MemoryBreakdown:
    """Memory on the most loaded device; ``autocast``: fp32 weights under autocast keep
    fp32 norm tensors and a cast input per linear layer (:func:`activation_bytes_per_layer`);
    ``expert_tp``: routed experts split over tp (:mod:`ptd.cost.moe`); ``sp_gathered``: the
    column-parallel inputs kept whole under sequence parallelism (ibid.)."""
    p, g, o = model_state_bytes(model, plan, convention, expert_tp=expert_tp)
    if plan.offload:
        # FSDP CPU offload keeps sharded parameters, gradients and optimizer states in host
        # memory; the device holds only what is gathered for compute (buffers).
        p = g = o = 0.0
    act = activation_bytes(model, plan, attention, gqa_expanded, fused_norm=fused_norm,
                           autocast=autocast, selective=selective,
                           fused_swiglu=fused_swiglu, expert_tp=expert_tp,
                           sp_gathered=sp_gathered) / plan.cp
    return MemoryBreakdown(params=p, grads=g, optimizer=o, activations=act,
                           buffers=buffer_bytes(model, plan, convention=convention,
                                                expert_tp=expert_tp)
                           + kv_buffer_bytes(model, plan),
                           capacity=capacity)

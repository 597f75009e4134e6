"""Compute time of one micro-batch through one block, the output layer and the optimizer.

Three costs, each physical and each from a hardware field:

* **matrix products**, each priced by the roofline (Williams, Waterman and Patterson 2009):
  ``max(2mnk / R, a_b (mk + kn + mn) / BW)``, ``R`` the achievable matmul rate of the device
  while its node's other workers run, ``BW`` the achievable memory bandwidth. Backward runs
  two products per forward product (input and weight gradients). Causal attention kernels
  skip the masked half of the ``s x s`` work, so its *time* uses half the FLOPs that the
  FLOP convention (:mod:`ptd.cost.flops`) counts; the fused (flash) backward recomputes
  the scores, 2.5 products per forward product (Dao et al. 2022), and the fused kernel runs
  at ``hardware.attention_efficiency`` of the GEMM rate (FlashAttention-2/3 papers).
* **memory-bound operators** (norms, rotary embedding, activations, residual adds, layout
  copies): bytes read and written over ``BW``; backward moves about twice the forward's.
* **per-operator overhead**: launch and dispatch cost per operator, ``hardware.op_overhead``
  (0 on GPUs, where asynchronous launches hide behind large kernels; measured on CPUs, where
  it is real time). Operator counts are those of ptd's runtime block, checked by a test.

Attention comes in two kinds, as in :mod:`ptd.cost.memory`: ``flash`` (PyTorch's fused
SDPA, what ptd's runtime uses: causal tiles skipped, no ``s x s`` tensor in memory) and
``scores`` (the unfused path of older frameworks such as Megatron-LM in 2021: the full
``s x s`` products are computed, and the scores are written, read by the softmax, and by
dropout when enabled -- memory traffic of ``a s^2 b`` elements per pass).
"""

from __future__ import annotations

import math
from functools import lru_cache
from dataclasses import dataclass

from . import eager as EAGER
from .moe import expert_split
from ..specs.hardware import DTYPE_BYTES, HardwareSpec
from ..specs.model import ModelSpec

# Operators ptd's runtime dispatches, counted with a TorchDispatchMode on the runtime model
# (``ptd.runtime.measure.opcount``; ``tests/test_cost_vs_runtime.py`` checks every variant
# below against it). Views and metadata-only ops are included: on a CPU their dispatch is
# what they cost. One block, by architectural feature (torch 2.13, CPU):
OPS_BLOCK_BASE = (39, 76)
"""(forward, backward) of a GELU block with LayerNorm, learned positions, no biases."""
OPS_SWIGLU = (5, 12)       # gate product and SiLU instead of GELU
OPS_ROPE = (24, 14)        # slicing the tables, rotate-half, two products and a sum, on q and k
OPS_RMSNORM = (12, 30)     # F.rms_norm is composite on CPU: pow, mean, add, rsqrt, mul, mul
OPS_BIAS_BWD_PER_LINEAR = 3  # a biased linear's backward adds its bias-gradient sum
OPS_DROPOUT = (43, 30)     # residual dropouts, and SDPA's math path for attention dropout
OPS_MOE = {"gelu": (45, 41), "swiglu": (44, 37)}
"""A routed mixture-of-experts MLP in place of the dense one (ptd.runtime.model.moe): router
product, softmax, top-k, the load-balancing and z-loss statistics, the stable sort by
expert, the gather of the tokens, grouped products, weighting and the ``index_add`` back.
The count does not depend on the number of experts, ``top_k`` or the tokens: one grouped
product per weight matrix, whatever the groups."""
OPS_MOE_BIAS_FWD_PER_MATRIX = 3   # a routed expert matrix's bias: repeat per group, add
OPS_MOE_SHARED = {"gelu": (6, 16), "swiglu": (9, 26)}  # per shared expert (a dense MLP on all tokens)
OPS_MOE_CAPACITY = (12, 0)        # ranking assignments within their expert, the keep mask
OPS_MLP_GELU = (9, 20)
"""The GELU MLP's share of ``OPS_BLOCK_BASE`` (two products, the activation): what a MoE
layer's counts (``OPS_MOE*``) build on, and what a measured MoE layer replaces."""
OPS_OUTPUT_BASE = (10, 18)
"""Final LayerNorm, output layer and fp32 cross-entropy (forward, backward)."""
# Operators on DTensors with tensor parallelism (counted by ptd.runtime.measure.opcount on a
# one-rank tp mesh; each costs ``overheads_measured["dtensor_op"]`` beyond a plain operator:
# sharding propagation and wrapping in Python). Per linear layer: forward (input from_local,
# view, t, mm/addmm, output to_local) and backward; sequence parallelism adds the norms on
# DTensors and the input layouts of attention and MLP.
OPS_TP_LINEAR = (4, 9)
OPS_TP_BIAS_BWD = 3
OPS_TP_SP_BLOCK = (14, 39)
OPS_TP_OUTPUT = (8, 14)
OPS_TP_SP_OUTPUT = (15, 32)
OPS_OPTIMIZER_PER_TENSOR = 16
"""Per parameter tensor: gradient-norm (pow, sum, add), clipping (mul), single-tensor AdamW (12)."""


def block_ops(model: ModelSpec) -> tuple[int, int]:
    """(forward, backward) operators of one block of ptd's runtime model."""
    f, b = OPS_BLOCK_BASE
    linears = 4 + (3 if model.mlp == "swiglu" else 2)
    for on, (df, db) in ((model.mlp == "swiglu", OPS_SWIGLU), (model.position == "rope", OPS_ROPE),
                         (model.norm == "rmsnorm", OPS_RMSNORM), (model.dropout > 0, OPS_DROPOUT)):
        if on:
            f, b = f + df, b + db
    if model.bias:
        b += OPS_BIAS_BWD_PER_LINEAR * linears
    if model.is_moe:
        f, b = _moe_ops(model, f, b)
    return f, b


def _moe_ops(model: ModelSpec, f: int, b: int) -> tuple[int, int]:
    """``(f, b)`` of the dense block plus what a MoE layer adds (``OPS_MOE*``)."""
    matrices = 3 if model.mlp == "swiglu" else 2
    df, db = OPS_MOE[model.mlp]
    f, b = f + df, b + db
    if model.bias:
        f += OPS_MOE_BIAS_FWD_PER_MATRIX * matrices
    sf, sb = OPS_MOE_SHARED[model.mlp]
    shared_bias = OPS_BIAS_BWD_PER_LINEAR * matrices if model.bias else 0
    f += model.n_shared_experts * sf
    b += model.n_shared_experts * (sb + shared_bias)
    if model.capacity_factor > 0:
        f, b = f + OPS_MOE_CAPACITY[0], b + OPS_MOE_CAPACITY[1]
    return f, b


def ffn_ops(model: ModelSpec) -> tuple[int, int]:
    """(forward, backward) operators of a block's feed-forward layer (its share of
    :func:`block_ops`): the MLP, or a MoE layer in its place."""
    f, b = OPS_MLP_GELU
    if model.mlp == "swiglu":
        f, b = f + OPS_SWIGLU[0], b + OPS_SWIGLU[1]
    if model.bias:
        b += OPS_BIAS_BWD_PER_LINEAR * (3 if model.mlp == "swiglu" else 2)
    return _moe_ops(model, f, b) if model.is_moe else (f, b)


def tp_dtensor_ops(model: ModelSpec, sp: bool) -> tuple[tuple[int, int], tuple[int, int]]:
    """((forward, backward) of one block, (forward, backward) of the output layer and loss):
    operators that run on DTensors when tp > 1 (see ``OPS_TP_*``)."""
    linears = 4 + (3 if model.mlp == "swiglu" else 2)
    bf = linears * OPS_TP_LINEAR[0]
    bb = linears * (OPS_TP_LINEAR[1] + (OPS_TP_BIAS_BWD if model.bias else 0))
    if sp:
        bf, bb = bf + OPS_TP_SP_BLOCK[0], bb + OPS_TP_SP_BLOCK[1]
    return (bf, bb), (OPS_TP_SP_OUTPUT if sp else OPS_TP_OUTPUT)


def output_ops(model: ModelSpec) -> tuple[int, int]:
    """(forward, backward) operators of the final norm, output layer and loss."""
    f, b = OPS_OUTPUT_BASE
    if model.norm == "rmsnorm":
        f, b = f + OPS_RMSNORM[0] // 2, b + OPS_RMSNORM[1] // 2
    return f, b


@dataclass(frozen=True)
class Gemm:
    """``count`` products of ``(m x k) @ (k x n)``."""

    m: float
    n: float
    k: float
    count: float = 1.0

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count


# Output tiles (m x n) of the cuBLAS kernels seen on an H100 (docs/gpu-h100.md: nvjet_sm90
# 256x128, 128x128, 128x64), each with its rate relative to the largest: a smaller tile
# reloads its operands for fewer products.
GPU_TILES = ((256, 128, 1.0), (128, 128, 0.93), (128, 64, 0.80))
K_FILL = 128
"""Inner-dimension elements a tile's main loop loses to filling and draining its pipeline."""


def shape_efficiency(m: float, n: float, k: float, sms: int, count: float = 1) -> float:
    """Fraction of the large-matmul rate a product of (m x k) @ (k x n) reaches on a GPU with
    ``sms`` multiprocessors: tile quantisation (partial tiles at the edges), wave quantisation
    (the last wave of tiles leaves multiprocessors idle; NVIDIA, "Matrix Multiplication
    Background User's Guide", Deep Learning Performance documentation) -- the best of the
    tile shapes, as cuBLAS's heuristics pick -- times ``k / (k + K_FILL)``.

    Checked against an H100 (tests/test_validate.py): the products of transformer layers
    (hidden 2304..12288, tp 1..8) are predicted within a median 6.4% of their measured rates
    with the preset's efficiency (Bekman's maximum achievable) and the measured launch cost."""
    m, n, count = math.ceil(m), math.ceil(n), max(1, math.ceil(count))
    best = 0.0
    for tm, tn, rel in GPU_TILES:
        tiles = math.ceil(m / tm) * math.ceil(n / tn) * count  # a batch shares the waves
        waves = math.ceil(tiles / sms)
        best = max(best, rel * m * n * count / (waves * sms * tm * tn))
    return best * k / (k + K_FILL)


# Achieved bandwidth of PyTorch's norm kernels relative to a large copy (measured on an H100
# 80GB HBM3, 2026-11-24, scripts/gpu_microbench.py, 2^28 bf16 elements: copy 2.98 TB/s,
# layer_norm 2.07, rms_norm 2.02). The cost model's memory bandwidth is the copy's, so a
# norm's bytes take 1/0.68 as long. (PyTorch's softmax reached 1.29 TB/s, but unfused
# attention stacks ran their own fused scale-mask-softmax kernels, not measured: not applied.)
NORM_BW_FRACTION = 2.02 / 2.98


def eager_time(passes: dict[str, list[float]], bw: float, gpu: bool,
               measured: dict[str, float] | None = None) -> tuple[float, float]:
    """(forward, backward) seconds of eager memory-bound passes (:mod:`ptd.cost.eager`), each
    kind of kernel at its share of the copy bandwidth ``bw``: the share ``measured`` on the
    machine where it has one (``HardwareSpec.eager_bandwidth_fraction``, from ``ptd
    calibrate``); else on a GPU the H200's (``EAGER.BW_FRACTION``; norms at
    :data:`NORM_BW_FRACTION`), elsewhere 1."""
    fwd = bwd = 0.0
    for kind, (f, b) in passes.items():
        frac = 1.0
        if measured and kind in measured:
            frac = measured[kind]
        elif gpu:
            frac = NORM_BW_FRACTION if kind == "norm" else EAGER.BW_FRACTION[kind]
        fwd += f / (bw * frac)
        bwd += b / (bw * frac)
    return fwd, bwd


def gemm_time(g: Gemm, rate: float, bw: float, act_bytes: int, hw: HardwareSpec | None = None,
              dtype: str | None = None) -> float:
    """Roofline time of ``g``. Its rate: the measured one for its shape where the profile
    has a sweep for ``dtype`` (:func:`shape_fraction`; the sweep timed products launched
    back to back from Python, so a small product's launch is in its measured rate); else,
    with a GPU's shape model (``hw.sm_count``), the rate its shape reaches, plus the
    kernel's launch cost; else ``rate``."""
    mem = act_bytes * (g.m * g.k + g.k * g.n + g.m * g.n) * g.count
    measured = shape_fraction(hw, dtype, g.m, g.n, g.k) if hw is not None and dtype else None
    if measured is not None:
        return max(g.flops / (rate * measured), mem / bw)
    if hw is None or not hw.sm_count or g.m < 1 or g.n < 1:
        return max(g.flops / rate, mem / bw)
    eff = shape_efficiency(g.m, g.n, g.k, hw.sm_count, g.count)
    return max(g.flops / (rate * eff), mem / bw) + hw.kernel_launch * g.count


def attention_fraction(hw: HardwareSpec, dtype: str, head_dim: int, seq_len: int) -> float:
    """Causal attention's rate as a fraction of the matmul rate, from ``ptd calibrate``'s
    attention shapes: for a head dimension measured, linear in ``log2 s`` between the
    measured sequence lengths (the nearest one beyond them); for one between two measured
    head dimensions, linear in ``log2 d`` between their values at this length; beyond the
    measured head dimensions, the nearest one's. Without measured shapes,
    ``hw.attention_efficiency``. A CPU's attention kernel runs small heads far below large
    ones (``ptd calibrate --model tiny``, 2026-11-25, 2-core AMD EPYC, fp32: heads of 8 at
    0.054 of the matmul rate at sequence 128 and 0.062 at 256, heads of 32 at 0.32), so one
    value for every head dimension misprices a tiny model's attention several times over."""
    table = hw.attention_shapes_measured.get(dtype) if hw.attention_shapes_measured else None
    by_dim: dict[int, list[tuple[float, float]]] = {}
    for key, r in (table or {}).items():
        _, _, s, d = map(int, key.split("x"))  # "BxHxSxD"
        by_dim.setdefault(d, []).append((math.log2(s), r))
    if not by_dim:
        return hw.attention_efficiency
    x = math.log2(max(seq_len, 1))
    dims = sorted(by_dim)
    if head_dim <= dims[0] or head_dim >= dims[-1]:
        return _along(by_dim[dims[0] if head_dim <= dims[0] else dims[-1]], x)
    hi = next(d for d in dims if d >= head_dim)
    lo = max(d for d in dims if d <= head_dim)
    if lo == hi:
        return _along(by_dim[lo], x)
    r0, r1 = _along(by_dim[lo], x), _along(by_dim[hi], x)
    w = (math.log2(head_dim) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
    return r0 + (r1 - r0) * w


def _along(pts: list[tuple[float, float]], x: float) -> float:
    """Linear interpolation of ``(x, value)`` points at ``x``; the nearest end beyond them."""
    pts = sorted(pts)
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, r0), (x1, r1) in zip(pts, pts[1:]):
        if x <= x1:
            return r0 + (r1 - r0) * (x - x0) / (x1 - x0) if x1 > x0 else r1
    return pts[-1][1]


def shape_fraction(hw: HardwareSpec, dtype: str, m: float, n: float, k: float) -> float | None:
    """The rate a product of this shape reached in ``ptd calibrate``'s sweep, relative to the
    calibrated matmul rate; None without a sweep for ``dtype``.

    Between measured shapes: inverse-distance weighting (power 2) of the four nearest in
    ``(log2 m, log2 n, log2 k)``; a measured shape gives its own value. Beyond the sweep the
    nearest shapes stand for it (no extrapolation)."""
    table = hw.gemm_shapes_measured.get(dtype) if hw.gemm_shapes_measured else None
    if not table or m < 1 or n < 1 or k < 1:
        return None
    pts = _parsed_sweep(tuple(sorted(table.items())))
    x = (math.log2(m), math.log2(n), math.log2(k))
    near = sorted(((sum((a - b) ** 2 for a, b in zip(x, p)), r) for p, r in pts))[:4]
    if near[0][0] < 1e-12:
        return near[0][1]
    w = [1.0 / d for d, _ in near]
    return sum(wi * r for wi, (_, r) in zip(w, near)) / sum(w)


@lru_cache(maxsize=64)
def _parsed_sweep(items: tuple[tuple[str, float], ...]
                  ) -> list[tuple[tuple[float, ...], float]]:
    return [(tuple(math.log2(int(d)) for d in key.split("x")), float(r)) for key, r in items]


def overlap_loss(model: ModelSpec, hw: HardwareSpec, seq_len: int, micro_batch: int, tp: int,
                 dtype: str, rate: float, bw: float, block: "BlockTime",
                 expert_tp: bool = False) -> float:
    """Seconds of computation lost per second that a collective runs beside it.

    A running collective holds ``hw.comm_sms`` multiprocessors, so the block's linear
    products run on the rest: fewer multiprocessors, and the shape model's waves over
    them. Over an overlapped second the products advance ``1/r`` of a second of work (``r``
    their slowdown), so the step gains ``1 - 1/r`` of a second, times the products' share of
    the block's forward and backward time. Attention and memory-bound kernels are taken as
    unaffected (they are bound by bandwidth or by their own tiles, not measured here)."""
    if not hw.sm_count or not hw.comm_sms:
        return 0.0
    ab = DTYPE_BYTES[dtype]
    lin, _ = block_gemms(model, seq_len * micro_batch, seq_len, micro_batch, tp,
                         expert_tp=expert_tp)
    # the products' time alone and beside a collective (in units of the large-matmul rate)
    full = sum(g.flops / busy_rate(g, hw.sm_count, 0) for g in lin)
    slow = sum(g.flops / busy_rate(g, hw.sm_count, hw.comm_sms) for g in lin)
    share = min(1.0, 3 * sum(gemm_time(g, rate, bw, ab, hw, dtype) for g in lin)
                / max(block.forward + block.backward, 1e-30))
    return (1.0 - full / slow) * share


def busy_rate(g: Gemm, sms: int, busy: int) -> float:
    """Rate of ``g`` while ``busy`` of the device's ``sms`` multiprocessors are taken, as a
    fraction of the large-matmul rate of the whole device: the free multiprocessors' share
    times the shape efficiency of waves over them."""
    free = sms - busy
    return free / sms * shape_efficiency(g.m, g.n, g.k, free, g.count)


def block_gemms(model: ModelSpec, tokens: int, seq_len: int, micro_batch: int, tp: int,
                ffn: bool = True, expert_tp: bool = False) -> tuple[list[Gemm], list[Gemm]]:
    """(linear-layer products, attention products) of one block's forward, per tp rank
    (without the feed-forward layer's where ``ffn`` is False; ``expert_tp``: routed experts
    split over tp like a dense MLP, :mod:`ptd.cost.moe`)."""
    h, q, kv, f, t = model.hidden, model.q_dim, model.kv_dim, model.ffn_hidden, tp
    lin = [Gemm(tokens, q / t, h), Gemm(tokens, kv / t, h, 2), Gemm(tokens, h, q / t)]
    up = 2 if model.mlp == "swiglu" else 1
    mlp = [Gemm(tokens, f / t, h, up), Gemm(tokens, h, f / t)]  # split over tp
    if ffn and model.is_moe:
        # router and routed experts are whole on every tp rank (runtime/parallel/tp.py), each
        # expert taking its share of the assignments (balanced routing); shared experts are
        # dense MLPs split over tp. Under expert_tp the experts are split over tp too, every
        # tp rank running all the assignments (gathered over tp) on its share of F.
        lin += [Gemm(tokens, model.n_experts, h),
                *routed_gemms(model, tokens, expert_split(t, expert_tp))]
        if model.n_shared_experts:
            lin += [Gemm(g.m, g.n, g.k, g.count * model.n_shared_experts) for g in mlp]
    elif ffn:
        lin += mlp
    heads = micro_batch * model.n_heads / t
    d = model.head_dim
    attn = [Gemm(seq_len, seq_len, d, heads), Gemm(seq_len, d, seq_len, heads)]
    return lin, attn


def routed_gemms(model: ModelSpec, tokens: float, split: int = 1) -> list[Gemm]:
    """The routed experts' products of one MoE block's forward over ``tokens`` tokens: each
    expert takes its share of the ``top_k`` assignments (balanced routing); ``split``: each
    expert's width ``F`` split that many ways (expert tensor parallelism)."""
    share, e = model.top_k / model.n_experts, model.n_experts
    up = 2 if model.mlp == "swiglu" else 1
    f, h = model.ffn_hidden / split, model.hidden
    return [Gemm(tokens * share, f, h, up * e), Gemm(tokens * share, h, f, e)]


def elementwise_bytes_fwd(model: ModelSpec, tokens: int, tp: int, sp: bool, act_bytes: int,
                          expert_tp: bool = False) -> float:
    """Bytes memory-bound operators of one block's forward read and write.

    Per token: two norms (read + write ``h``), two residual adds (read 2, write 1), rotary
    embedding on Q and K (about three passes), head transposes to and from the attention
    kernel, the activation function (SiLU and the gate product: 5 passes over ``F``; GELU:
    2), dropout (read, write, 1-byte mask) when enabled. ``expert_tp``: routed experts split
    over tp, their activation's passes over ``F / tp``.
    """
    h, q, kv, f, t = model.hidden, model.q_dim, model.kv_dim, model.ffn_hidden, tp
    routed = 0.0
    if model.is_moe:
        # routed experts whole on every tp rank (split over it under expert_tp); per
        # assignment the gather of the tokens, the weighting and the index_add back each
        # read and write h
        routed = model.top_k * ((5 if model.mlp == "swiglu" else 2) * f / expert_split(t, expert_tp)
                                + 6 * h)
        f *= model.n_shared_experts
    rep = t if sp else 1
    e = (4 * h + 6 * h) / rep
    if model.position == "rope":
        e += 6 * (q + kv) / t
    e += (2 * (q + 2 * kv) + 2 * q) / t
    e += (5 if model.mlp == "swiglu" else 2) * f / t + routed
    total = e * tokens * act_bytes
    if model.dropout > 0:
        total += 2 * tokens * h / rep * (2 * act_bytes + 1)
    return total


def dispatch_floor(t: float, n_ops: int, hw: HardwareSpec) -> float:
    """On a GPU the host issues every operator (``hw.kernel_launch`` each, measured back to
    back); the device runs them asynchronously, so a phase takes the longer of its kernels'
    time and its operators' issue time. Large models hide the issue time; small ones (the
    ``tiny`` model: ~100 operators per block, microseconds of work each) are bound by it."""
    return max(t, n_ops * hw.kernel_launch)


def norm_bytes_fwd(model: ModelSpec, tokens: int, tp: int, sp: bool, act_bytes: int) -> float:
    """The two norms' share of :func:`elementwise_bytes_fwd` (read and write ``h`` each)."""
    return 4 * model.hidden / (tp if sp else 1) * tokens * act_bytes


@dataclass(frozen=True)
class BlockTime:
    """Seconds for one micro-batch through one block on one rank."""

    forward: float
    backward: float
    attention_forward: float
    """The attention core's share of ``forward`` (what selective recompute repeats)."""
    last_matmul_forward: float = 0.0
    """The block's last product (MLP down projection), which an early-stopping full
    recompute does not repeat (see :mod:`ptd.cost.flops`)."""
    routed_forward: float = 0.0
    """The routed experts' products in ``forward`` (MoE blocks; their backward is twice):
    under expert parallelism they lie between the dispatch and the combine all-to-alls."""
    selective: str = "attention"
    """What selective recompute repeats (:data:`SELECTIVE`)."""
    op_policy_forward: float = 0.0
    """The forward work the ``op`` policy repeats: every second product and every operator
    that is not a product or attention."""

    def recompute(self, kind: str, early_stop: bool = True) -> float:
        if kind == "full":
            return self.forward - (self.last_matmul_forward if early_stop else 0.0)
        if kind != "selective":
            return 0.0
        if self.selective == "layer":
            return 0.5 * self.recompute("full", early_stop)
        if self.selective == "op":
            return self.op_policy_forward
        return self.attention_forward


SELECTIVE = ("attention", "op", "layer")
"""What "selective" activation recomputation repeats, by stack:

* ``attention``: the attention core (Korthikanti et al. 2022; Megatron-LM, ptd's runtime).
* ``op``: torchtitan's op policy (``torchtitan/parallelisms/parallelize_llama.py`` at
  041336434916, 2024-04): the outputs of ``aten.mm`` and of the fused attention are kept,
  except every second ``mm`` of a block in forward order; every other operator (norms,
  rotary embedding, activations, residual adds, and biased linears, which dispatch to
  ``addmm``) runs again in the backward.
* ``layer``: torchtitan's ``selective_ac_option`` as an integer, ``"2"`` by default: every
  second block is checkpointed in full and the others keep everything (priced per block as
  half of each)."""


def recomputed_products(model: ModelSpec, products: list["Gemm"]) -> list["Gemm"]:
    """The products the ``op`` policy runs again: of the block's products in forward order
    (each of ``count`` taken one by one), the second, fourth, ...; all of them where the
    linears have biases (``addmm`` is not among the kept operators)."""
    single = [Gemm(g.m, g.n, g.k) for g in products for _ in range(int(g.count))]
    return single if model.bias else single[1::2]


def scores_bytes_fwd(model: ModelSpec, seq_len: int, micro_batch: int, tp: int, act_bytes: int) -> float:
    """Unfused attention's forward traffic over the ``s x s`` scores (beyond the products'
    own reads and writes): the softmax reads and writes them (scale and mask fused into it,
    as Megatron's kernel does); dropout reads, writes and stores a 1-byte mask."""
    n = micro_batch * model.n_heads / tp * seq_len * seq_len
    per = 2 * act_bytes + ((2 * act_bytes + 1) if model.dropout > 0 else 0)
    return n * per


def block_time(model: ModelSpec, hw: HardwareSpec, seq_len: int, micro_batch: int, tp: int,
               sp: bool, dtype: str, rate: float, attention: str = "flash",
               bw: float | None = None, overhead: float | None = None,
               dtensor_overhead: float = 0.0, elementwise: str = "fused", ep: int = 1,
               moe_layer: tuple[float, float] | None = None,
               selective: str = "attention", expert_tp: bool = False,
               dtensor_share: float = 0.0) -> BlockTime:
    """``rate``, ``bw`` and ``overhead``: one worker's matmul FLOP/s, memory bandwidth and
    per-operator cost with its node's workers running (default: the hardware's own);
    ``dtensor_overhead``: the extra cost of an operator on a DTensor (tp > 1);
    ``dtensor_share``: how much slower the block's work runs on DTensors (tp > 1);
    ``elementwise``: ``fused`` prices the fewest passes of memory-bound operators
    (:func:`elementwise_bytes_fwd`, backward twice the forward), ``eager`` and ``autocast``
    the passes PyTorch runs op by op (:mod:`ptd.cost.eager`); ``ep``: expert parallelism
    (the rank's routed experts whose weights autocast casts); ``moe_layer``: the MoE
    layer's measured (forward, backward) seconds on these tokens
    (``ClusterSpec.moe_layer``), which then price it in place of its products, passes and
    operators (op by op pricing only: ``elementwise`` not ``fused``); ``selective``: what
    selective recompute repeats (:data:`SELECTIVE`); ``expert_tp``: routed experts split
    over tp (:mod:`ptd.cost.moe`; fused elementwise pricing)."""
    ab = DTYPE_BYTES[dtype]
    bw = bw or hw.effective_memory_bandwidth
    overhead = hw.op_overhead if overhead is None else overhead
    tokens = seq_len * micro_batch
    measured = moe_layer is not None and model.is_moe and elementwise != "fused"
    full, attn = block_gemms(model, tokens, seq_len, micro_batch, tp, expert_tp=expert_tp)
    lin = block_gemms(model, tokens, seq_len, micro_batch, tp, ffn=False)[0] if measured else full
    t_lin = sum(gemm_time(g, rate, bw, ab, hw, dtype) for g in lin)
    gpu_kernels = bool(hw.sm_count)  # the measured kernel bandwidths are a GPU's
    slow_norm = (1 / NORM_BW_FRACTION - 1) if gpu_kernels else 0.0
    if elementwise == "fused":
        ew = elementwise_bytes_fwd(model, tokens, tp, sp, ab, expert_tp) / bw
        # the two norms (4h bytes per token of the total) run slower than a copy
        ew += norm_bytes_fwd(model, tokens, tp, sp, ab) / bw * slow_norm
        ew_b = 2 * ew
    else:
        # without a GPU's fused kernel, F.rms_norm runs as operators (torch 2.13's CPU)
        ew, ew_b = eager_time(EAGER.block_passes(model, tokens, tp, sp, dtype, elementwise, ep,
                                                 composite_norm=not gpu_kernels,
                                                 ffn=not measured),
                              bw, gpu_kernels, hw.eager_bandwidth_fraction)
    if attention == "flash":
        # fused: the s x s scores never reach memory; it reads Q, K, V and writes O
        flops = 0.5 * sum(g.flops for g in attn)  # causal tiles skipped
        io = ab * tokens * (2 * model.q_dim + 2 * model.kv_dim) / tp
        eff = attention_fraction(hw, dtype, model.head_dim, seq_len)
        t_attn = max(flops / (rate * eff), io / bw)
        t_attn_bwd = max(2.5 * flops / (rate * eff), 2 * io / bw)
    else:
        t_attn = (sum(gemm_time(g, rate, bw, ab, hw, dtype) for g in attn)
                  + scores_bytes_fwd(model, seq_len, micro_batch, tp, ab) / bw)
        t_attn_bwd = 2 * t_attn
    ops = block_ops(model)
    if measured:
        layer_ops = ffn_ops(model)
        ops = (ops[0] - layer_ops[0], ops[1] - layer_ops[1])
    fwd = dispatch_floor(t_lin + t_attn + ew + ops[0] * overhead, ops[0], hw)
    bwd = dispatch_floor(2 * t_lin + t_attn_bwd + ew_b + ops[1] * overhead, ops[1], hw)
    k = 1.0 + (dtensor_share if tp > 1 else 0.0)
    t_lin, t_attn, fwd, bwd = k * t_lin, k * t_attn, k * fwd, k * bwd
    if tp > 1 and dtensor_overhead:
        (df, db), _ = tp_dtensor_ops(model, sp)
        fwd += df * dtensor_overhead
        bwd += db * dtensor_overhead
    routed = (sum(gemm_time(g, rate, bw, ab, hw, dtype)
                  for g in routed_gemms(model, tokens, expert_split(tp, expert_tp)))
              if model.is_moe else 0.0)
    if measured:
        fwd, bwd = fwd + moe_layer[0], bwd + moe_layer[1]  # type: ignore[index]
        routed = min(routed, moe_layer[0])  # type: ignore[index]
    down = full[-1]  # the block's last product (per expert for MoE)
    # the op policy: the forward less its attention and products, plus the products it repeats
    again = k * sum(gemm_time(g, rate, bw, ab, hw, dtype)
                    for g in recomputed_products(model, lin))
    op_policy = max(0.0, fwd - t_attn - t_lin) + again
    return BlockTime(forward=fwd, backward=bwd, attention_forward=t_attn,
                     last_matmul_forward=k * gemm_time(down, rate, bw, ab, hw, dtype) + overhead,
                     routed_forward=routed, selective=selective, op_policy_forward=op_policy)


def megatron_ce_bytes(act_bytes: int) -> tuple[int, int]:
    """Bytes per local logit (forward, backward) of Megatron-LM's vocab-parallel cross-entropy
    by the logits' element size, the path of every stack with ``fused`` elementwise kernels
    (Megatron-LM and its DeepSpeed fork; opt-in fusion only from 2024-06, NVIDIA/Megatron-LM
    7b4a6d76c9 ``--cross-entropy-loss-fusion``). Counted from ``megatron/mpu/cross_entropy.py``
    (2021) and ``megatron/core/tensor_parallel/cross_entropy.py`` (r0.8.0, 2024), which run the
    same passes over the ``[s, b, V/t]`` logits: a cast of 16-bit logits to fp32 (read 2,
    write 4; ``output.float()`` in 2021, ``.float()`` inside the function in 2024), the row
    maximum (read 4), the in-place subtraction of it (4 + 4), the in-place exponential (4 + 4),
    the row sum (4), the in-place division into the softmax the backward keeps (4 + 4): 38.
    Backward: the in-place product with the loss gradient (4 + 4) and the gradient's cast back
    to 16 bits (4 + 2): 14 (the target entries' update touches one element a row). With fp32
    logits no cast runs: 32 and 8."""
    cast = 0 if act_bytes == 4 else act_bytes + 4
    return 32 + cast, 8 + cast


def output_time(model: ModelSpec, hw: HardwareSpec, tokens: int, tp: int, dtype: str,
                rate: float, bw: float | None = None, overhead: float | None = None,
                dtensor_overhead: float = 0.0, sp: bool = False, elementwise: str = "fused",
                dtensor_share: float = 0.0) -> tuple[float, float]:
    """(forward, backward) seconds of final norm, output layer and loss on the last stage
    (``dtensor_overhead``, ``dtensor_share``: as :func:`block_time`'s).
    The loss works in fp32 over the local vocabulary shard of ``N = s b V / t`` logits:
    with ``elementwise`` ``fused`` (the Megatron-LM family) as Megatron's vocab-parallel
    cross-entropy runs it (:func:`megatron_ce_bytes`), otherwise op by op
    (:mod:`ptd.cost.eager`). ``V`` is the padded vocabulary
    (:meth:`ptd.specs.ModelSpec.padded_vocab`): padding columns are computed like the others."""
    ab = DTYPE_BYTES[dtype]
    bw = bw or hw.effective_memory_bandwidth
    overhead = hw.op_overhead if overhead is None else overhead
    v = model.padded_vocab(tp)
    g = Gemm(tokens, v / tp, model.hidden)
    logits = tokens * v / tp
    norm_bytes = 2 * ab * tokens * model.hidden
    of, ob = output_ops(model)
    t_out = gemm_time(g, rate, bw, ab, hw, dtype)
    if elementwise == "fused":
        ce_f, ce_b = (n * logits for n in megatron_ce_bytes(ab))
        t_f, t_b = (ce_f + norm_bytes) / bw, (ce_b + 2 * norm_bytes) / bw
    else:  # op by op (see ptd.cost.eager)
        t_f, t_b = eager_time(EAGER.output_passes(model, tokens, tp, dtype, elementwise,
                                                  composite_norm=not hw.sm_count), bw,
                              bool(hw.sm_count), hw.eager_bandwidth_fraction)
    fwd = dispatch_floor(t_out + t_f + of * overhead, of, hw)
    bwd = dispatch_floor(2 * t_out + t_b + ob * overhead, ob, hw)
    if tp > 1:
        fwd, bwd = fwd * (1.0 + dtensor_share), bwd * (1.0 + dtensor_share)
    if tp > 1 and dtensor_overhead:
        _, (df, db) = tp_dtensor_ops(model, sp)
        fwd += df * dtensor_overhead
        bwd += db * dtensor_overhead
    return fwd, bwd


def optimizer_time(local_params: float, n_tensors: int, hw: HardwareSpec, offload: bool = False,
                   bw: float | None = None, overhead: float | None = None,
                   per_tensor: float | None = None, per_param: float | None = None) -> float:
    """AdamW over the rank's own parameters: memory-bound, reading parameter, gradient and
    both moments and writing parameter and moments (28 bytes per fp32 parameter), plus the
    gradient-norm pass (4 bytes). With offload, gradients go to the host and parameters come
    back over the host link, and the update runs on host memory at the same byte count.
    ``per_tensor``: the measured framework cost per parameter tensor of the whole phase
    (norm, clipping, AdamW: ``overheads_measured``), else ``OPS_OPTIMIZER_PER_TENSOR``
    operators at ``overhead`` each. ``per_param``: the measured seconds each parameter adds
    to the phase (a CPU's unfused AdamW, ``overheads_measured``), in place of the bytes."""
    nbytes = 32.0 * local_params
    bw = bw or hw.effective_memory_bandwidth
    overhead = hw.op_overhead if overhead is None else overhead
    if per_tensor is None:  # not calibrated: the operators alone
        per_tensor = OPS_OPTIMIZER_PER_TENSOR * overhead
    work = local_params * per_param if per_param is not None else nbytes / bw
    t = work + n_tensors * per_tensor
    if offload:
        t += 8.0 * local_params / hw.host_bandwidth
    return t

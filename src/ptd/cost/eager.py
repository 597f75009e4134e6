"""Memory-bound traffic of a block run op by op, as eager PyTorch runs it.

:func:`ptd.cost.compute.elementwise_bytes_fwd` counts the fewest passes a block needs: what
fused kernels reach (Megatron-LM's fused bias-GELU, bias-dropout-add and norms; Transformer
Engine). Eager PyTorch launches one kernel per operator, each reading its inputs from memory
and writing its output, and autograd adds the backward of each. This module counts those
passes operator by operator, so that a stack which runs eagerly (``CostOptions.elementwise``)
is priced for what it moves.

Three eager variants:

* ``eager``: parameters and activations in the compute dtype, fused norm kernels;
* ``llama-ref``: ``eager`` with the operators of the Llama reference model
  (facebookresearch/llama's model.py, which torchtitan's Llama follows): RMSNorm as six
  operators in fp32 (``x.float()``, ``pow``, ``mean``, the product with ``rsqrt``,
  ``type_as``, the weight's product: 36 bytes per element forward in bf16, 68 backward) and
  K/V repeated to the query heads before attention (a copy, and a sum over the repeats in
  the backward); FSDP2's mixed precision casts the parameters once, in the all-gather;
* ``autocast``: fp32 parameters under ``torch.autocast`` (ptd's runtime): the residual stream
  and the norms stay fp32, each linear layer's input is cast on its own (autocast caches the
  casts of weights, not of activations), every weight is cast once per forward and its
  gradient cast back.

Per token, ``c`` the compute dtype's bytes and ``r`` the residual stream's (``r = 4`` under
autocast, else ``c``); a pass over ``n`` elements that reads ``a`` and writes ``b`` tensors
of them moves ``(a + b) n`` elements. Why each count (forward / backward), for one block:

* norms, two per block: read and write the stream (2r); backward reads the gradient and the
  input for the input gradient and again for the weight gradient, writes one (5r). Where
  ``F.rms_norm`` has no fused kernel (a CPU, torch 2.13) it runs as operators, and autograd
  runs theirs: :data:`COMPOSITE_RMSNORM` passes in fp32 whatever the stream's dtype, a 16-bit
  stream cast up on the way in and down on the way out, both ways (``composite_norm``);
* residual adds, two: read the stream and the branch output, write the stream (2r + c); the
  backward hands the stream's gradient to the branch (a cast, r + c, under autocast) and sums
  the skip's gradient with the norm's (3r);
* casts of the normalised input before each linear that reads it (autocast only): r + c
  forward and back; the linears reading one input (q, k, v; gate and up) sum their input
  gradients pairwise (3r each);
* rotary embedding on q and k (rotate-half: a negation of half, a concatenation, two
  products with the tables and a sum): 10c forward; the backward's two products, the
  negation, the split's concatenation and the sum of the two paths: 10c;
* the attention output's transpose to ``(b, s, h)``: a copy, 2c (its backward is a view);
* SwiGLU: SiLU (2c) and the gate product (3c) over ``F``; backward, both products' gradients
  (6c) and SiLU's (3c). GELU: 2c and 3c.

Checked against the kernels of ptd's runtime on an H200 (docs/gpu-h100.md, "H200"), where
the cast, broadcast and softmax kernels reached 0.45-0.66 of the copy bandwidth that prices
them here: this counts bytes, not how well each kernel moves them.
"""

from __future__ import annotations

from ..specs.hardware import DTYPE_BYTES
from ..specs.model import ModelSpec

KINDS = ("fused", "eager", "llama-ref", "autocast")
BW_FRACTION = {
    "copy": 1.0, "cast_down": 1.0, "elementwise": 3.56 / 3.86, "activation": 3.56 / 3.86,
    "cast_up": 2.03 / 3.86,
    "add": 2.73 / 3.86, "broadcast": 1.44 / 3.86, "cat": 0.96 / 3.86, "softmax": 2.11 / 3.86}
"""On a GPU, the share of a copy's bandwidth each kind of eager kernel reaches (the norms
are :data:`ptd.cost.compute.NORM_BW_FRACTION`'s). Measured alone on an H200 (torch 2.11,
2026-11-27, ``scripts/gpu_step_breakdown.py kernels``, ``docs/data/h200-2026-11-27/
kernels.json``), 8192 x 4096 elements, against a bf16 copy of the same size (3.86 TB/s):
fp32->bf16 cast 4.10 (taken as 1), bf16->fp32 cast 2.03, fp32 + bf16 add 2.73 (``add``:
sums with an fp32 operand), SiLU 3.56 (``elementwise``: same-shape operators), the rotary
embedding's product with its tables 1.44 (``broadcast``) and its concatenation 0.96, fp32
log-softmax over 8192 x 128256 2.11 TB/s. Unmeasured kinds (layout copies, fills) at 1.
``activation`` (SiLU, GELU and their gradients) is kept apart from ``elementwise`` because on
a CPU its exponential, not memory, bounds it: ``ptd calibrate`` measures its share of the
copy bandwidth on the machine (``HardwareSpec.eager_bandwidth_fraction``), which overrides
this table."""
COMPOSITE_RMSNORM = (7, 23)
"""Passes over the stream of ``F.rms_norm`` run as operators, (forward, backward), per
element, each of 4 bytes: the composite computes in fp32 (its ``opmath`` type) whatever its
input's dtype, and a 16-bit input is cast up first and the output cast down last, as are the
output's gradient and the input's in the backward (:func:`_norm`). Forward: ``pow`` (read, write: 2), ``mean`` (read: 1), the products
with ``rsqrt`` and with the weight (2 + 2; the per-row ``add``/``rsqrt`` are negligible).
Backward, as autograd runs them: the weight's product's two gradients, ``g * xn`` (3) and
``g * w`` (2), and the weight gradient's reduction (1); the ``rsqrt`` product's, ``gn * x``
(3) and ``gn * rs`` (2), and its reduction (1); ``mean``'s expand and division (1); ``pow``'s
three (``x ** 1``, the factor 2, the product with the gradient: 2 + 2 + 3); the two paths'
sum (3). Checked against the operators torch dispatches (tests/test_cost_vs_runtime.py)."""
REF_NORM = (36, 68)
"""Bytes per element of the Llama reference RMSNorm in bf16, (forward, backward): forward
cast 2+4, pow 4+4, mean 4, product 4+4, cast back 4+2, weight 2+2; backward the weight's
product and its gradient's reduction 4+4, the cast back's 2+4, the product's two
gradients 8+12, mean's expand 4, pow's 12, the two paths summed 12, the first cast's 4+2."""


def for_plan(kind: str, zero: int) -> str:
    """The kind a plan runs: ptd's runtime runs ``torch.autocast`` only under ZeRO-0. Under
    ZeRO-1/2/3 FSDP's ``MixedPrecisionPolicy(param_dtype=...)`` casts the parameters once, in
    the all-gather, and the forward runs on the compute dtype without autocast
    (``runtime/precision.py``: ``use_autocast`` is off with FSDP): the residual stream, the
    norms and the linears' inputs are 16-bit, one tensor shared by the linears that read it
    -- the ``eager`` kind (``tests/test_fsdp_mixed_precision_saves.py`` counts what such a
    block keeps on two ranks)."""
    return "eager" if kind == "autocast" and zero >= 1 else kind


def _widths(model: ModelSpec, tp: int) -> tuple[float, float, float, int]:
    """(q, kv, F) per tp rank and the number of linear layers reading the second norm."""
    f = model.ffn_hidden * (model.n_shared_experts if model.is_moe else 1)
    return model.q_dim / tp, model.kv_dim / tp, f / tp, 2 if model.mlp == "swiglu" else 1


def dtypes(dtype: str, kind: str) -> tuple[int, int]:
    """(c, r): bytes of the compute dtype and of the residual stream."""
    if kind not in KINDS[1:]:  # ("fused" is priced by ptd.cost.compute, not op by op)
        raise ValueError(f"eager pass kind {kind!r}; known: {', '.join(KINDS[1:])}")
    c = DTYPE_BYTES[dtype]
    return c, (4 if kind == "autocast" else c)


def _norm(model: ModelSpec, kind: str, composite_norm: bool, r: int
          ) -> dict[str, tuple[float, float]]:
    """``{kernel: (forward, backward) bytes per element}`` of one norm over a stream of ``r``
    bytes an element. A composite RMSNorm (:data:`COMPOSITE_RMSNORM`) works in fp32: from a
    16-bit stream (``r < 4``) it adds the input's cast up and the output's cast down, and in
    the backward the output gradient's cast up and the input gradient's down (r + 4 each:
    torch 2.13's ``rms_norm`` on a CPU, tests/test_cost_vs_runtime.py)."""
    if composite_norm and model.norm == "rmsnorm" and kind != "llama-ref":
        f, b = COMPOSITE_RMSNORM
        w = max(r, 4)
        out = {"elementwise": (f * w, b * w)}
        if r < 4:
            out["cast_up"] = (r + 4.0, r + 4.0)
            out["cast_down"] = (4.0 + r, 4.0 + r)
        return out
    return {"norm": (2.0 * r, 5.0 * r)}


def block_passes(model: ModelSpec, tokens: float, tp: int, sp: bool, dtype: str, kind: str,
                 ep: int = 1, composite_norm: bool = False, ffn: bool = True
                 ) -> dict[str, list[float]]:
    """Bytes of one block's memory-bound operators per micro-batch of ``tokens`` on one tp
    rank, ``kind`` ``eager``, ``llama-ref`` or ``autocast`` (see the module), by the kind of
    kernel that moves them (:data:`BW_FRACTION`): ``{kernel: [forward, backward]}``.
    ``composite_norm``: ``F.rms_norm`` runs as operators (no fused kernel on the device);
    ``ffn`` False: without the feed-forward layer's own passes (its inputs' casts and their
    gradients' sum, activation, experts' gather and scatter, weight casts, its output
    gradient's cast), where a measured layer prices it (``moe_layer_measured``)."""
    c, r = dtypes(dtype, kind)
    h = model.hidden
    hs = h / tp if sp else h  # the stream's width on a rank (sharded by sequence parallelism)
    q, kv, f, mlp_in = _widths(model, tp)
    if not ffn:
        f, mlp_in = 0.0, 0
    cast = r + c if r != c else 0
    n_in = 3 + mlp_in  # linears reading a normalised input
    add = "add" if cast else "elementwise"  # sums with an fp32 operand, or in the dtype
    out: dict[str, list[float]] = {}

    def put(k: str, fwd: float, bwd: float) -> None:
        a = out.setdefault(k, [0.0, 0.0])
        a[0] += fwd * tokens
        a[1] += bwd * tokens

    for kernel, (nf, nb) in _norm(model, kind, composite_norm, r).items():
        put(kernel, 2 * nf * hs, 2 * nb * hs)
    put(add, 2 * (2 * r + c) * hs, 2 * 3 * r * hs)  # residual adds; skip + norm gradients
    branches = 2 if ffn else 1
    put("cast_down", n_in * cast * h, branches * cast * hs)  # linear inputs; the branches' gradient
    put("cast_up", 0.0, n_in * cast * h)  # the linear inputs' gradients back to fp32
    put(add, 0.0, (2 + max(0, mlp_in - 1)) * 3 * (r if cast else c) * h)  # summed input gradients
    put("copy", 2 * c * q, 0.0)  # the attention output's layout
    if kind == "llama-ref":  # the reference RMSNorm in place of the fused kernel's passes
        put("elementwise", 2 * (REF_NORM[0] * c / 2 - 2 * r) * hs,
            2 * (REF_NORM[1] * c / 2 - 5 * r) * hs)
        if kv < q:  # repeat_kv: K and V copied to the query heads, summed back
            put("copy", 2 * c * (kv + q), 2 * c * (q + kv))
    if model.position == "rope":  # neg (1) and sum (3); concatenation (2); two products (4)
        put("elementwise", 4 * c * (q + kv), 4 * c * (q + kv))
        put("cat", 2 * c * (q + kv), 2 * c * (q + kv))
        put("broadcast", 4 * c * (q + kv), 4 * c * (q + kv))
    act_f, act_b = (5, 9) if model.mlp == "swiglu" else (2, 3)
    put("activation", 2 * c * f, 3 * c * f)  # SiLU or GELU itself, and its gradient
    put("elementwise", (act_f - 2) * c * f, (act_b - 3) * c * f)  # SwiGLU's gate product
    if model.is_moe and ffn:  # routed experts: gather, weighting and index_add per assignment
        routed = model.top_k * ((act_f * model.ffn_hidden) + 6 * h) * c
        act = model.top_k * model.ffn_hidden * c  # the experts' activation, as the dense one
        put("activation", 2 * act, 3 * act)
        put("elementwise", routed - 2 * act, 2 * routed - 3 * act)
    if model.dropout > 0:  # two residual dropouts: read, write, a one-byte mask
        put("elementwise", 2 * hs * (2 * c + 1), 2 * hs * (2 * c + 1))
    w = weight_cast_bytes(model, tp, dtype, kind, ep, ffn)
    out.setdefault("cast_down", [0.0, 0.0])[0] += w
    out.setdefault("cast_up", [0.0, 0.0])[1] += w
    return out


def block_bytes(model: ModelSpec, tokens: float, tp: int, sp: bool, dtype: str, kind: str,
                composite_norm: bool = False) -> tuple[float, float]:
    """(forward, backward) bytes of :func:`block_passes`, all kernels together."""
    passes = block_passes(model, tokens, tp, sp, dtype, kind, composite_norm=composite_norm)
    return sum(v[0] for v in passes.values()), sum(v[1] for v in passes.values())


def weight_cast_bytes(model: ModelSpec, tp: int, dtype: str, kind: str, ep: int = 1,
                      ffn: bool = True) -> float:
    """Autocast: each block weight read in fp32 and written in the compute dtype once per
    forward, and its gradient cast back in the backward (per micro-batch, one tp rank; the
    rank's ``E / ep`` routed experts under expert parallelism; ``ffn`` False: attention's
    weights only)."""
    c, r = dtypes(dtype, kind)
    if r == c:
        return 0.0
    h = model.hidden
    q, kv, f, mlp_in = _widths(model, tp)
    weights = h * (2 * q + 2 * kv) + ((mlp_in + 1) * h * f if ffn else 0)
    if model.is_moe and ffn:
        weights += model.n_experts // ep * (mlp_in + 1) * h * model.ffn_hidden
    return (r + c) * weights


def output_passes(model: ModelSpec, tokens: float, tp: int, dtype: str, kind: str,
                  composite_norm: bool = False) -> dict[str, list[float]]:
    """Bytes of the final norm, the loss and (autocast) the output weight's casts, by kernel
    (``{kernel: [forward, backward]}``). The loss runs in fp32 over the local vocabulary
    ``V``: the logits cast to fp32 (c + 4), log-softmax (read, write: 8); backward, the loss
    gradient's zero fill (4), log-softmax's backward (read two, write one: 12) and the cast
    back (4 + c)."""
    c, r = dtypes(dtype, kind)
    h, v = model.hidden, model.padded_vocab(tp) / tp
    to32 = c + 4 if c != 4 else 0
    cast = r + c if r != c else 0
    t = tokens
    out = {"cast_down": [cast * h * t + cast * v * h, to32 * v * t],
           "cast_up": [to32 * v * t, cast * h * t + cast * v * h],
           "softmax": [8 * v * t, 12 * v * t],
           "copy": [0.0, 4 * v * t]}
    for kernel, (nf, nb) in _norm(model, kind, composite_norm, r).items():
        a = out.setdefault(kernel, [0.0, 0.0])
        a[0] += nf * h * t
        a[1] += nb * h * t
    return out


def output_bytes(model: ModelSpec, tokens: float, tp: int, dtype: str, kind: str,
                 composite_norm: bool = False) -> tuple[float, float]:
    """(forward, backward) bytes of :func:`output_passes`, all kernels together."""
    passes = output_passes(model, tokens, tp, dtype, kind, composite_norm)
    return sum(v[0] for v in passes.values()), sum(v[1] for v in passes.values())

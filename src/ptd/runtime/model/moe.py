"""Mixture-of-experts feed-forward layer: router, grouped experts, auxiliary losses.

* **Router** (token choice, Mixtral): a bias-free linear layer gives ``n_experts`` logits
  per token; each token goes to its ``top_k`` largest, weighted by the softmax of those
  ``top_k`` logits only (Jiang et al. 2024, eq. 1-2).
* **Load-balancing loss** (Switch Transformer, Fedus et al. 2022, eq. 4-6, with GShard's
  top-k assignments): ``aux = E * sum_e f_e * P_e`` where ``f_e`` is the share of the
  micro-batch's ``T * k`` assignments that went to expert ``e`` and ``P_e`` the mean router
  probability (softmax over all ``E`` logits) of ``e``; 1 when perfectly balanced.
* **Router z-loss** (ST-MoE, Zoph et al. 2022, eq. 5): mean over tokens of
  ``logsumexp(logits)^2``.
* **Capacity** (GShard, Lepikhin et al. 2020, sec. 2.2): dropless by default; with
  ``capacity_factor = c > 0`` each expert takes at most ``ceil(c * T * k / E)`` of one
  micro-batch's assignments on one rank, earlier tokens first; the rest are dropped (the
  token keeps its residual stream only) and counted.
* **Grouped experts**: the assignments are sorted by expert (one stable ``argsort``), the
  tokens gathered once, and each weight matrix applied to its contiguous group by one
  ``torch._grouped_mm`` (CPU and GPU in torch 2.13), falling back to a loop over the sorted
  groups; outputs are weighted and scattered back with one ``index_add``. The weights of
  all experts are stacked, ``(E, in, out)``; under expert parallelism (:mod:`.parallel.ep`)
  they are ``DTensor`` shards ``Shard(0)`` over the ep group and the sorted tokens travel
  to their experts' rank and back by all-to-all.

The auxiliary losses do not appear in the language-model loss the runners compute and
report: each layer adds their gradient in its backward (:class:`_AuxGrad`, the trick of
Megatron-Core's ``MoEAuxLossAutoScaler``), scaled as if ``coef * aux * T / replica_tokens``
had been added to the loss -- so every runner (accumulation, pipeline stages) trains with
them without plumbing. ``aux_scale`` (``1 / replica_tokens``) is set by :func:`prepare`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from ...specs import ModelSpec


def _local(w: torch.Tensor) -> torch.Tensor:
    return w.to_local() if isinstance(w, DTensor) else w


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """Autocast's dtype for ``x``'s device where it is on, else ``x``'s own."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def _grouped_ok(x: torch.Tensor, w: torch.Tensor) -> bool:
    # torch 2.13's kernel takes fp32/bf16 only and needs row strides that are multiples of
    # 16 bytes (measured: "strides should be multiple of 16 bytes" for 5 fp32 columns)
    # (no rows -- every token went to another ep rank -- : its backward rejects the empty
    # gradient, "Invalid strides/sizes", measured; the loop handles it)
    # (under torch.compile, torch 2.13's fake-tensor rule for it takes bf16 only: fp32 raised
    # "Expected inputs of BF16 type" while tracing, measured; the loop runs there instead)
    compiling_fp32 = torch.compiler.is_compiling() and x.dtype != torch.bfloat16
    return (hasattr(torch, "_grouped_mm") and x.shape[0] > 0 and not compiling_fp32
            and x.dtype in (torch.float32, torch.bfloat16)
            and x.dtype == w.dtype and (x.shape[1] * x.element_size()) % 16 == 0
            and (w.shape[-1] * w.element_size()) % 16 == 0)


def grouped_mm(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``x`` rows sorted by group (``counts[g]`` rows for group ``g``) times ``w[g]``
    (``(G, in, out)``): one grouped product (``torch._grouped_mm``), else a loop over the
    sorted groups."""
    if _grouped_ok(x, w):
        offs = torch.cumsum(counts, 0).to(torch.int32)
        y = torch.ops.aten._grouped_mm(x, w, offs=offs)
        if y.requires_grad:  # its backward rejects expanded (stride-0) gradients
            y.register_hook(lambda g: g.contiguous())
        return y
    parts = x.split(counts.tolist())
    return torch.cat([p @ w[g] for g, p in enumerate(parts)])


class GroupedExperts(nn.Module):
    """``n`` SwiGLU (or GELU) MLPs with stacked weights, applied to sorted token groups.

    Weights in ``(expert, in, out)`` layout: ``w1``/``w3`` ``(n, h, F)``, ``w2`` ``(n, F, h)``
    (expert ``e``'s ``nn.Linear`` weight is ``w1[e].T``); biases ``w1_bias`` ``(n, F)``, ``w2_bias`` ``(n, h)``...."""

    def __init__(self, spec: ModelSpec, n: int) -> None:
        super().__init__()
        h, f = spec.hidden, spec.ffn_hidden
        self.swiglu = spec.mlp == "swiglu"
        self.w1 = nn.Parameter(torch.empty(n, h, f))
        self.w2 = nn.Parameter(torch.empty(n, f, h))
        self.w3 = nn.Parameter(torch.empty(n, h, f)) if self.swiglu else None
        self.w1_bias = nn.Parameter(torch.empty(n, f)) if spec.bias else None
        self.w2_bias = nn.Parameter(torch.empty(n, h)) if spec.bias else None
        self.w3_bias = nn.Parameter(torch.empty(n, f)) if spec.bias and self.swiglu else None
        self.ep_group = None
        """Set by :func:`~ptd.runtime.parallel.ep.apply_ep`: tokens are dispatched over it."""

    def _bias(self, y: torch.Tensor, b: torch.Tensor | None, counts: torch.Tensor) -> torch.Tensor:
        if b is None:
            return y
        return y + torch.repeat_interleave(_local(b), counts, dim=0, output_size=y.shape[0]).to(y.dtype)

    def compute(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """This rank's experts on ``x`` sorted by local expert (``counts`` rows each)."""
        w1, w2 = _local(self.w1).to(x.dtype), _local(self.w2).to(x.dtype)
        a = self._bias(grouped_mm(x, w1, counts), self.w1_bias, counts)
        if self.w3 is not None:
            # (w1 and w3 fused into one (in, 2F) product measured 3% slower on this CPU: the
            # weight concatenation and the strided halves cost more than the pass it saves)
            g = self._bias(grouped_mm(x, _local(self.w3).to(x.dtype), counts), self.w3_bias, counts)
            a = F.silu(a) * g
        else:
            a = F.gelu(a, approximate="tanh")
        return self._bias(grouped_mm(a, w2, counts), self.w2_bias, counts)

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """``x`` sorted by (global) expert, ``counts`` per global expert. Under autocast the
        rows go to its dtype first, as every ``nn.Linear``'s input does: autocast does not
        reach ``aten._grouped_mm``, which on an fp32 input ran the experts in fp32 (an H200,
        torch 2.11, Mixtral's experts: 0.70 s a layer forward and backward against 17 ms for
        the bf16 grouped products), and under ep the all-to-alls carry half the bytes."""
        x = x.to(compute_dtype(x))
        if self.ep_group is None:
            return self.compute(x, counts)
        from ..parallel.ep import expert_parallel_forward
        return expert_parallel_forward(self, x, counts, self.ep_group)


class _AuxGrad(torch.autograd.Function):
    """Identity on ``out``; in backward also gives ``aux`` the gradient ``scale`` (as if
    ``scale * aux`` had been added to the loss)."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:  # type: ignore[override]
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return grad, torch.full((), ctx.scale, device=grad.device), None


_PAUSED = [False]


def exclude_metadata_inference(schedule: object) -> None:
    """No statistics during a pipeline schedule's metadata inference: in its first step (and
    after an evaluation) ``torch.distributed.pipelining`` runs each stage's forward once on
    stand-in inputs (uninitialised on later stages) to learn shapes (torch 2.13,
    ``_initialize_pp_stages``); those forwards route no real tokens."""
    inner = getattr(schedule, "_initialize_pp_stages", None)
    if inner is None:
        return

    def paused(*args, **kwargs):  # type: ignore[no-untyped-def]
        _PAUSED[0] = True
        try:
            return inner(*args, **kwargs)
        finally:
            _PAUSED[0] = False
    schedule._initialize_pp_stages = paused  # type: ignore[attr-defined]


class MoEStats:
    """Per-step accumulators of one layer (plain tensors, not state)."""

    def __init__(self, n_experts: int, device: torch.device) -> None:
        self.counts = torch.zeros(n_experts, dtype=torch.float64, device=device)
        self.dropped = torch.zeros((), dtype=torch.float64, device=device)
        self.aux = torch.zeros((), dtype=torch.float64, device=device)
        self.z = torch.zeros((), dtype=torch.float64, device=device)
        self.calls = 0


class MoE(nn.Module):
    """Router + grouped routed experts (+ optional shared experts); see the module docstring."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        from .layers import MLP
        self.n_experts, self.top_k = spec.n_experts, spec.top_k
        self.capacity_factor = spec.capacity_factor
        self.aux_coef, self.z_coef = spec.aux_loss_coef, spec.z_loss_coef
        self.router = nn.Linear(spec.hidden, spec.n_experts, bias=False)
        self.experts = GroupedExperts(spec, spec.n_experts)
        self.shared = (nn.ModuleList(MLP(spec) for _ in range(spec.n_shared_experts))
                       if spec.n_shared_experts else None)
        self.aux_scale = 0.0
        """``1 / tokens of this rank's replica per step`` (set by :func:`prepare`)."""
        self.stats: MoEStats | None = None
        self.record = True
        """Accumulate statistics (off on tp ranks other than 0, whose tokens repeat rank 0's)."""

    def route(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(weights (T, k) fp32, chosen (T, k), aux + z loss weighted by their coefficients,
        assignments per expert)``."""
        logits = self.router(flat).float()
        top, chosen = logits.topk(self.top_k, dim=-1)
        weights = top.softmax(dim=-1)
        counts = torch.bincount(chosen.flatten(), minlength=self.n_experts)
        share = counts.float() / chosen.numel()
        aux = self.n_experts * (share * logits.softmax(dim=-1).mean(0)).sum()
        z = torch.logsumexp(logits, dim=-1).pow(2).mean()
        if self._recording():
            self._stats(flat.device).aux += aux.detach().double()
            self.stats.z += z.detach().double()  # type: ignore[union-attr]
            self.stats.counts += counts.double()  # type: ignore[union-attr]
            self.stats.calls += 1  # type: ignore[union-attr]
        return weights, chosen, self.aux_coef * aux + self.z_coef * z, counts

    def _recording(self) -> bool:
        """Training forwards only: not evaluation, not the pipeline's no-grad shape inference
        of its first step, not a checkpointed block's recomputation inside the backward."""
        return (self.training and self.record and not _PAUSED[0] and torch.is_grad_enabled()
                and torch._C._current_graph_task_id() == -1)

    def _stats(self, device: torch.device) -> MoEStats:
        if self.stats is None:
            self.stats = MoEStats(self.n_experts, device)
        return self.stats

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen, aux, counts = self.route(flat)
        expert = chosen.flatten()
        order = torch.argsort(expert, stable=True)  # by expert, earlier tokens first
        if self.capacity_factor > 0:
            order, counts = self._drop(expert, order, counts)
        token = order // self.top_k
        y = self.experts(flat.index_select(0, token), counts)
        y = y * weights.flatten().index_select(0, order)[:, None].to(y.dtype)
        out = torch.zeros_like(flat, dtype=y.dtype).index_add(0, token, y)  # (autocast: as a Linear's)
        if self.shared is not None:
            for mlp in self.shared:
                out = out + mlp(flat)
        if self.training and torch.is_grad_enabled():
            out = _AuxGrad.apply(out, aux, self.aux_scale * flat.shape[0])
        return out.view_as(x)

    def _drop(self, expert: torch.Tensor, order: torch.Tensor, counts: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keep each expert's first ``capacity`` assignments (in token order)."""
        cap = math.ceil(self.capacity_factor * expert.numel() / self.n_experts)
        start = torch.cumsum(counts, 0) - counts
        pos = torch.arange(order.numel(), device=order.device) - start[expert[order]]
        keep = pos < cap
        if self._recording():
            self._stats(order.device).dropped += float(order.numel() - int(keep.sum()))
        return order[keep], counts.clamp(max=cap)


def moe_layers(model: nn.Module) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


def prepare(model: nn.Module, replica_tokens: int, record: bool = True) -> None:
    """Set every MoE layer's auxiliary-loss scale (``1 / replica_tokens``: the runners divide
    the summed token losses of a replica's step by its tokens) and whether it records."""
    for m in moe_layers(model):
        m.aux_scale = 1.0 / replica_tokens
        m.record = record


def step_metrics(model: nn.Module, n_layers: int, device: torch.device, n_experts: int | None = None
                 ) -> dict[str, object]:
    """This step's routing statistics over every rank, then reset; a collective (every rank
    calls it, also ranks without MoE layers); ``{}`` for a dense model.

    ``moe_tokens_per_expert``: assignments per expert summed over layers, micro-batches and
    replicas (before any capacity drop); ``moe_imbalance``: the worst layer's ``max / mean``
    of its assignments per expert (1 is perfect balance); ``moe_dropped``: assignments
    dropped by the capacity limit (and ``moe_dropped_frac`` of all); ``moe_aux_loss`` /
    ``moe_z_loss``: the unweighted losses averaged over layers, micro-batches and replicas."""
    import re

    import torch.distributed as dist
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, MoE)]
    # from the spec when given: every rank must agree on whether this is a collective
    e = n_experts if n_experts is not None else max((m.n_experts for _, m in layers), default=0)
    if not e:
        return {}
    buf = torch.zeros(n_layers, e + 4, dtype=torch.float64, device=device)
    for name, m in layers:
        if m.stats is None:
            continue
        i = int(re.search(r"layers\.(\d+)\.", name).group(1))  # type: ignore[union-attr]
        s = m.stats
        buf[i, :e] = s.counts
        buf[i, e:] = torch.stack([s.dropped, s.aux, s.z, torch.tensor(float(s.calls), dtype=torch.float64,
                                                                      device=device)])
        m.stats = None
    dist.all_reduce(buf)
    counts, calls = buf[:, :e], buf[:, e + 3].sum().clamp(min=1)
    mean = counts.mean(1)
    imbalance = float((counts.max(1).values / mean.clamp(min=1e-9))[mean > 0].max()) if bool((mean > 0).any()) else 1.0
    total = float(counts.sum())
    return {"moe_tokens_per_expert": [int(c) for c in counts.sum(0).tolist()],
            "moe_imbalance": imbalance, "moe_dropped": int(buf[:, e].sum()),
            "moe_dropped_frac": float(buf[:, e].sum()) / total if total else 0.0,
            "moe_aux_loss": float(buf[:, e + 1].sum() / calls), "moe_z_loss": float(buf[:, e + 2].sum() / calls)}

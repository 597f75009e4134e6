"""Megatron-LM's own activation-memory formula, for comparison with ptd's count.

ptd counts activations tensor by tensor (:mod:`ptd.cost.memory`): for a SwiGLU MLP that is
the gate, its SiLU, the up projection and their product (4 s b F / t). Megatron-LM's
``compute_activation_memory`` (megatron/training/theoretical_memory_usage.py, core_r0.19.0)
uses Korthikanti et al. 2022's GPT-block count with sequence parallelism and selective
recompute, ``s b h (18 + 4 F / h)`` bytes per layer, whatever the MLP. For a Llama model
ptd's figure is therefore 10-25% higher; both are reported by ``ptd estimate``.
"""

from __future__ import annotations

from ..specs.model import ModelSpec
from ..specs.plan import ParallelPlan


def megatron_activation_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """Activation bytes on the first pipeline stage by Megatron-LM's formula (it assumes
    sequence parallelism and selective recompute, 16-bit activations):

    * per layer ``s b h (18 + 4 F / h)``, times all ``L`` layers (the first stage holds
      ``L / pp`` layers for ``pp`` micro-batches in flight under 1F1B);
    * dropout mask of the embedding ``8 s b pp`` and its output ``s b h pp``;
    * interleaved schedules: times ``1 + (pp - 1) / (pp v)``; plain 1F1B with fewer
      micro-batches than stages: times ``m / pp``;
    * without a pipeline: the output layer's ``4 s b h (1 + V / h)``;
    all divided by ``t``.
    """
    s, b, h = plan.seq_len, plan.micro_batch, model.hidden
    pp, v, t = plan.pp, plan.stages_per_rank, plan.tp
    act = s * b * h * (18 + 4 * model.ffn_hidden / h) * model.n_layers
    act += 8 * s * b * pp + s * b * h * pp
    if v > 1:
        act *= 1 + (pp - 1) / (pp * v)
    elif pp > 1:
        act *= min(1, plan.n_microbatches / pp)
    if pp == 1:
        act += s * b * h * 4 * (1 + model.padded_vocab(t) / h)
    return act / t


"""Which transformer blocks each pipeline stage holds, and which rank runs each stage: the
placement rule of the pipeline dimension, shared by the cost model, the runtime
(``runtime/parallel/pp.py``) and the exports, as :mod:`ptd.specs.layout` is for ranks.
"""

from __future__ import annotations

import math
from functools import lru_cache

from .model import ModelSpec
from .plan import ParallelPlan


def stage_to_rank(stage: int, plan: ParallelPlan) -> int:
    """Pipeline rank that runs virtual ``stage``: round-robin for interleaved schedules, a V
    (stage ``s`` and ``2p-1-s`` on rank ``s``) for the zero-bubble ZB-V schedule."""
    p = plan.pp
    if is_v_shape(plan):
        return stage if stage < p else 2 * p - 1 - stage
    return stage % p


def is_v_shape(plan: ParallelPlan) -> bool:
    """Whether the plan runs the zero-bubble ZB-V schedule (two stages per rank in a V)."""
    return plan.pp > 1 and plan.schedule == "zero-bubble" and plan.stages_per_rank == 2


def _layer_cost(model: ModelSpec, seq_len: int) -> float:
    """Forward+backward FLOPs per token of one block (the unit of pipeline balance)."""
    return 6.0 * model.matmul_params_per_layer() + 12.0 * seq_len * model.q_dim


def _output_cost(model: ModelSpec) -> float:
    return 6.0 * model.vocab_size * model.hidden


@lru_cache(maxsize=4096)
def stage_split(model: ModelSpec, n_stages: int, seq_len: int,
                balanced: bool = False) -> tuple[int, ...]:
    """Layers per virtual stage, contiguous.

    When the stage count divides the layers and ``balanced`` is off (the plan's
    ``uneven_stages``), the even split -- what Megatron-LM and torchtitan do (Llama-3-70B on
    pp 4: 20/20/20/20). Otherwise (``--uneven-stages``, or layers that do not divide) the
    split that minimises the most expensive stage: the output layer (``6 V h`` FLOPs/token) weighs on the last stage; the embedding lookup
    costs no FLOPs. Every stage gets at least one layer. Ties go to the most even split,
    so with a negligible output layer and ``L`` divisible by the stage count this is the
    even split.
    """
    L = model.n_layers
    if n_stages == 1:
        return (L,)
    if L % n_stages == 0 and not balanced:
        return (L // n_stages,) * n_stages
    if n_stages > L:
        raise ValueError(f"{n_stages} stages need at least as many layers, have {L}")
    unit = _layer_cost(model, seq_len)
    extra = _output_cost(model) / unit  # in layers
    base, extra_layers = divmod(L, n_stages)
    # the remainder goes to the middle stages, so the ends (embedding, output) are lighter
    order = list(range(1, n_stages - 1)) + [0, n_stages - 1]
    even = [base] * n_stages
    for i in order[:extra_layers]:
        even[i] += 1

    def cost(split: list[int]) -> tuple[float, float]:
        loads = [n + (extra if i == n_stages - 1 else 0.0) for i, n in enumerate(split)]
        return (max(loads), sum((x - L / n_stages) ** 2 for x in split))

    best = even
    # Move k layers off the last stage, spread over the first ones (k up to ~extra).
    for k in range(1, min(int(math.ceil(extra)) + 1, even[-1])):
        s = list(even)
        s[-1] -= k
        for j in range(k):
            s[j % (n_stages - 1)] += 1
        if cost(s) < cost(best):
            best = s
    return tuple(best)

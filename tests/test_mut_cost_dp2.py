"""cost/dp.py: ZeRO-1/2 on a pipeline rank that holds blocks and nothing else (written from
the survivors of a sampled mutation run, seed 20261130). Torch-free; each expected value is
hand arithmetic.

Llama-2-13B (Touvron et al. 2023: 40 layers, hidden 5120, MLP 13824, vocab 32,000, no
tied embeddings): a block holds 4 x 5120^2 (attention) + 3 x 5120 x 13824 (SwiGLU) +
2 x 5120 (norms) = 104,857,600 + 212,336,640 + 10,240 = 317,204,480 parameters -- 1.27 GB
of fp32, more than FSDP's 25 MiB unit, so every block is its own unit. Over pp = 3 the 40
layers split 13 / 14 / 13; the first rank holds 13 blocks + the 163,840,000-parameter
embedding (4,287,498,240), the last 13 blocks + the output layer and final norm
(4,287,503,360), the middle one 14 blocks (4,440,862,720) and nothing else: the heaviest
rank, whose root FSDP unit is empty.
"""

from __future__ import annotations

import pytest

from test_cost_dp import GPU, blk, mb

from ptd.cost import params as P
from ptd.cost.dp import dp_terms
from ptd.specs import ParallelPlan, get_preset

L13 = get_preset("llama2-13b")
BLOCK = 317_204_480


def coll(kind, nbytes, n, hw, nodes=1, per_node=None):  # noqa: ANN001
    """A stand-in that, like ``comm.collective_time``, prices an empty buffer at nothing and
    any other at a 1 ms latency plus bytes / 1e9."""
    return 0.0 if nbytes <= 0 else 1e-3 + nbytes / 1e9


# Kills: dp.py:122 NumberReplacer, ``max(0, ...)`` -> ``max(1, ...)`` in _zero12's root (a
# one-parameter root unit, gathered and reduce-scattered at a latency each, where the heaviest
# rank has no root parameters at all).
# Expected, by hand: 14 units, no root. bf16 gather of a block 2 x 317,204,480 B = 0.63440896
# s + 1 ms = 0.63540896 s; fp32 reduce-scatter 4 x 317,204,480 B = 1.26881792 s + 1 ms =
# 1.26981792 s. Under a pipeline every reduce-scatter is deferred to the schedule's end and
# shows; the forward's gathers hide behind the previous block's 0.5 s forward past the first.
@pytest.mark.parametrize("zero", [1, 2])
def test_zero12_heaviest_pipeline_rank_holds_only_blocks(zero):
    p = ParallelPlan(pp=3, dp=2, zero=zero, micro_batch=1, global_batch=4, dtype="bf16")
    # the inputs as the docstring works them out (not the results under test)
    assert P.layers_per_rank(L13, p) == (13, 14, 13)
    assert P.max_local_numel(L13, p) == 14 * BLOCK
    ag_u, rs_u = 1e-3 + 2 * BLOCK / 1e9, 1e-3 + 4 * BLOCK / 1e9
    assert (ag_u, rs_u) == pytest.approx((0.63540896, 1.26981792), rel=1e-12)
    t = dp_terms(L13, p, GPU, mb(nl=14, block=blk(0.5, 1.0)), (2, 1, 2), coll, True, True)
    # 14 gathers + 14 reduce-scatters: 8.89572544 + 17.77745088
    assert t.total == pytest.approx(26.67317632, rel=1e-12)
    # first gather, 13 x 0.13540896 s past the forward, all 14 reduce-scatters:
    # 0.63540896 + 1.76031648 + 17.77745088
    assert t.exposed == pytest.approx(20.17317632, rel=1e-12)
    assert t.opt_comm == 0.0

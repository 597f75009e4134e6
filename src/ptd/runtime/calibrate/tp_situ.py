"""Tensor parallelism's collectives timed in place, in ptd's own tp model (CPU).

The cost model prices a tp all-reduce from parts timed apart: the all-reduce fit (calls back
to back), DTensor's extra over the plain call (``bench.dtensor_reduce_curve``, back to back)
and the wait a blocking collective adds after a chunk of 256 x 256 products
(``bench.blocking_curve``). In ptd's tp model on the 2-core EPYC the collectives cost
~24% more than those parts add up to, at 1 and at 2 MiB (2026-11-29: a tp-2 rank of
``small``, 16 x 128 tokens, took 412-414 ms a forward and backward against 272-277 on a
one-rank mesh at the same local shapes, 33 all-reduces, priced 105 ms;
``docs/data/epyc2-2026-11-29h/``). This stage times what the parts miss: the calibration's
own tp model (:data:`SITU_MODEL`, not the user's) on a real pair and on a one-rank mesh, and
the all-reduces the pair issues, by size. :func:`ptd.runtime.calibrate.profile.tp_residual`
turns that into the seconds each tp collective adds beyond its priced parts. Only on a pair
with the other workers idle: with four busy (two pairs at once) it read twice as much at
2 MiB, and a pipeline keeps only some of its workers busy, so that figure priced no layout
of the bench grid right (``HardwareSpec.tp_situ_measured``).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any

from ...specs.model import ModelSpec

SITU_MODEL = ModelSpec(name="calibration-tp", n_layers=2, hidden=256, n_heads=8,
                       n_kv_heads=4, ffn_hidden=704, vocab_size=256, max_seq_len=256)
"""The model the stage times: two blocks at the widths of ``small``, ptd's default CPU model
(hidden 256, SwiGLU 704, 8 heads of 32, 4 kv heads, vocabulary 256), as the DTensor-share
stage takes them; fixed, not ``--model``'s, and at its own token counts (``ptd bench
scaling``'s grid runs four blocks at 16 x 128)."""
SITU_SEQ = 256
"""The stage's sequence length (``ptd train``'s default)."""
SITU_MICRO_BATCHES = (2, 4, 8)
"""Its micro-batches: all-reduces of 0.5, 1 and 2 MiB of fp32 activations (``ptd train``'s
default is 4), and chunks of work between them that grow alike."""
SITU_ROUNDS = 10
"""Rounds of (tp pair, one-rank mesh) steps at each micro-batch; the medians are kept."""


def _local(spec: ModelSpec, tp: int) -> ModelSpec:
    """The shapes one rank of ``tp`` holds (heads, MLP and vocabulary cut ``tp`` ways)."""
    return dataclasses.replace(spec, n_heads=spec.n_heads // tp,
                               n_kv_heads=max(1, spec.n_kv_heads // tp),
                               ffn_hidden=spec.ffn_hidden // tp,
                               vocab_size=spec.padded_vocab(tp) // tp, vocab_multiple=1)


def tp_situ(rank: int, n_active: int, pg: Any, one_pg: Any, barrier: Any, timeout: float,
            rounds: int = SITU_ROUNDS, spec: ModelSpec = SITU_MODEL, seq: int = SITU_SEQ,
            micro_batches: tuple[int, ...] = SITU_MICRO_BATCHES) -> list[dict[str, Any]] | None:
    """Ranks ``0..n_active-1`` in pairs (``pg``: this rank's pair; ``one_pg``: a group of
    this rank alone): each round times one forward and backward of ``spec``'s tp-2 model
    on the pair (what ``ptd train --tp 2`` runs: ``apply_tp``, ``loss_parallel``) and one
    of the same rank's local shapes on a one-rank mesh (what the cost model prices a tp
    rank's computation from: no collective issues a message), each after a barrier of the
    pair, at each of ``micro_batches`` (x ``seq`` tokens). One step more counts the pair's
    all-reduces by size, through the functional collective every DTensor reduction calls.
    Returns, by micro-batch, ``{"tokens": n, "tp": s, "one": s, "all_reduces": [[bytes,
    calls], ...]}`` (medians over ``rounds``), None on ranks outside the active pairs."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import loss_parallel

    from ...specs.plan import ParallelPlan
    from ..model.init import materialize
    from ..model.transformer import build_model, lm_loss_sum
    from ..parallel.tp import apply_tp
    barrier.wait(timeout)
    if rank >= n_active:
        return None
    plan = ParallelPlan(tp=2, seq_len=seq)
    pair = build_model(spec, "meta", tp=2)
    apply_tp(pair, DeviceMesh.from_group(pg or dist.group.WORLD, "cpu"), plan)
    materialize(pair, "cpu", 0)
    loc = _local(spec, 2)
    one = build_model(loc, "meta")
    apply_tp(one, DeviceMesh.from_group(one_pg, "cpu"), dataclasses.replace(plan, tp=1))
    materialize(one, "cpu", 0)
    g = torch.Generator().manual_seed(0)  # the pair's ranks read the same tokens, as tp ranks do

    def step(m: Any, x: Any) -> float:
        dist.barrier(group=pg)
        t0 = time.perf_counter()
        with loss_parallel():
            (lm_loss_sum(m(x), x) / x.numel()).backward()
        t = time.perf_counter() - t0
        for p in m.parameters():
            p.grad = None
        return t

    real = funcol.all_reduce
    out = []
    for mb in micro_batches:
        x = torch.randint(0, loc.vocab_size, (mb, seq), generator=g)
        for _ in range(2):
            step(pair, x), step(one, x)
        sizes: dict[int, int] = {}

        def counted(t: Any, *a: Any, **k: Any) -> Any:
            b = t.numel() * t.element_size()
            sizes[b] = sizes.get(b, 0) + 1
            return real(t, *a, **k)
        funcol.all_reduce = counted
        try:
            step(pair, x)
        finally:
            funcol.all_reduce = real
        t_pair, t_one = [], []
        for _ in range(rounds):
            t_pair.append(step(pair, x))
            t_one.append(step(one, x))
        out.append({"tokens": mb * seq, "tp": statistics.median(t_pair),
                    "one": statistics.median(t_one),
                    "all_reduces": sorted([b, n] for b, n in sizes.items())})
    return out

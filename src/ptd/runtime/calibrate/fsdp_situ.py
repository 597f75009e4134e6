"""ZeRO-3's work timed in place, in ptd's own model (CPU).

The cost model prices what FSDP2 adds to a ZeRO-3 step from parts timed apart: the
all-gather and all-reduce fits (calls back to back), the late-peer wait a blocking
collective adds after a chunk of work (``bench.blocking_curve``), the copies in and out of
FSDP's buffers at the measured memory bandwidth (``cost.dp.fsdp_copy_time``) and its per-unit
hooks timed on units of 8 x 8 parameters (``bench.fsdp_unit_group_costs``). In ``ptd bench
scaling``'s ZeRO-3 over 2 on the 2-core EPYC those parts fall short: against DDP over 2 at
the same local batch, ZeRO-3 added 64.5 ms a step where they priced 44.5 (the mean of 30
benches, 2026-11-29/30, ``docs/data/epyc2-2026-11-30/zero3_vs_ddp.py``) -- the shape tp's
collectives had before ``tp_situ.py``. This stage times what the parts miss, on the
calibration's own model (:data:`ptd.runtime.calibrate.tp_situ.SITU_MODEL`, not the user's):
its ZeRO-3 forward and backward on a real pair against the same model without FSDP on the
same ranks at the same local batch. :func:`ptd.runtime.calibrate.profile.fsdp_residual`
turns that into seconds per gather beyond the priced parts
(``HardwareSpec.fsdp_situ_measured``). Only on a pair with the other workers idle, as the tp
stage: larger groups and busier nodes are not measured and not priced.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from ...specs.model import ModelSpec
from .tp_situ import SITU_MODEL, SITU_SEQ

FSDP_SITU_MICRO_BATCH = 4
"""Sequences of :data:`SITU_SEQ` tokens a rank runs a step: 1024 tokens, the local batch of
``ptd bench scaling``'s ZeRO-3 over 2 (8 x 128) and of ``ptd train``'s default (4 x 256)."""
FSDP_SITU_ROUNDS = 12
"""Rounds of (ZeRO-3 pair, plain) steps; the medians are kept. About 0.3 s a round on the
2-core EPYC (the stage ~4 s)."""


def fsdp_situ(rank: int, n_active: int, pg: Any, barrier: Any, timeout: float,
              rounds: int = FSDP_SITU_ROUNDS, spec: ModelSpec = SITU_MODEL,
              seq: int = SITU_SEQ, micro_batch: int = FSDP_SITU_MICRO_BATCH
              ) -> dict[str, Any] | None:
    """Ranks ``0..n_active-1`` in groups (``pg``: this rank's group, None: the world): each
    round times one forward and one backward of ``spec`` under ptd's ZeRO-3
    (``apply_fsdp``: a unit a block and the root, gloo's ``AllReduceScatter``; what ``ptd
    train --zero 3`` runs) and of the same model without FSDP (what the cost model prices a
    ZeRO-3 rank's computation from), each after a barrier of the group, at ``micro_batch``
    sequences of ``seq`` tokens a rank. Returns ``{"tokens": n, "units": u, "unit_bytes": b,
    "fsdp": [forward, backward], "plain": [forward, backward]}`` (medians over ``rounds``;
    ``u`` the units, ``b`` the fp32 bytes a block's unit gathers), None on ranks outside the
    active groups."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from ...specs.plan import ParallelPlan
    from ..model.init import materialize
    from ..model.transformer import build_model, lm_loss_sum
    from ..parallel.fsdp import apply_fsdp
    barrier.wait(timeout)
    if rank >= n_active:
        return None
    dp = dist.get_world_size(pg) if pg is not None else n_active
    plan = ParallelPlan(dp=dp, zero=3, seq_len=seq, micro_batch=micro_batch,
                        global_batch=micro_batch * dp)
    sharded = build_model(spec, "meta")
    apply_fsdp(sharded, DeviceMesh.from_group(pg or dist.group.WORLD, "cpu"), plan,
               torch.device("cpu"))
    materialize(sharded, "cpu", 0)
    plain = build_model(spec, "meta")
    materialize(plain, "cpu", 0)
    block = sum(p.numel() for p in plain.layers["0"].parameters())
    x = torch.randint(0, spec.vocab_size, (micro_batch, seq),
                      generator=torch.Generator().manual_seed(rank))

    def step(m: Any) -> tuple[float, float]:
        dist.barrier(group=pg)
        t0 = time.perf_counter()
        loss = lm_loss_sum(m(x), x) / x.numel()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        for p in m.parameters():
            p.grad = None
        return t1 - t0, t2 - t1

    for _ in range(2):
        step(sharded), step(plain)
    got: dict[str, list[tuple[float, float]]] = {"fsdp": [], "plain": []}
    for _ in range(rounds):
        got["fsdp"].append(step(sharded))
        got["plain"].append(step(plain))
    out: dict[str, Any] = {"tokens": micro_batch * seq, "units": spec.n_layers + 1,
                           "unit_bytes": 4.0 * block}
    for k, ts in got.items():
        out[k] = [statistics.median(t[i] for t in ts) for i in (0, 1)]
    return out

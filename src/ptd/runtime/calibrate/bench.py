"""What one calibration worker measures (runs inside a worker process; torch here).

Compute points run on the first ``n`` workers at once. Every point starts behind a barrier,
times calls for a fixed wall-clock window, and then keeps calling until all ``n`` workers
have closed their windows, so no worker's window ever runs with the machine to itself.
Collectives run on every worker: ``n_max / g`` disjoint groups of ``g`` at once, as in a
training run where every rank sits in some group.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import statistics
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ...cost.step import EP_ROW_ALL_TO_ALLS
from .profile import BLOCKING_SIDE
from .fsdp_situ import fsdp_situ
from .tp_situ import tp_situ

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Sync:
    """Start ``n`` workers together; keep each busy until the others are done."""

    def __init__(self, n: int, rank: int, barrier: Any, counter: Any, flag: Any,
                 sync: Callable[[], None], timeout: float, pause: float = 0.0):
        self.n, self.rank, self.barrier, self.counter, self.flag = n, rank, barrier, counter, flag
        self.sync, self.timeout, self.points = sync, timeout, 0
        self.pause = pause
        """Idle seconds before each window (GPUs): a card running products back to back
        for more than a fraction of a second is held at its power limit (an H200: 678
        against ~790 TFLOP/s, docs/gpu-h100.md), which a training step -- its products
        interleaved with memory-bound kernels -- is not; each window starts rested."""

    def agree(self, decision: bool) -> bool:
        """Rank 0's ``decision``, seen by all ``n`` (they must take the same branches). Its
        next write comes after the next window's barrier, which every reader passes first."""
        if self.n == 1:
            return decision
        if self.rank == 0:
            self.flag.value = int(decision)
        self.barrier.wait(self.timeout)
        return bool(self.flag.value)

    def window(self, fn: Callable[[], Any], seconds: float, batch: int) -> float:
        """Seconds per call of ``fn`` over one window run on all ``n`` workers at once."""
        if self.pause:
            time.sleep(self.pause)
        if self.n > 1:
            self.barrier.wait(self.timeout)
        reps, t0 = 0, time.perf_counter()
        while True:
            for _ in range(batch):
                fn()
            self.sync()
            reps += batch
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds:
                break
        self.points += 1
        if self.n > 1:
            with self.counter.get_lock():
                self.counter.value += 1
            while self.counter.value < self.points * self.n:
                fn()
                self.sync()
        return elapsed / reps

    def time(self, fn: Callable[[], Any], seconds: float, repeats: int) -> float:
        """Seconds per call: the fastest of ``repeats`` windows (after a warm-up call). Every
        window has all ``n`` workers busy by construction, so the fastest is the one least
        disturbed by processes outside the calibration."""
        batch = self._batch(fn, seconds)
        per_call = [self.window(fn, seconds, batch) for _ in range(repeats)]
        if self.n > (os.cpu_count() or 1):
            # More workers than cores: the OS time-slices them, and each worker's luckiest
            # window is another's unluckiest, so a per-worker minimum overstates every
            # worker's share (4 workers on 2 cores "measured" 215 GFLOP/s of a 2x91 box).
            # Over all windows the scheduler is fair: average them.
            return sum(per_call) / len(per_call)
        return min(per_call)

    def pairs(self, a: Callable[[], Any], b: Callable[[], Any], seconds: float,
              repeats: int) -> list[tuple[float, float]]:
        """Seconds per call of ``a`` and of ``b`` in ``repeats`` pairs of windows, ``a``'s
        then ``b``'s, alternated (after a warm-up call of each). For a difference of two
        timings: the pair's windows meet the same state of the machine, where
        :meth:`time`'s fastest windows of one and then of the other can come from minutes
        apart -- and this VM's memory bandwidth holds one of two modes for tens of seconds
        (docs/data/epyc2-2026-11-29f/memory_modes.txt)."""
        ba, bb = self._batch(a, seconds), self._batch(b, seconds)
        return [(self.window(a, seconds, ba), self.window(b, seconds, bb))
                for _ in range(repeats)]

    def _batch(self, fn: Callable[[], Any], seconds: float) -> int:
        """Calls of ``fn`` between clock reads in a window of ``seconds``: a tenth of it,
        from one timed call after a warm-up one."""
        fn()
        self.sync()
        t = time.perf_counter()
        fn()
        self.sync()
        return max(1, min(2000, int(seconds / 10 / max(time.perf_counter() - t, 1e-7))))


def _three_layouts(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
    """The three products of a linear layer's training step, as many FLOPs each: forward
    ``X W^T``, input gradient ``dY W``, weight gradient ``dY^T X``. Layouts run at very
    different rates on some CPUs (bf16 without bf16 units: 0.5 / 4 / 10 GFLOP/s)."""
    torch.mm(a, b.t(), out=c)
    torch.mm(a, b, out=c)
    torch.mm(a.t(), b, out=c)


def _memory(nel: int, device: torch.device, sync: Sync, T: float, rep: int) -> dict:
    """Seconds per large copy (reads and writes ``4 nel`` bytes each), add (2 reads, 1
    write) and activation -- SiLU forward (1 read, 1 write) then its gradient (2 reads, 1
    write) --, fp32, far larger than the caches."""
    x, y, z = (torch.ones(nel, device=device) for _ in range(3))

    def activation() -> None:
        torch.ops.aten.silu.out(x, out=z)
        torch.ops.aten.silu_backward.grad_input(y, x, grad_input=z)
    return {"copy": sync.time(lambda: z.copy_(x), T, rep),
            "add": sync.time(lambda: torch.add(x, y, out=z), T, rep),
            "activation": sync.time(activation, T, rep)}


def memory_point(plan: dict, device: torch.device, sync: Sync) -> dict[str, float]:
    """One moment's :func:`_memory` seconds on one of ``sync.n`` workers, in windows of half
    the plan's. ``ptd calibrate`` takes one at several moments and prices their mean: on a
    2-core VM (2026-11-29, docs/data/epyc2-2026-11-29f/) two workers copied at 21 or at 41
    GB/s each, one mode for tens of seconds to minutes, the matmul rate unmoved; a run
    meets both, a single moment one."""
    return _memory(plan["mem_bytes"] // 4, device, sync, plan["window_s"] / 2, plan["repeats"])


def model_op_cost(fields: dict, sync: Sync, T: float, rep: int) -> float:
    """Seconds per operator of ptd's own model (``fields``: :func:`.workers.op_model`, widths
    too small for the work to count): one sequence of 8 tokens forward, loss and backward,
    gradients cleared as the trainer clears them, over the operators it dispatches (counted
    with a TorchDispatchMode, as :mod:`ptd.cost.compute`'s counts are). Python, the modules,
    autograd and each operator's fixed cost together: about 3x a bare ``torch.add`` on the
    CPUs of docs/calibration.md, whose mean priced an operator before (2026-11-27)."""
    from ...specs.model import ModelSpec
    from ..measure.opcount import OpCounter
    from ..model.init import materialize
    from ..model.transformer import build_model
    spec = ModelSpec(**fields)
    model = build_model(spec, "meta")
    materialize(model, torch.device("cpu"), seed=0)
    params = list(model.parameters())
    x = torch.randint(0, spec.vocab_size, (1, 8))
    y = torch.randint(0, spec.vocab_size, (1, 8))

    def step() -> None:
        for p in params:
            p.grad = None
        logits = model(x)
        F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1)).backward()
    step()
    with OpCounter() as c:
        step()
    return sync.time(step, T, rep) / max(1, c.total)


OPT_SIDE = 256
"""Side of the square parameters whose optimizer phase gives ``optimizer_param``."""


def model_dtensor_cost(fields: dict, sync: Sync, T: float, rep: int) -> float:
    """Seconds each operator on a DTensor adds in ptd's own tensor-parallel model
    (``fields``: :func:`.workers.op_model`): one block, then the output layer with the loss,
    forward and backward on 8 tokens, with tensor parallelism applied on a one-rank mesh
    against the same model without it, over the operators on DTensors counted in it (the
    counter behind the cost model's ``OPS_TP_*``, ``ptd.runtime.measure.opcount``). Sharding
    propagation, redistribution and wrapping, as a tensor-parallel run pays them: ~10x a
    1-element add on a replicated DTensor, which priced them before (2026-11-27). Needs a
    process group (a world of one)."""
    import contextlib
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel
    from ...specs import ParallelPlan
    from ...specs.model import ModelSpec
    from ..measure.opcount import DTensorOpCounter
    from ..model.init import materialize
    from ..model.transformer import build_model, lm_loss_sum
    from ..parallel.tp import apply_tp
    spec = ModelSpec(**fields)

    def build(tp: bool) -> torch.nn.Module:
        model = build_model(spec, "meta")
        if tp:
            apply_tp(model, init_device_mesh("cpu", (1,)), ParallelPlan(tp=1, seq_len=8))
        materialize(model, torch.device("cpu"), seed=0)
        return model
    x = torch.randn(1, 8, spec.hidden, requires_grad=True)
    h = torch.randn(1, 8, spec.hidden, requires_grad=True)
    t = torch.randint(0, spec.vocab_size, (1, 8))

    def once(model: torch.nn.Module, loss_ctx: Callable[[], Any]) -> None:
        rope = (model.rope_cos, model.rope_sin) if model.rope_cos is not None else None
        y = model.layers["0"](x, rope)
        y.backward(torch.ones_like(y))
        with loss_ctx():
            lm_loss_sum(model.output(model.norm(h)), t).backward()
    plain, tp = build(False), build(True)
    once(tp, loss_parallel)
    with DTensorOpCounter() as c:
        once(tp, loss_parallel)
    extra = (sync.time(lambda: once(tp, loss_parallel), T, rep)
             - sync.time(lambda: once(plain, contextlib.nullcontext), T, rep))
    return max(0.0, extra) / max(1, c.dtensor)


DTENSOR_SHARE_TOKENS = (64, 1024)
"""Tokens of the two steps :func:`model_dtensor_share` times (one sequence each)."""
DTENSOR_SHARE_WINDOWS = 15
"""Pairs of windows at each token count, at least: the share is a few percent of the step.
Five stages each, one worker, 2-core EPYC (2026-11-29): 7 pairs read 1.6-7.1%, 15 pairs
3.0-5.8% (3.7 and 6.7 s a stage; docs/data/epyc2-2026-11-29g/share_noise.py)."""


def model_dtensor_share(fields: dict, sync: Sync, T: float, rep: int) -> float:
    """How much slower a model's work runs on DTensors than on plain tensors, beyond
    :func:`model_dtensor_cost`'s fixed cost an operator: ptd's model with ``fields``'
    architecture, dense, at the ``small`` preset's widths (hidden 256, 8 heads, F 704, 2
    layers, vocabulary 256), whole (embedding, blocks, output layer with the loss), forward and
    backward, with tensor parallelism on a one-rank mesh and without, at the two token
    counts of :data:`DTENSOR_SHARE_TOKENS`: the growth of tp's extra time between them over
    the growth of the plain model's time, not below 0. Each extra is the median over pairs
    of windows, tp's then the plain model's (:meth:`Sync.pairs`): the fastest window of each
    timed apart read ~4% on the 2-core EPYC where the pairs' median read 8% (3.5-11.9, six
    runs, 2026-11-29; docs/measuring.md "Twenty-fourth session"). The operators on DTensors are the same
    at both sizes, so their fixed cost cancels. Why a share of the work: on a 2-core EPYC
    (2026-11-29, docs/measuring.md "Twenty-fourth session") the small model's extra grew
    from 12 ms at 8 tokens to 37-54 at 2,048 (two plain models: -1 to +3 ms) with the same
    391 operators, the profiler found no extra work on large tensors, and the products ran
    slower in a tp step than in a plain one (the twenty-third session); so the work itself runs
    slower, by a share the cost model applies to a tp rank's block and output layer (a tp 2
    rank of the bench's small model: DTensor without its communication 32-39 ms above the
    plain local shapes). Needs a process group."""
    import contextlib
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel
    from ...specs import ParallelPlan
    from ...specs.model import ModelSpec
    from ..model.init import materialize
    from ..model.transformer import build_model, lm_loss_sum
    from ..parallel.tp import apply_tp
    small, large = DTENSOR_SHARE_TOKENS
    kv = 8 if fields["n_kv_heads"] == fields["n_heads"] else 4
    # dense: a MoE model's experts at these widths would be a large model (and its
    # layer is timed on its own, moe_layer_times)
    spec = ModelSpec(**{**fields, "name": f"{fields['name']}-share", "n_layers": 2,
                        "hidden": 256, "n_heads": 8, "n_kv_heads": kv, "ffn_hidden": 704,
                        "vocab_size": 256, "max_seq_len": large, "n_experts": 0, "top_k": 0,
                        "n_shared_experts": 0, "capacity_factor": 0.0})

    def build(tp: bool) -> torch.nn.Module:
        model = build_model(spec, "meta")
        if tp:
            apply_tp(model, init_device_mesh("cpu", (1,)), ParallelPlan(tp=1, seq_len=large))
        materialize(model, torch.device("cpu"), seed=0)
        return model
    plain, tp = build(False), build(True)
    gen = torch.Generator().manual_seed(0)
    windows = max(rep, DTENSOR_SHARE_WINDOWS)

    def times(tokens: int) -> tuple[float, float]:
        """(tp's extra, the plain model's time): medians over the pairs of windows."""
        x = torch.randint(0, spec.vocab_size, (1, tokens), generator=gen)

        def once(model: torch.nn.Module, ctx: Callable[[], Any]) -> None:
            with ctx():
                lm_loss_sum(model(x), x).backward()
            for p in model.parameters():
                p.grad = None
        pairs = sync.pairs(lambda: once(tp, loss_parallel),
                           lambda: once(plain, contextlib.nullcontext), T, windows)
        return (statistics.median(a - b for a, b in pairs),
                statistics.median(b for _, b in pairs))
    extra_s, plain_s = times(small)
    extra_l, plain_l = times(large)
    grown = plain_l - plain_s
    return max(0.0, extra_l - extra_s) / grown if grown > 0 else 0.0


def framework_overheads(sync: Sync, T: float, rep: int, n_tensors: int = 16,
                        op_fields: dict | None = None, measure_share: bool = False) -> dict:
    """Seconds of framework overhead on a CPU (see ``HardwareSpec.overheads_measured``):
    an operator on a DTensor beyond a plain one (in ptd's own tensor-parallel model where
    ``op_fields`` name it: :func:`model_dtensor_cost`; else a 1-element add and an in-place
    product on a replicated DTensor), and one parameter tensor's and one parameter's share
    of the trainer's optimizer phase (global gradient norm, clipping, single-tensor AdamW)
    on plain and on DTensor (``Shard(0)``) parameters; with ``measure_share`` and
    ``op_fields``, how much slower a model's work runs on DTensors
    (:func:`model_dtensor_share`). DTensors live on a one-rank mesh of a private process
    group (made and destroyed here, before the collectives' group exists)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from ..optim import clip_grads_, global_grad_norm
    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        one, two = torch.ones(1), torch.ones(1)
        d_one, d_two = (distribute_tensor(torch.ones(1), mesh, [Replicate()]) for _ in range(2))
        plain = sync.time(lambda: (torch.add(one, two), one.mul_(1.0)), T, rep)
        dt = sync.time(lambda: (torch.add(d_one, d_two), d_one.mul_(1.0)), T, rep)

        def opt_time(make: Callable[[torch.Tensor], torch.Tensor], side: int = 8) -> float:
            params = [torch.nn.Parameter(make(torch.randn(side, side))) for _ in range(n_tensors)]
            for p in params:
                p.grad = make(torch.randn(side, side)) * 10  # norm > 1: clipping scales
            opt = torch.optim.AdamW(params, lr=1e-4, foreach=False)

            def phase() -> None:
                norm = global_grad_norm(params, torch.device("cpu"))
                clip_grads_(params, 1.0, norm)
                opt.step()
            phase()
            return sync.time(phase, T, rep) / n_tensors
        per_tensor = opt_time(lambda t: t)
        # the same phase on tensors of 256 x 256 (the default CPU model's size): what each
        # parameter adds. Unfused AdamW runs eight operators over a tensor (84 bytes a
        # parameter, and 20 for the norm and clipping), and a tensor this size stays in the
        # cache between them, so a count of bytes at the copy bandwidth does not price it
        # (docs/measuring.md, "The optimizer phase on a CPU")
        per_param = max(0.0, opt_time(lambda t: t, OPT_SIDE) - per_tensor) / OPT_SIDE**2
        dtensor_op = (model_dtensor_cost(op_fields, sync, T, rep) if op_fields
                      else max(0.0, (dt - plain) / 2))
        # and how much slower the work runs on DTensors (not measured without the model)
        share = ({"dtensor_compute_share": model_dtensor_share(op_fields, sync, T, rep)}
                 if op_fields and measure_share else {})
        # the same on DTensor shards, as FSDP, tensor and expert parallelism make the
        # parameters (each parameter costs more through DTensor's operators: 3.3 against
        # 2.3 ns at 256 x 256 on this CPU, 2026-11-27)
        def shard(t: torch.Tensor) -> torch.Tensor:
            return distribute_tensor(t, mesh, [Shard(0)])
        per_tensor_dt = opt_time(shard)
        per_param_dt = max(0.0, opt_time(shard, OPT_SIDE) - per_tensor_dt) / OPT_SIDE**2
        return {"dtensor_op": dtensor_op, **share,
                "optimizer_tensor": per_tensor,
                "optimizer_param": per_param,
                "optimizer_tensor_dtensor": per_tensor_dt,
                "optimizer_param_dtensor": per_param_dt,
                **fsdp_unit_costs(mesh, sync, T, rep), **ep_layer_costs(sync, T, rep)}
    finally:
        if made:
            dist.destroy_process_group()


FSDP_BLOCKS = 8


def fsdp_unit_costs(mesh: Any, sync: Sync, T: float, rep: int) -> dict[str, float]:
    """FSDP2's own cost per unit and micro-batch, beyond the work it wraps: its hooks, the
    unit's gather and release, and its gradient reduction, on a one-rank mesh with units of
    8 x 8 parameters (their copies and collectives cost next to nothing, so what is left
    is the per-unit work the cost model prices nowhere else; the copies and collectives at
    a model's sizes are priced on their own). :data:`FSDP_BLOCKS` blocks, each a unit as
    ptd's ZeRO-3 makes them, and a root unit over a norm weight, with ptd's gloo reduction
    (``AllReduceScatter``); forward and backward timed apart, less the same model without
    FSDP. ``fsdp_unit_*``: resharded after the forward (ZeRO-3);
    ``fsdp_unit_keep_*``: kept (ZeRO-1/2), each backward reducing."""
    x = torch.randn(4, FSDP_SIDE)

    def split_time(m: torch.nn.Module) -> tuple[float, float]:
        return _forward_backward_time(lambda: m(x), sync, T, rep)

    plain_f, plain_b = split_time(_FsdpModel())
    out: dict[str, float] = {}
    for reshard, key in ((True, "fsdp_unit"), (False, "fsdp_unit_keep")):
        m = _fsdp_model(mesh, reshard)
        f, b = split_time(m)
        out[f"{key}_forward"] = max(0.0, f - plain_f) / FSDP_UNITS
        out[f"{key}_backward"] = max(0.0, b - plain_b) / FSDP_UNITS
    return out


FSDP_UNITS = FSDP_BLOCKS + 1
"""Units of the calibration's FSDP model: a unit a block and the root."""
FSDP_SIDE = 8
"""Width of the calibration's FSDP model: its blocks are linear layers of this square side."""


class _FsdpModel(torch.nn.Module):
    """The calibration's FSDP model, in ptd's shape (blocks in ``layers``, the rest in the
    root): :data:`FSDP_BLOCKS` square linear layers of :data:`FSDP_SIDE` and a norm weight."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleDict({str(i): torch.nn.Linear(FSDP_SIDE, FSDP_SIDE)
                                           for i in range(FSDP_BLOCKS)})
        self.norm = torch.nn.Parameter(torch.ones(FSDP_SIDE))

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            y = layer(y)
        return (y * self.norm).sum()


def _fsdp_model(mesh: Any, reshard: bool) -> torch.nn.Module:
    """:class:`_FsdpModel` under ptd's FSDP2 on ``mesh``: a unit a block and the root, gloo's
    reduction as ptd's runtime does it (``AllReduceScatter``)."""
    from torch.distributed.fsdp import fully_shard

    from ..parallel.fsdp import AllReduceScatter
    m = _FsdpModel()
    for u in [*m.layers.values(), m]:
        fully_shard(u, mesh=mesh, reshard_after_forward=reshard)
        u.set_custom_reduce_scatter(AllReduceScatter())  # type: ignore[operator]
    return m


def fsdp_collectives(reshard: bool, g: int) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """The collectives FSDP2 issues for :func:`_fsdp_model` over a group of ``g`` (forward,
    backward), each ``(kind, elements)``: ``("ag", n)`` an all-gather of ``n`` elements a
    rank (a unit's flat shard: each parameter cut on its first dimension into ``g`` shards
    of ``r = ceil(side / g)`` rows, padded -- a block's weight and bias ``(side + 1) r``, the
    root's norm ``r``; side :data:`FSDP_SIDE`), ``("ar", n)`` an all-reduce of ``g`` such shards (``AllReduceScatter``: the
    unit's padded flat gradient). Every unit gathers before its forward (the root first:
    its forward starts first), resharded ones again before their backward (the root too: it
    is resharded as asked, torch 2.13), and every unit reduces
    (``tests/test_calibrate_fsdp_group.py`` counts them on two and three ranks)."""
    r = -(-FSDP_SIDE // g)
    block = (FSDP_SIDE + 1) * r
    gathers = [("ag", r)] + [("ag", block)] * FSDP_BLOCKS
    return gathers, ((gathers if reshard else []) + [("ar", block * g)] * FSDP_BLOCKS
                     + [("ar", r * g)])


def fsdp_unit_group_costs(rank: int, n_active: int, pg: Any, barrier: Any, timeout: float,
                          rounds: int) -> dict[str, float] | None:
    """:func:`fsdp_unit_costs` on a real group: ranks ``0..n_active-1`` form ``pg`` (None:
    the world), the others only pass the barrier. On a one-rank mesh FSDP2 issues none of
    its collectives and runs none of the work around them (gathering into and out of the
    flat buffers, waiting, reducing), which every ZeRO run pays: on the 2-core EPYC
    (2026-11-29, ``docs/data/epyc2-2026-11-29g/fsdp_pair.py``) a unit's forward took 0.53-0.71
    ms beyond the model without FSDP and the bare collectives, on two ranks, against 0.10 on
    one; its backward, resharded, 0.53-0.59 against 0.13. Each of ``rounds`` rounds times
    the FSDP model's forward and backward, the same model without FSDP, and the collectives
    FSDP issues (:func:`fsdp_collectives`) called bare, back to back; the median over rounds
    of the first less the other two, per unit. Keys as :func:`fsdp_unit_costs`'; None on
    ranks outside the group."""
    from torch.distributed.device_mesh import DeviceMesh
    barrier.wait(timeout)
    if rank >= n_active:
        return None
    g = n_active
    x = torch.randn(4, FSDP_SIDE)
    plain = _FsdpModel()
    out: dict[str, float] = {}

    def bare(calls: list[tuple[str, int]]) -> float:
        t0 = time.perf_counter()
        for kind, n in calls:
            if kind == "ag":  # as FSDP2 calls it (torch 2.13 _fsdp_collectives.py)
                dist.all_gather_single(torch.empty(n * g), torch.empty(n), group=pg)
            else:
                dist.all_reduce(torch.empty(n), group=pg)
        return time.perf_counter() - t0

    for reshard, key in ((True, "fsdp_unit"), (False, "fsdp_unit_keep")):
        m = _fsdp_model(DeviceMesh.from_group(pg or dist.group.WORLD, "cpu"), reshard)
        fwd_calls, bwd_calls = fsdp_collectives(reshard, g)
        for _ in range(3):
            m(x).backward()
            plain(x).backward()
        f, b = [], []
        for _ in range(rounds):
            dist.barrier(group=pg)
            t0 = time.perf_counter()
            y = m(x)
            t1 = time.perf_counter()
            y.backward()
            t2 = time.perf_counter()
            y = plain(x)
            t3 = time.perf_counter()
            y.backward()
            t4 = time.perf_counter()
            dist.barrier(group=pg)
            bf, bb = bare(fwd_calls), bare(bwd_calls)
            f.append((t1 - t0) - (t3 - t2) - bf)
            b.append((t2 - t1) - (t4 - t3) - bb)
        out[f"{key}_forward"] = max(0.0, statistics.median(f)) / FSDP_UNITS
        out[f"{key}_backward"] = max(0.0, statistics.median(b)) / FSDP_UNITS
    return out


def _forward_backward_time(forward: Callable[[], torch.Tensor], sync: Sync, T: float, rep: int
                           ) -> tuple[float, float]:
    """(forward, backward) seconds of one call of ``forward`` (a scalar) and its backward:
    the window's time per call, split by the forward's share of the calls' own clock."""
    acc = [0.0, 0.0]

    def step() -> None:
        t0 = time.perf_counter()
        y = forward()
        t1 = time.perf_counter()
        y.backward()
        acc[0] += t1 - t0
        acc[1] += time.perf_counter() - t0
    step()
    acc[:] = [0.0, 0.0]
    total = sync.time(step, T, rep)
    share = acc[0] / acc[1] if acc[1] > 0 else 0.5
    return total * share, total * (1 - share)


EP_TOKENS = 64
EP_ALL_TO_ALLS = (EP_ROW_ALL_TO_ALLS[0] + 1, EP_ROW_ALL_TO_ALLS[1])
"""All-to-alls of one MoE layer under ep (runtime/parallel/ep.py): the rows' (there and back
in the forward and the backward, as the cost model counts them) and the forward's exchange of
the counts."""


def ep_layer_costs(sync: Sync, T: float, rep: int) -> dict[str, float]:
    """Expert parallelism's own cost per MoE layer and micro-batch, beyond the layer's work
    and its all-to-alls' alpha-beta time: ptd's MoE layer (``tiny-moe``'s shape, 64 tokens)
    with its experts sharded over a one-rank ep mesh (DTensor weights and their gradients,
    the all-to-alls' autograd function, the split and regroup index arithmetic), forward
    and backward timed apart, less the same layer without ep and less
    the bare one-rank all-to-alls it runs (their cost is in the calibrated collectives'
    latency, which prices each one). ``ep_all_to_all_*``: the part of it that one rows'
    all-to-all adds as the layer calls it (:class:`~ptd.runtime.parallel.ep.EPAllToAll`),
    which a run's measurement counts as communication. Needs a one-rank world
    (:func:`framework_overheads`)."""
    from torch.distributed.device_mesh import init_device_mesh

    from ...specs import get_preset
    from ..model.moe import MoE
    from ..parallel.ep import EPAllToAll, apply_ep
    spec = get_preset("tiny-moe")

    def layer(ep: bool) -> torch.nn.Module:
        torch.manual_seed(0)
        m = MoE(spec)
        for p in m.parameters():
            torch.nn.init.normal_(p, std=0.05)
        if ep:
            apply_ep(m, init_device_mesh("cpu", (1,), mesh_dim_names=("ep",)))
        return m
    x = torch.randn(1, EP_TOKENS, spec.hidden)
    plain, sharded = layer(False), layer(True)
    pf, pb = _forward_backward_time(lambda: plain(x).sum(), sync, T, rep)
    ef, eb = _forward_backward_time(lambda: sharded(x).sum(), sync, T, rep)
    src = torch.zeros(8, dtype=torch.int64)
    dst = torch.empty_like(src)
    group = sharded.experts.ep_group
    a2a = sync.time(lambda: dist.all_to_all_single(dst, src, group=group), T, rep)
    # one rows' all-to-all as ep.py calls it (its autograd function), forward and
    # backward, less a bare one and the sum that makes it a scalar: what the measurement
    # counts as the all-to-all's own time beyond the collective
    rows = torch.randn(EP_TOKENS * spec.top_k, spec.hidden, requires_grad=True)
    splits = [rows.shape[0]]
    cf, cb = _forward_backward_time(
        lambda: EPAllToAll.apply(rows, splits, splits, group).sum(),
        sync, T, rep)
    sf, sb = _forward_backward_time(lambda: rows.sum(), sync, T, rep)
    return {"ep_layer_forward": max(0.0, ef - pf - EP_ALL_TO_ALLS[0] * a2a),
            "ep_layer_backward": max(0.0, eb - pb - EP_ALL_TO_ALLS[1] * a2a),
            "ep_all_to_all_forward": max(0.0, cf - sf - a2a),
            "ep_all_to_all_backward": max(0.0, cb - sb - a2a)}


MOE_TOKENS = (64, 512, 2048)
"""Token counts at which a model's MoE layer is timed (``moe_layer_measured``): the cost
model reads between them (and along the last two past them)."""


def moe_layer_times(fields: dict, dtypes: list[str], sync: Sync, T: float, rep: int
                    ) -> dict[str, list[list[float]]]:
    """``{moe_layer_key: [[tokens, forward s, backward s], ...]}`` for the MoE layer of the
    model ``fields`` (a :class:`ModelSpec`'s fields), as ptd's runtime runs it in training:
    the layer built from the spec, weights drawn at the scale of its initialisation,
    statistics recorded, bf16 and fp16 under autocast over fp32 weights
    (:mod:`ptd.runtime.precision`); each forward on :data:`MOE_TOKENS` random tokens and its
    backward from a sum, less the same sum on a plain tensor of the output's shape."""
    from ...cost.moe import moe_layer_key
    from ...specs.model import ModelSpec
    from ..model.moe import MoE
    spec = ModelSpec(**fields)
    torch.manual_seed(0)
    layer = MoE(spec)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.02)
    layer.train()
    out: dict[str, list[list[float]]] = {}
    for dt in dtypes:
        ctx = ((lambda: torch.autocast("cpu", dtype=DTYPES[dt])) if dt != "fp32"
               else contextlib.nullcontext)
        pts = []
        for tokens in MOE_TOKENS:
            layer.aux_scale = 1.0 / tokens
            x = torch.randn(1, tokens, spec.hidden, requires_grad=True)
            plain = torch.randn(1, tokens, spec.hidden, requires_grad=True)

            def forward(x: torch.Tensor = x) -> torch.Tensor:
                with ctx():
                    y = layer(x)
                layer.stats = None  # (the runtime resets them every step)
                return y.sum()
            f, b = _forward_backward_time(forward, sync, T, rep)
            sf, sb = _forward_backward_time(lambda: plain.sum(), sync, T, rep)
            pts.append([float(tokens), max(0.0, f - sf), max(0.0, b - sb)])
        out[moe_layer_key(spec, dt)] = pts
    return out


def compute_suite(n: int, plan: dict, device: torch.device, sync: Sync,
                  tick: Callable[[str], None]) -> dict:
    """Matmul, operator-overhead and attention timings on one of ``n`` workers (memory:
    :func:`memory_point`, at several moments of the calibration)."""
    T, rep = plan["window_s"], plan["repeats"]
    out: dict[str, Any] = {"gemm": {}, "attention": {}}
    if n == plan["workers"][0] and plan.get("warmup_s"):
        _warm_up(plan, device, sync)
    for dt in plan["dtypes"]:
        res = {}
        for i, s in enumerate(plan["gemm_sizes"]):
            a = torch.randn(s, s, device=device).to(DTYPES[dt])
            b = torch.randn(s, s, device=device).to(DTYPES[dt])
            c = torch.empty(s, s, device=device, dtype=DTYPES[dt])
            res[str(s)] = t = sync.time(lambda: _three_layouts(a, b, c), T, rep)
            if sync.agree(i >= 1 and t > plan["max_call_s"]):
                break  # larger sizes would take too long (bf16 on a CPU without bf16 units)
        out["gemm"][dt] = res
        tick(f"matmul {dt} x{n}")
    if plan.get("gemm_shapes") and n == plan["workers"][0]:
        out["gemm_shapes"], out["gemm_shapes_ref"] = {}, {}
        for dt in plan["dtypes"]:
            ref = max(map(int, out["gemm"][dt]))  # the fit's largest size this worker reached
            out["gemm_shapes"][dt], out["gemm_shapes_ref"][dt] = gemm_shapes(plan, dt, device,
                                                                             sync, ref)
            tick(f"matmul shapes {dt}")

    if device.type == "cpu":
        one, two = torch.ones(1), torch.ones(1)
        leaf = torch.ones(1, requires_grad=True)
        out["overhead"] = {"add": sync.time(lambda: torch.add(one, two), T / 2, rep),
                           "view": sync.time(lambda: one.view(-1), T / 2, rep),
                           "add_autograd": sync.time(lambda: torch.add(leaf, two), T / 2, rep)}
        if plan.get("op_model"):
            out["overhead"]["model"] = model_op_cost(plan["op_model"], sync, T / 2, rep)
        out["framework"] = framework_overheads(sync, T / 2, rep, op_fields=plan.get("op_model"),
                                               measure_share=plan.get("dtensor_share", False))
        if plan.get("moe_model"):
            out["moe_layer"] = moe_layer_times(plan["moe_model"], plan["dtypes"], sync, T / 2, rep)
        tick(f"overhead x{n}")

    for dt in plan["dtypes"]:
        out["attention"][dt] = attention_times(plan["attn_shapes"], dt, device, sync, plan)
        tick(f"attention {dt} x{n}")
    if plan.get("attn_model_shapes") and n == plan["workers"][0]:
        out["attention_model"] = {}
        for dt in plan["dtypes"]:
            out["attention_model"][dt] = attention_times(plan["attn_model_shapes"], dt, device,
                                                         sync, plan)
            tick(f"attention shapes {dt}")
    return out


def _warm_up(plan: dict, device: torch.device, sync: Sync) -> None:
    """Products of the fit's largest size, untimed, for ``warmup_s`` before the first stage:
    a machine that has idled runs its first second slow (a 16-core Xeon VM, 2026-11-27:
    the first stage, the fit on one worker, at 106 GFLOP/s, the same products on two
    workers a minute later at 142 each, and one worker's shapes in between at 143-162)."""
    s = max(plan["gemm_sizes"])
    a, b = (torch.randn(s, s, device=device) for _ in range(2))
    c = torch.empty(s, s, device=device)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < plan["warmup_s"]:
        _three_layouts(a, b, c)
        sync.sync()


def attention_times(shapes: list, dt: str, device: torch.device, sync: Sync, plan: dict
                    ) -> dict[str, float]:
    """Seconds of causal SDPA forward + backward per shape ``(b, heads, s, head_dim)``,
    smallest first, until a call takes longer than ``max_call_s``."""
    res = {}
    for shape in shapes:
        q, k, v = (torch.randn(*shape, device=device).to(DTYPES[dt]).requires_grad_()
                   for _ in range(3))
        g = torch.randn(*shape, device=device).to(DTYPES[dt])

        def step(q=q, k=k, v=v, g=g):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.autograd.grad(o, (q, k, v), g)

        res["x".join(map(str, shape))] = t = sync.time(step, plan["window_s"], plan["repeats"])
        if sync.agree(t > plan["max_call_s"]):
            break
    return res


COLD_DEFAULT = 64 * 2**20
"""Bytes a shape's rotation spans where the machine does not say its caches' sizes."""


def cold_bytes(caches: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """Bytes of operands a CPU's shape sweep rotates over: twice the largest cache Linux
    lists for CPU 0 (a 2-core EPYC VM: 32 MiB of L3), else :data:`COLD_DEFAULT`. A model's
    products read weights and activations and write outputs that the operators between
    them have evicted; the same product timed over and over on one set of buffers finds
    them in the cache. Measured (2026-11-29, docs/data/epyc2-2026-11-29f/in_model.py): the
    ``small`` model's products inside a training step took 1.08x their time on warm
    buffers, 1.01x on buffers rotated over 96 MB -- outputs included (rotating only the
    inputs left 1.03-1.04x: a wide output written to memory not in the cache costs most)."""
    from pathlib import Path
    sizes = []
    for f in Path(caches).glob("index*/size"):
        with contextlib.suppress(OSError, ValueError):
            t = f.read_text().strip()
            sizes.append(int(t[:-1]) * {"K": 2**10, "M": 2**20, "G": 2**30}[t[-1]]
                         if t[-1] in "KMG" else int(t))
    return 2 * max(sizes) if sizes else COLD_DEFAULT


def rotation(m: int, n: int, k: int, dt: str, cold: int) -> int:
    """Sets of a linear layer's buffers (:func:`_linear_set`) a shape's timing rotates over
    so that together they span ``cold`` bytes: at least one."""
    per = DTYPES[dt].itemsize * 2 * (m * k + n * k + m * n)
    return max(1, -(-cold // per))


def _linear_set(m: int, n: int, k: int, dt: str, device: torch.device) -> tuple:
    """A linear layer's training-step buffers for the forward product ``(m, n, k)``: input
    ``x``, weight ``w``, output gradient ``dy`` and the three products' outputs."""
    x, w, dy = (torch.randn(*s, device=device).to(DTYPES[dt]) for s in ((m, k), (n, k), (m, n)))
    return x, w, dy, torch.empty_like(dy), torch.empty_like(x), torch.empty_like(w)


def gemm_shapes(plan: dict, dt: str, device: torch.device, sync: Sync, ref: int
                ) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds per linear-layer training step for each shape of the sweep, smallest first,
    until one product takes longer than ``max_call_s`` (bf16 on a CPU without bf16 units
    would take minutes over the whole sweep); and the reference: the fit's ``ref x ref``
    call timed again before and after the sweep (``{"size", "seconds"}``, their mean).

    A shape ``(m, n, k)`` is timed as the step runs a linear layer of that forward product:
    ``X W^T`` (``m x k`` by ``(n x k)^T``), the input gradient ``dY W`` and the weight
    gradient ``dY^T X`` -- the layouts of the fit's square calls, and the cost model prices
    a backward at twice its forward at one rate. On a CPU each call takes the next of sets
    of buffers that together span twice the largest cache (:func:`cold_bytes`), as a
    model's products find their operands. The reference lets the profile compare
    each shape with the fit measured at another moment: a shared or virtual machine's
    rate drifts between stages (a 16-core Xeon VM, 2026-11-27: its first stage, the fit,
    at 106 GFLOP/s, the sweep seconds later at 143-162 for the same kinds of products)."""
    a = torch.randn(ref, ref, device=device).to(DTYPES[dt])
    b = torch.randn(ref, ref, device=device).to(DTYPES[dt])
    c = torch.empty(ref, ref, device=device, dtype=DTYPES[dt])
    before = sync.time(lambda: _three_layouts(a, b, c), plan["window_s"], plan["repeats"])
    res: dict[str, float] = {}
    cold = cold_bytes() if device.type == "cpu" else 0
    for m, n, k in plan["gemm_shapes"]:
        sets = [_linear_set(m, n, k, dt, device) for _ in range(rotation(m, n, k, dt, cold))]

        def step(turn: Callable[[], tuple] = itertools.cycle(sets).__next__) -> None:
            x, w, dy, y, dx, dw = turn()
            torch.mm(x, w.t(), out=y)  # forward
            torch.mm(dy, w, out=dx)  # input gradient
            torch.mm(dy.t(), x, out=dw)  # weight gradient

        for _ in sets:  # every buffer touched once before the clock starts (a first touch
            step()      # of fresh pages costs a fault each)
        res[f"{m}x{n}x{k}"] = t = sync.time(step, plan["window_s"], plan["repeats"])
        if sync.agree(t / 3 > plan["max_call_s"]):
            break
    after = sync.time(lambda: _three_layouts(a, b, c), plan["window_s"], plan["repeats"])
    return res, {"size": ref, "seconds": (before + after) / 2}


def _collective(kind: str, nbytes: int, g: int, rank: int, pg: Any,
                device: torch.device) -> tuple[Callable[[], Any], int]:
    """The call for one collective and the bytes ``M`` it moves in the cost model's terms
    (the whole buffer for all-gather and reduce-scatter, each rank's input for all-to-all)."""
    n = max(g, nbytes // 4 // g * g)
    x = torch.zeros(n, device=device)
    if kind == "all_reduce":
        return (lambda: dist.all_reduce(x, group=pg)), 4 * n
    if kind == "all_gather":
        ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        part = torch.zeros(n // g, device=device)
        return (lambda: ag(x, part, group=pg)), 4 * n
    if kind == "reduce_scatter":
        rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        part = torch.zeros(n // g, device=device)
        return (lambda: rs(part, x, group=pg)), 4 * n
    if kind == "broadcast":
        src = rank // g * g
        return (lambda: dist.broadcast(x, src=src, group=pg)), 4 * n
    if kind == "all_to_all":
        y = torch.zeros(n, device=device)
        return (lambda: dist.all_to_all_single(y, x, group=pg)), 4 * n
    if kind == "send_recv":
        peer = rank ^ 1

        def pingpong() -> None:
            if rank % 2 == 0:
                dist.send(x, dst=peer)
                dist.recv(x, src=peer)
            else:
                dist.recv(x, src=peer)
                dist.send(x, dst=peer)
        return pingpong, 4 * n
    raise ValueError(kind)


def blocking_curve(rank: int, n_active: int, pg: Any, barrier: Any, timeout: float,
                   repeats: int, chunks: dict[int, int], nbytes: int, side: int = BLOCKING_SIDE
                   ) -> dict[str, list[float]] | None:
    """What a *blocking* collective costs after a chunk of computation, as tensor
    parallelism's activation all-reduces do, with ``n_active`` workers of the node running
    (ranks ``0..n_active-1``, in pairs).

    The collective fits time calls back to back. After a chunk, gloo's threads have gone
    to sleep, and where workers outnumber cores a peer descheduled during its chunk arrives
    late: each call is slower, the more so the longer the chunk. Measured as tensor
    parallelism meets it: a loop of (``k`` 256x256 matmuls; all-reduce of
    ``nbytes`` within the pair), each all-reduce timed on its own, for each ``k``
    of ``chunks`` (``k -> calls``; ``k = 0`` is back to back). Right before each loop the
    same chunks run alone, the same workers busy and no collective between them: what a
    chunk costs at this moment. (The wait is a few ms beside chunks of up to ~60 ms; priced
    at the matmul stage's rate instead, a machine 10% slower or faster than a minute
    earlier moved it by more than itself: docs/measuring.md, "Thirteenth session".)
    Returns ``str(k) -> [mean chunk seconds, mean all-reduce seconds, mean chunk seconds
    alone]`` (medians of ``repeats`` windows), None on ranks outside the active pairs. The
    iteration counts are fixed, not timed: both peers must call the collective equally
    often."""
    a, b = torch.randn(side, side), torch.randn(side, side)
    x = torch.zeros(nbytes // 4)
    active = rank < n_active
    out: dict[str, list[list[float]]] = {}
    for _ in range(repeats):
        for k, calls in chunks.items():
            barrier.wait(timeout)
            alone = 0.0
            if active and k:
                t0 = time.perf_counter()
                for _ in range(calls * k):
                    torch.mm(a, b)
                alone = (time.perf_counter() - t0) / calls
            barrier.wait(timeout)
            if not active:
                continue
            dist.all_reduce(x, group=pg)  # both peers start together
            chunk = coll = 0.0
            for _ in range(calls):
                t0 = time.perf_counter()
                for _ in range(k):
                    torch.mm(a, b)
                t1 = time.perf_counter()
                dist.all_reduce(x, group=pg)
                t2 = time.perf_counter()
                chunk, coll = chunk + t1 - t0, coll + t2 - t1
            out.setdefault(str(k), []).append([chunk / calls, coll / calls, alone])
    if not active:
        return None
    return {k: [statistics.median(p[i] for p in v) for i in range(3)] for k, v in out.items()}


def dtensor_reduce_curve(rank: int, n_active: int, pg: Any, one_pg: Any, barrier: Any,
                         timeout: float, sizes: list[int], pairs: int) -> dict[str, list[float]] | None:
    """What tensor parallelism's all-reduce costs beyond the plain call the collective fits
    time: ptd's tp layers reduce a ``Partial`` DTensor to ``Replicate`` (RowwiseParallel's
    output, ColwiseParallel's input gradient), which goes through DTensor's redistribution
    and the functional collective -- Python on the calling thread and an out-of-place copy
    of the buffer -- before gloo's all-reduce. Measured with ``n_active`` workers of the
    node running (ranks ``0..n_active-1``, in pairs): for each size, ``pairs`` rounds of
    one plain ``dist.all_reduce`` then one DTensor reduction of the same buffer, each
    behind a barrier of the pair, and the same DTensor reduction on a one-rank mesh (no
    peer: the part the one-rank ``dtensor_op`` calibration already prices, since its
    model's reductions take this path too; timed back to back after the rounds, as that
    stage times them). Returns ``str(bytes) -> [plain s, DTensor s, one-rank s, extra s]``
    with extra = median over rounds of (DTensor - plain) less the one-rank median, None on
    ranks outside the active pairs. Fixed call counts: both peers
    must call equally often. (2026-11-28, 2 cores, pairs: 0.4-0.65 ms more at 64 KiB,
    0.8-1.0 at 2 MiB, 1.5-1.75 at 8 MiB; 0.25-0.32 on one rank.)"""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Partial, Replicate
    active = rank < n_active
    out: dict[str, list[float]] = {}
    for nbytes in sizes:
        barrier.wait(timeout)
        if not active:
            continue
        mesh = DeviceMesh.from_group(pg or dist.group.WORLD, "cpu")
        one = DeviceMesh.from_group(one_pg, "cpu")
        x = torch.zeros(max(1, nbytes // 4))

        def reduce(m: Any) -> torch.Tensor:
            d = DTensor.from_local(x, m, [Partial()], run_check=False)
            return d.redistribute(m, [Replicate()]).to_local()
        for _ in range(3):
            dist.all_reduce(x, group=pg)
            reduce(mesh)
            reduce(one)
        plain, dt, diff, alone = [], [], [], []
        for _ in range(pairs):
            dist.barrier(group=pg)
            t0 = time.perf_counter()
            dist.all_reduce(x, group=pg)
            t1 = time.perf_counter()
            dist.barrier(group=pg)
            t2 = time.perf_counter()
            reduce(mesh)
            t3 = time.perf_counter()
            plain.append(t1 - t0)
            dt.append(t3 - t2)
            diff.append((t3 - t2) - (t1 - t0))
        # the one-rank reductions back to back, as the dtensor_op stage's model runs them:
        # right after a collective the same call took 0.14-0.37 ms where back to back it
        # takes 0.05 (2 MiB, 2 workers, 2026-11-29), and that slowdown belongs to the
        # reduction on two ranks, which nothing else prices
        for _ in range(pairs):
            t0 = time.perf_counter()
            reduce(one)
            alone.append(time.perf_counter() - t0)
        one_rank = statistics.median(alone)
        out[str(nbytes)] = [statistics.median(plain), statistics.median(dt), one_rank,
                            statistics.median(diff) - one_rank]
    return out if active else None


def collective_suite(rank: int, nproc: int, plan: dict, device: torch.device, barrier: Any,
                     timeout: float, tick: Callable[[str], None]) -> tuple[dict, dict]:
    """Seconds per collective by (kind, group size, bytes) on this rank, and the kinds that
    failed (kind -> error)."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    times: dict[str, dict[str, float]] = {}
    missing: dict[str, str] = {}
    for g in plan["group_sizes"]:
        groups = [list(range(i * g, (i + 1) * g)) for i in range(nproc // g)]
        pg = None if g == nproc else dist.new_subgroups_by_enumeration(groups)[0]
        member = rank < len(groups) * g
        for kind in plan["kinds"]:
            if kind == "send_recv" and g != 2:
                continue
            key, res = f"{kind}:{g}", {}
            for nbytes in plan["coll_sizes"]:
                barrier.wait(timeout)  # every rank passes every barrier, member or not
                if not member or kind in missing:
                    continue
                try:
                    fn, m = _collective(kind, nbytes, g, rank, pg, device)
                    fn()
                except Exception as e:  # unsupported on this backend: record and go on
                    missing[kind] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                    continue
                reps = max(plan["coll_reps"][0], min(plan["coll_reps"][1],
                                                     plan["coll_budget"] // m))
                ts = []
                for _ in range(plan["repeats"]):
                    sync()
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        fn()
                    sync()
                    ts.append((time.perf_counter() - t0) / reps)
                per_call = min(ts)  # the window least disturbed from outside
                res[str(m)] = per_call / 2 if kind == "send_recv" else per_call
            if res:
                times[key] = res
            tick(f"{kind} g={g}")
        if g == 2 and device.type == "cpu":
            # blocking collectives after compute chunks, with 2 and with all workers busy
            for n_active in sorted({2, nproc}):
                w = blocking_curve(rank, n_active, pg, barrier, timeout, plan["repeats"],
                                   plan["blocking_chunks"], plan["blocking_bytes"],
                                   plan.get("blocking_side", BLOCKING_SIDE))
                if w is not None:
                    times.setdefault("blocking", {})[str(n_active)] = w
            tick("blocking collectives")
            # tensor parallelism's all-reduce through DTensor, beyond the plain call
            one_pg, _ = dist.new_subgroups_by_enumeration([[r] for r in range(nproc)])
            for n_active in sorted({2, nproc}):
                d = dtensor_reduce_curve(rank, n_active, pg, one_pg, barrier, timeout,
                                         plan["dtensor_reduce_sizes"], plan["dtensor_reduce_pairs"])
                if d is not None:
                    times.setdefault("dtensor_reduce", {})[str(n_active)] = d
            tick("DTensor all-reduce")
        if g == 2 and device.type == "cpu" and plan.get("tp_situ_rounds"):
            # ptd's own tp model on a pair, the other workers idle: what its collectives
            # cost in place (with all four busy it read twice as much, and a pipeline keeps
            # only some busy: not measured, not priced -- HardwareSpec.tp_situ_measured)
            d = tp_situ(rank, 2, pg, one_pg, barrier, timeout, plan["tp_situ_rounds"])
            if d is not None:
                times.setdefault("tp_situ", {})["2"] = d
            tick("tp collectives in place")
        if g == 2 and device.type == "cpu" and plan.get("fsdp_situ_rounds"):
            # ptd's ZeRO-3 on the same model on a pair, the others idle: what its gathers
            # cost in place (HardwareSpec.fsdp_situ_measured)
            d = fsdp_situ(rank, 2, pg, barrier, timeout, plan["fsdp_situ_rounds"])
            if d is not None:
                times.setdefault("fsdp_situ", {})["2"] = d
            tick("ZeRO-3 in place")
        if g == 2 and device.type == "cpu" and plan.get("fsdp_group_rounds"):
            # FSDP2's per-unit work on a group of two (ranks 0 and 1, the others idle)
            w = fsdp_unit_group_costs(rank, 2, pg, barrier, timeout, plan["fsdp_group_rounds"])
            if w is not None:
                times.setdefault("fsdp_group", {})["2"] = w
            tick("FSDP units g=2")
        if g == nproc and g > 2 and device.type == "cpu" and plan.get("fsdp_group_rounds"):
            w = fsdp_unit_group_costs(rank, g, pg, barrier, timeout, plan["fsdp_group_rounds"])
            if w is not None:
                times.setdefault("fsdp_group", {})[str(g)] = w
            tick(f"FSDP units g={g}")
        if g == nproc and g > 2 and device.type == "cpu":
            # the same loop in one group of all the workers: a collective waits for the
            # latest of its peers, so a larger group waits longer than pairs do
            w = blocking_curve(rank, nproc, pg, barrier, timeout, plan["repeats"],
                               plan["blocking_chunks"], plan["blocking_bytes"],
                               plan.get("blocking_side", BLOCKING_SIDE))
            if w is not None:
                times.setdefault("blocking_group", {})[str(g)] = w
            tick(f"blocking collectives g={g}")
    return times, missing

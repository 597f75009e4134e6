"""Pipeline parallelism: stages from the cost model's split, schedules from
``torch.distributed.pipelining``.

**Stages.** The ``n_layers`` blocks are cut into ``pp * stages_per_rank`` contiguous virtual
stages by :func:`ptd.specs.stages.stage_split` (forward+backward FLOPs balanced, the output
layer counted on the last stage), and virtual stage ``s`` runs on pipeline rank
:func:`ptd.specs.stages.stage_to_rank` ``(s)``: round-robin for interleaved schedules, a V
(stages ``r`` and ``2p-1-r`` on rank ``r``) for ZB-V. The first stage holds the embeddings,
the last the final norm and the output layer. These are the cost model's own functions, so
the layout priced is the layout run.

A rank's model is the whole :class:`~ptd.runtime.model.transformer.Transformer` *pruned* to what its
stages hold: the blocks it does not run are deleted and ``tok_embeddings``/``norm``/``output``
are ``None`` where absent. Parameter names are those of the whole model (the seeded
initialisation, checkpoints and the parity dumps address parameters by them). A rank with
several stages (interleaved, ZB-V) also gets one :class:`StageChunk` per stage: a view that
shares the rank model's modules (no copy) and runs only that stage's part of the forward.
The chunks, not the rank model, are what the schedule drives and what FSDP wraps as roots.

**Schedules** (``plan.schedule``), with what torch 2.13 requires of the micro-batch count
``m = global_batch / (micro_batch * dp)`` (checked by :func:`ptd.runtime.launch.limits.pp_problem`
before any worker starts):

==================  ==================================  ======================================
plan                torch schedule                      micro-batches
==================  ==================================  ======================================
gpipe               ``ScheduleGPipe``                   any
1f1b                ``Schedule1F1B``                    ``m >= pp``
interleaved-1f1b    ``ScheduleInterleaved1F1B``         ``m >= pp``, ``m % max(1, m // pp) == 0``
zero-bubble, vpp<=2 ``ScheduleZBVZeroBubble`` (V)       ``m >= pp``
zero-bubble, vpp>2  ``ScheduleInterleavedZeroBubble``   ``m >= pp``, ``m % max(1, m // pp) == 0``
==================  ==================================  ======================================

(``m >= pp`` for every schedule but GPipe is ``ParallelPlan.validate``'s rule; torch itself
accepts fewer for the multi-stage ones.) The zero-bubble schedules split each backward into
input and weight gradients and cannot run ``torch.compile``d blocks.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch import nn

from ...specs.stages import stage_split, stage_to_rank
from ...specs import ModelSpec, ParallelPlan
from ..launch.limits import schedule_name
from ..model.transformer import Transformer


def stage_layers(model: ModelSpec, plan: ParallelPlan) -> list[range]:
    """Block indices of every virtual stage, in stage order."""
    out, start = [], 0
    for n in stage_split(model, plan.n_stages, plan.seq_len, plan.uneven_stages):
        out.append(range(start, start + n))
        start += n
    return out


def local_stages(plan: ParallelPlan, pp_rank: int) -> list[int]:
    """Virtual stages run by pipeline rank ``pp_rank``, in stage order."""
    return [s for s in range(plan.n_stages) if stage_to_rank(s, plan) == pp_rank]


class StageChunk(Transformer):
    """One virtual stage of a rank that runs several: the same ``forward`` as the model,
    over modules *shared* with the rank model (embeddings if first, its blocks, final
    norm and output if last). RoPE tables are read from the rank model, so they are the
    materialised ones."""

    def __init__(self, owner: Transformer, layers: range, first: bool, last: bool) -> None:
        nn.Module.__init__(self)
        object.__setattr__(self, "_owner", owner)  # not a submodule: no second name
        self.spec = owner.spec
        self.tok_embeddings = owner.tok_embeddings if first else None
        self.pos_embeddings = owner.pos_embeddings if first else None
        self.layers = nn.ModuleDict({str(i): owner.layers[str(i)] for i in layers})
        self.norm = owner.norm if last else None
        self.output = owner.output if last else None

    @property
    def rope_cos(self) -> torch.Tensor | None:  # type: ignore[override]
        return self._owner.rope_cos

    @property
    def rope_sin(self) -> torch.Tensor | None:  # type: ignore[override]
        return self._owner.rope_sin


def split_model(model: Transformer, plan: ParallelPlan, pp_rank: int
                ) -> tuple[Transformer, list[nn.Module], list[int]]:
    """Prune the whole (meta) ``model`` to pipeline rank ``pp_rank``'s stages, in place.

    Returns the rank model, the module of each local stage (the rank model itself when
    it runs one stage, else :class:`StageChunk` views) and their stage indices."""
    if plan.pp == 1:
        return model, [model], [0]
    ranges = stage_layers(model.spec, plan)
    mine = local_stages(plan, pp_rank)
    keep = {str(i) for s in mine for i in ranges[s]}
    for key in [k for k in model.layers if k not in keep]:
        del model.layers[key]
    first, last = 0 in mine, plan.n_stages - 1 in mine
    if not first:
        model.tok_embeddings = None
        model.pos_embeddings = None
    if not last:
        model.norm = None
        model.output = None
    if len(mine) == 1:
        return model, [model], mine
    chunks: list[nn.Module] = [StageChunk(model, ranges[s], s == 0, s == plan.n_stages - 1)
                               for s in mine]
    return model, chunks, mine


class TiedEmbeddingGrads:
    """Sum a tied embedding's gradient over its two copies, once per optimizer step.

    With pp > 1 the first stage holds the embedding and the last the output layer; tied,
    they are one matrix, whose gradient is the sum of both uses. Where the two stages sit on
    different ranks each holds a copy (:func:`~ptd.runtime.model.transformer.tied_copy`),
    started equal, and this all-reduce over the pair (:meth:`ParallelDims.tied_group`) gives
    both copies the whole gradient, so the same optimizer step keeps them equal -- as
    Megatron-LM's embedding group does. Linear, so its order against the data-parallel
    average does not matter; under tp and ZeRO both copies are sharded alike (Shard(0) over
    the padded vocabulary, then dp), so the local shards correspond element by element."""

    def __init__(self, model: nn.Module, group: Any) -> None:
        from ..model.transformer import tied_copy
        self.group = group
        copy = tied_copy(model)
        first = getattr(model, "tok_embeddings", None)
        self.param = copy if copy is not None else (first.weight if first is not None else None)

    @torch.no_grad()
    def __call__(self) -> None:
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor
        g = self.param.grad
        if g is None:  # (a stage that never used it cannot hold a copy: a bug, not a case)
            raise RuntimeError("tied embedding without a gradient after the schedule")
        dist.all_reduce(g._local_tensor if isinstance(g, DTensor) else g, group=self.group)


def schedule_class(plan: ParallelPlan) -> type:
    # imported here, not at the top: torch.distributed.pipelining pulls in torch._dynamo,
    # ~2 s of CPU per worker that runs without a pipeline would pay for nothing
    from torch.distributed.pipelining import schedules
    return getattr(schedules, schedule_name(plan))


@functools.cache
def _spanned_stage_class() -> type:
    """``PipelineStage`` whose forward, backward and weight-gradient passes of a micro-batch
    run in the profiler spans ``ptd:forward``, ``ptd:backward`` and ``ptd:backward_w``: the
    measured timeline tells a stage's compute from its wait for a neighbour (the bubble) by
    them, and torch 2.13's pipelining has no hook around these calls, so the schedules' own
    calls of these (public) methods are overridden here."""
    from ..measure.spans import span
    from torch.distributed.pipelining import PipelineStage

    class SpannedStage(PipelineStage):
        def forward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
            with span("ptd:forward"):
                return super().forward_one_chunk(*args, **kwargs)

        def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
            with span("ptd:backward"):
                return super().backward_one_chunk(*args, **kwargs)

        def backward_weight_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
            with span("ptd:backward_w"):
                return super().backward_weight_one_chunk(*args, **kwargs)
    return SpannedStage


def build_schedule(chunks: list[nn.Module], stage_ids: list[int], plan: ParallelPlan,
                   group: Any, device: torch.device,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                   ) -> tuple[Any, list[Any]]:
    """The schedule over this rank's stages, and the ``PipelineStage``s. ``loss_fn`` already
    divides by the replica's tokens, so the schedule must not rescale gradients
    (``scale_grads=False``)."""
    from torch.distributed.pipelining import schedules
    stage_cls = _spanned_stage_class()
    stages = [stage_cls(c, s, plan.n_stages, device, group=group)
              for c, s in zip(chunks, stage_ids)]
    cls = schedule_class(plan)
    if cls in (schedules.ScheduleGPipe, schedules.Schedule1F1B):
        return cls(stages[0], plan.n_microbatches, loss_fn=loss_fn, scale_grads=False), stages
    return cls(stages, plan.n_microbatches, loss_fn=loss_fn, scale_grads=False), stages


class ForwardOnly:
    """The pipeline's forward pass without a schedule, for evaluation: micro-batch after
    micro-batch, stage after stage, in one global order every rank follows (running only
    its own stages), with blocking point-to-point sends of the activations. No overlap --
    evaluation is rare -- but it works for every placement, V included (torch 2.13's
    ``eval()`` of the zero-bubble schedules fails)."""

    def __init__(self, chunks: list[nn.Module], stage_ids: list[int], plan: ParallelPlan,
                 group: Any) -> None:
        import torch.distributed as dist
        self.plan = plan
        self.group = group
        self.mine = dict(zip(stage_ids, chunks))
        self.global_rank = {s: dist.get_global_rank(group, stage_to_rank(s, plan))
                            for s in range(plan.n_stages)}

    def _send(self, t: torch.Tensor, stage: int) -> None:
        import torch.distributed as dist
        t = t.contiguous()
        head = torch.tensor([_DTYPES.index(t.dtype), t.ndim, *t.shape], dtype=torch.int64)
        dist.send(torch.tensor([head.numel()]), self.global_rank[stage])
        dist.send(head, self.global_rank[stage])
        dist.send(t, self.global_rank[stage])

    def _recv(self, stage: int, device: torch.device) -> torch.Tensor:
        import torch.distributed as dist
        n = torch.zeros(1, dtype=torch.int64)
        dist.recv(n, self.global_rank[stage])
        head = torch.zeros(int(n), dtype=torch.int64)
        dist.recv(head, self.global_rank[stage])
        dtype, shape = _DTYPES[int(head[0])], [int(x) for x in head[2:]]
        t = torch.empty(shape, dtype=dtype, device=device)
        dist.recv(t, self.global_rank[stage])
        return t

    @torch.no_grad()
    def losses(self, inputs: list[torch.Tensor], targets: list[torch.Tensor],
               loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> list[torch.Tensor]:
        """This rank's losses (one per micro-batch if it holds the last stage, else none)."""
        out, last = [], self.plan.n_stages - 1
        for x0, target in zip(inputs, targets):
            x = x0
            for s in range(self.plan.n_stages):
                if s not in self.mine:
                    continue
                if s > 0 and s - 1 not in self.mine:
                    x = self._recv(s - 1, x0.device)
                x = self.mine[s](x)
                if s == last:
                    out.append(loss_fn(x, target))
                elif s + 1 not in self.mine:
                    self._send(x, s + 1)
        return out


_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64]

"""The seam between the trainer and the parallel dimensions: one step's forward+backward.

The trainer hands a :class:`StepRunner` this rank's micro-batches for one optimizer step
and gets back this rank's share of the loss; how the micro-batches flow through the
model (accumulation, a pipeline schedule) is the runner's business, and the trainer does
not look at the plan.

Loss convention (all runners): the loss a rank returns and back-propagates is the *sum* of
token losses of its micro-batches divided by the number of tokens its replica sees in the
step. Data-parallel gradient averaging then makes the gradient that of the mean over all
tokens of the global batch, and the trainer's average of the returned values over the
reporting ranks is that mean.

* :class:`AccumulationRunner` (here): micro-batches one after another, gradients
  accumulated, reduced across replicas only during the last micro-step.
* :class:`PipelineRunner` (here): ``schedule.step(inputs, target=targets, losses=...)`` over
  this rank's pipeline stages; its loss function is the same ``lm_loss_sum / tokens``; only
  the ranks holding the last stage ``reports_loss``.

:func:`make_runner` is the one place that picks the runner for a plan. With tensor
parallelism the output layer returns vocabulary-sharded logits and both runners compute
the loss and run the backward under ``loss_parallel()`` (the full logits are never
gathered); with tp > 1 or pp > 1 and zero 0 they also average gradients over the
data-parallel group themselves (:class:`~ptd.runtime.parallel.ddp.GradAllReduce`; under
ZeRO-1/2/3 FSDP does).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Protocol, Sequence

import torch
from torch import nn
from .measure.spans import span
from torch.distributed.tensor import DTensor

from .data.loader import MicroBatch
from .model.transformer import lm_loss_sum
from .parallel import gradient_sync
from .precision import Precision

GradSync = Callable[[], None] | None


class StepRunner(Protocol):
    reports_loss: bool
    """Whether this rank computes the loss (not so on a pipeline's inner stages)."""

    def forward_backward(self, micro_batches: Sequence[MicroBatch]) -> torch.Tensor:
        """Run forward and backward over this rank's micro-batches of one optimizer step,
        leaving the step's (synchronised) gradients in ``.grad``; return the detached loss
        share (see the module docstring)."""
        ...

    def evaluate(self, micro_batches: Sequence[MicroBatch]) -> torch.Tensor:
        """Mean token loss over ``micro_batches`` without gradients (same convention)."""
        ...


def replica_tokens(micro_batches: Sequence[MicroBatch]) -> int:
    return sum(mb.n_tokens for mb in micro_batches)


def plain(t: torch.Tensor) -> torch.Tensor:
    """A loss as a plain tensor (under ``loss_parallel`` it is a replicated DTensor)."""
    return t.full_tensor() if isinstance(t, DTensor) else t


class AccumulationRunner:
    """Gradient accumulation over micro-batches for DDP / ZeRO / tensor parallel / one process.

    Gradient synchronisation (DDP's bucketed all-reduce, FSDP's reduce-scatter) happens only
    in the backward of the last micro-batch: ``no_sync`` / ``set_requires_gradient_sync``."""

    reports_loss = True

    def __init__(self, model: nn.Module, precision: Precision,
                 loss_context: Callable[[], ContextManager] = contextlib.nullcontext,
                 grad_sync: GradSync = None,
                 loss_sum: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = lm_loss_sum) -> None:
        """``loss_sum(logits, targets)``: the micro-batch's summed token loss (2-D tensor
        parallelism computes it from logits blocks: :func:`~.parallel.tp2d.loss_sum_2d`)."""
        self.model = model
        self.precision = precision
        self.loss_context = loss_context
        self.grad_sync = grad_sync
        self.loss_sum = loss_sum

    def forward(self, mb: MicroBatch, step_tokens: int) -> torch.Tensor:
        with span("ptd:forward"):
            with self.precision.autocast():
                logits = self.model(mb.inputs)
            return self.loss_sum(logits, mb.targets) / step_tokens

    def backward(self, loss: torch.Tensor) -> None:
        with span("ptd:backward"):
            self.precision.backward(loss)

    def forward_backward(self, micro_batches: Sequence[MicroBatch]) -> torch.Tensor:
        step_tokens = replica_tokens(micro_batches)
        total = torch.zeros((), dtype=torch.float32, device=micro_batches[0].inputs.device)
        last = len(micro_batches) - 1
        for i, mb in enumerate(micro_batches):
            with gradient_sync(self.model, enabled=i == last), self.loss_context():
                loss = self.forward(mb, step_tokens)
                self.backward(loss)
            total += plain(loss.detach())
        if self.grad_sync is not None:
            with span("ptd:grad_sync"):
                self.grad_sync()
        return total

    @torch.no_grad()
    def evaluate(self, micro_batches: Sequence[MicroBatch]) -> torch.Tensor:
        self.model.eval()
        try:
            step_tokens = replica_tokens(micro_batches)
            with self.loss_context():
                return sum(plain(self.forward(mb, step_tokens)) for mb in micro_batches)  # type: ignore[return-value]
        finally:
            self.model.train()


class PipelineRunner:
    """One optimizer step = one run of the pipeline schedule over all micro-batches.

    Every rank passes the whole replica batch (the schedule cuts it into the plan's
    micro-batches): the first stage uses the inputs, the last the targets. The last
    stage's losses (each ``lm_loss_sum / replica tokens``) add up to the replica's mean
    token loss; other ranks return 0 and do not report. Gradient synchronisation over dp
    is FSDP's (the stages drive its reduce-scatter at the last backward) or ``grad_sync``.
    """

    def __init__(self, build_schedule: Callable[[Callable], tuple[Any, Sequence[Any]]],
                 forward_only: Any, precision: Precision,
                 loss_context: Callable[[], ContextManager] = contextlib.nullcontext,
                 grad_sync: GradSync = None) -> None:
        """``build_schedule(loss_fn)`` returns the schedule and this rank's stages;
        ``forward_only`` (:class:`~ptd.runtime.parallel.pp.ForwardOnly`) evaluates."""
        self.schedule, stages = build_schedule(self._schedule_loss)
        self.forward_only = forward_only
        self.precision = precision
        self.loss_context = loss_context
        self.grad_sync = grad_sync
        self.first = any(s.is_first for s in stages)
        self.reports_loss = any(s.is_last for s in stages)
        self.modules = [s.submod for s in stages]
        self.step_tokens = 1

    def loss_fn(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return lm_loss_sum(output, targets) / self.step_tokens

    def _schedule_loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # the schedule back-propagates what this returns: fp16's loss scale goes in here
        with span("ptd:forward"):  # the last stage's forward ends with the loss
            return self.precision.scale(self.loss_fn(output, targets))

    @staticmethod
    def _sum(losses: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.float32, device=device)
        for loss in losses:
            total += plain(loss.detach()).float()
        return total

    def forward_backward(self, micro_batches: Sequence[MicroBatch]) -> torch.Tensor:
        self.step_tokens = replica_tokens(micro_batches)
        args = (torch.cat([mb.inputs for mb in micro_batches]),) if self.first else ()
        target = torch.cat([mb.targets for mb in micro_batches]) if self.reports_loss else None
        losses: list[torch.Tensor] = []
        with self.loss_context(), self.precision.autocast(), span("ptd:schedule"):
            self.schedule.step(*args, target=target, losses=losses, return_outputs=False)
        if self.grad_sync is not None:
            with span("ptd:grad_sync"):
                self.grad_sync()
        return self.precision.unscaled(self._sum(losses, micro_batches[0].inputs.device))

    @torch.no_grad()
    def evaluate(self, micro_batches: Sequence[MicroBatch]) -> torch.Tensor:
        self.step_tokens = replica_tokens(micro_batches)
        for m in self.modules:
            m.eval()
        try:
            with self.loss_context(), self.precision.autocast():
                losses = self.forward_only.losses([mb.inputs for mb in micro_batches],
                                                  [mb.targets for mb in micro_batches], self.loss_fn)
        finally:
            for m in self.modules:
                m.train()
        return self._sum(losses, micro_batches[0].inputs.device)


def _chain(hooks: list[Callable[[], None]]) -> GradSync:
    if not hooks:
        return None

    def run_all() -> None:
        for hook in hooks:
            hook()
    return run_all


def make_runner(model: nn.Module, stage_modules: Sequence[nn.Module], stage_ids: Sequence[int],
                dims: Any, precision: Precision) -> StepRunner:
    """The runner for ``dims.plan``: a pipeline schedule when pp > 1, else accumulation.
    ``stage_modules``/``stage_ids``: this rank's pipeline stages (see ``parallel.pp``)."""
    from .parallel.ddp import dp_grad_sync
    from .parallel.tp import AlignTPGrads
    plan = dims.plan
    hooks: list[Callable[[], None]] = []
    if plan.tp > 1 and plan.zero == 0:  # (FSDP reduces tp-partial gradients itself)
        hooks.append(AlignTPGrads(list(model.parameters())))
    if plan.ep > 1 and plan.zero >= 1:  # FSDP: experts over edp (divided by dp), the rest over dp
        dp_sync = None
    elif plan.ep > 1:  # expert gradients over the replicas of the same experts, not all of dp
        from .parallel.ep import EPGradSync
        dp_sync = EPGradSync(model, dims.group("dp"), dims.ep_mesh.get_group("edp"), plan.dp)
    elif plan.cp > 1:  # cp joins dp for gradient averaging
        from .parallel.cp import SplitSequences, dp_cp_group
        from .parallel.ddp import GradAllReduce
        params = [p for p in model.parameters() if p.requires_grad]
        if plan.zero == 0:
            dp_sync = GradAllReduce(params, dp_cp_group(plan), plan.dp * plan.cp)
        else:
            # ZeRO-1/2/3: FSDP averaged the gradients over dp into shards (ZeRO-2 at every
            # micro-step, the shards accumulating); cp peers hold the same shard of the same
            # parameters, so averaging the accumulated shards over cp once per step -- linear --
            # gives the mean over dp x cp, whatever the stage
            dp_sync = GradAllReduce(params, dims.group("cp"), plan.cp)
    else:
        dp_sync = dp_grad_sync(model, plan, dims.group("dp"))
    if dp_sync is not None:
        hooks.append(dp_sync)
    if plan.pp > 1 and model.spec.tied_embeddings:
        from .parallel.pp import TiedEmbeddingGrads
        tied = dims.tied_group()  # (a collective: every rank builds the pairs' groups)
        if tied is not None:
            hooks.append(TiedEmbeddingGrads(model, tied))
    sync = _chain(hooks)
    loss_sum: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = lm_loss_sum
    if plan.tp > 1 and plan.tp_mode == "2d":  # logits blocks, explicit collectives (no DTensor)
        import functools
        from .parallel.tp2d import Grid, loss_sum_2d
        loss_sum = functools.partial(loss_sum_2d, Grid.of(dims.tp2d_mesh))
        loss_context: Callable[[], ContextManager] = contextlib.nullcontext
    elif plan.tp > 1:
        from torch.distributed.tensor.parallel import loss_parallel
        loss_context = loss_parallel
    else:
        loss_context = contextlib.nullcontext
    if plan.pp == 1:
        runner: StepRunner = AccumulationRunner(model, precision, loss_context, sync, loss_sum)
    else:
        from .parallel.pp import ForwardOnly, build_schedule
        chunks, ids = list(stage_modules), list(stage_ids)

        def build(loss_fn: Callable) -> tuple[Any, Sequence[Any]]:
            return build_schedule(chunks, ids, plan, dims.group("pp"), dims.device, loss_fn)
        runner = PipelineRunner(build, ForwardOnly(chunks, ids, plan, dims.group("pp")), precision,
                                loss_context, sync)
        from .model.moe import exclude_metadata_inference
        exclude_metadata_inference(runner.schedule)  # MoE routing statistics: real tokens only
    return SplitSequences(runner, plan.cp, dims.coords["cp"]) if plan.cp > 1 else runner

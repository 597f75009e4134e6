"""The training loop: the same for every layout.

One optimizer step is a fixed sequence of named phases, each run inside
``with self.phase(name):`` -- the one place where measurement (``measure.probe``) and
failure handling (``guard``) attach, as context managers in :attr:`Trainer.phase_hooks`:

1. ``next_batch``        -- this rank's micro-batches (data wait)
2. ``forward_backward``  -- the :class:`~ptd.runtime.runner.StepRunner` (compute, and the
                            gradient collectives it overlaps)
3. ``global_loss``       -- one all-reduce: mean token loss of the global batch
4. ``clip_gradients``    -- global gradient norm (all-reduces for shards/stages), clipping
5. ``optimizer_step``    -- learning rate, AdamW (ZeRO-1: plus its broadcast), zero grads
6. ``record``            -- metrics.jsonl, progress bar

The whole step is the phase ``train_step`` (given the step number); ``evaluate`` and the
checkpointer's ``checkpoint_save`` are phases too.

Nothing here looks at the plan's dimensions: what differs between DDP, ZeRO, tensor or
pipeline parallelism is inside the model wrapper, the optimizer and the runner.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any, Callable, ContextManager, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn

from ..specs import TrainConfig
from .data.loader import DataLoader, MicroBatch
from .resilience.fault import FaultInjector
from .parallel.mesh import ParallelDims
from .measure.runlog import RunLog, summarize
from .model.moe import step_metrics as moe_metrics
from .optim import clip_grads_, global_grad_norm, lr_at, norm_params, set_lr
from .precision import Precision
from .runner import StepRunner


class Trainer:
    def __init__(self, cfg: TrainConfig, dims: ParallelDims, model: nn.Module, runner: StepRunner,
                 optimizer: torch.optim.Optimizer, precision: Precision, loader: DataLoader,
                 log: RunLog, val_batches: Sequence[Sequence[MicroBatch]] = (),
                 faults: FaultInjector | None = None) -> None:
        self.cfg = cfg
        self.dims = dims
        self.model = model
        self.runner = runner
        self.optimizer = optimizer
        self.precision = precision
        self.loader = loader
        self.log = log
        self.val_batches = val_batches
        self.faults = faults or FaultInjector(dims.rank, spec="")
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.norm_params = norm_params(model)
        """What the gradient norm is taken over: each tensor of the whole model once."""
        self.step = 0
        """Optimizer steps completed (what a checkpoint would record, with the loader's state)."""
        self.tokens = 0
        self.status = "ok"
        self.after_step: list[Callable[["Trainer", dict[str, Any]], None]] = []
        """Called after each completed step that does not stop the run (checkpointing)."""
        self.phase_hooks: list[Callable[[str, int | None], ContextManager[Any]]] = []
        """``hook(phase, step)`` returns a context manager entered around every run of that
        phase (``step`` is given for ``train_step`` only); the latest registered is the
        outermost, so it sees what the earlier ones raise."""
        self.record_hooks: list[Callable[[dict[str, Any]], None]] = []
        """Called with each step's record before it is logged (measurement adds its fields)."""

    @contextlib.contextmanager
    def phase(self, name: str, step: int | None = None) -> Iterator[None]:
        """Run the body as phase ``name`` inside every registered phase hook."""
        if not self.phase_hooks:
            yield
            return
        with contextlib.ExitStack() as stack:
            for hook in reversed(self.phase_hooks):
                stack.enter_context(hook(name, step))
            yield

    # ------------------------------------------------------------ phases
    def next_batch(self) -> list[MicroBatch]:
        with self.phase("next_batch"):
            return self.loader.next()

    def forward_backward(self, micro: Sequence[MicroBatch]) -> torch.Tensor:
        with self.phase("forward_backward"):
            return self.runner.forward_backward(micro)

    def global_loss(self, loss: torch.Tensor) -> float:
        """Average of the loss shares of the ranks that report one (all data-parallel
        replicas; on a pipeline only the last stages): the global-batch mean."""
        with self.phase("global_loss"):
            flag = 1.0 if self.runner.reports_loss else 0.0
            buf = torch.stack([loss.float() * flag, torch.tensor(flag, device=loss.device)])
            dist.all_reduce(buf)
            return float(buf[0] / buf[1])

    def clip_gradients(self) -> float:
        with self.phase("clip_gradients"):
            self.precision.unscale_(self.optimizer)
            norm = global_grad_norm(self.norm_params, self.dims.device, self.dims.grad_norm_groups())
            if self.cfg.optim.grad_clip > 0:
                clip_grads_(self.params, self.cfg.optim.grad_clip, norm)
            return float(norm)

    def optimizer_step(self, step: int) -> float:
        with self.phase("optimizer_step"):
            lr = lr_at(step, self.cfg.optim, self.cfg.steps)
            set_lr(self.optimizer, lr)
            self.precision.step(self.optimizer)
            self.optimizer.zero_grad(set_to_none=True)
            return lr

    def evaluate(self) -> float:
        with self.phase("evaluate"):
            losses = [self.global_loss(self.runner.evaluate(b)) for b in self.val_batches]
            return sum(losses) / len(losses)

    def _sync(self) -> None:
        if self.dims.device.type == "cuda":
            torch.cuda.synchronize(self.dims.device)

    # ------------------------------------------------------------ loop
    def train_step(self, step: int) -> dict[str, Any]:
        self.faults.at_step(step)
        t0 = time.perf_counter()
        micro = self.next_batch()
        local = self.forward_backward(micro)
        loss = self.global_loss(local)
        routing = moe_metrics(self.model, self.cfg.model.n_layers, self.dims.device,
                              self.cfg.model.n_experts)
        grad_norm = self.clip_gradients() if math.isfinite(loss) else float("nan")
        # fp16: the loss scaler skips overflowing steps itself (and lowers the scale).
        bad_grads = not math.isfinite(grad_norm) and self.precision.scaler is None
        skipped = not math.isfinite(loss) or bad_grads
        if skipped:  # the update is not applied (on_nan decides whether the run goes on)
            self.optimizer.zero_grad(set_to_none=True)
            lr = lr_at(step, self.cfg.optim, self.cfg.steps)
        else:
            lr = self.optimizer_step(step)
        self._sync()
        dt = time.perf_counter() - t0
        step_tokens = self.cfg.plan.tokens_per_step
        self.tokens += step_tokens
        self.step = step
        rec = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "tokens": self.tokens,
               "step_tokens": step_tokens, "step_time_s": dt, "tokens_per_s": step_tokens / dt,
               "skipped": skipped, **routing}
        if self.cfg.eval_every and (step % self.cfg.eval_every == 0 or step == self.cfg.steps):
            rec["val_loss"] = self.evaluate()
        return rec

    def train(self) -> dict[str, Any]:
        """Run to ``cfg.steps`` (from ``self.step``); return the summary."""
        start = time.perf_counter()
        ran = skipped = 0
        for step in range(self.step + 1, self.cfg.steps + 1):
            with self.phase("train_step", step):
                rec = self.train_step(step)
            for annotate in self.record_hooks:
                annotate(rec)
            rec["elapsed_s"] = time.perf_counter() - start
            ran, skipped = ran + 1, skipped + bool(rec["skipped"])
            if step % self.cfg.log_every == 0 or step == self.cfg.steps or rec["skipped"]:
                self.log.record(rec)
            if rec["skipped"] and self.cfg.on_nan == "stop":
                what = "loss" if not math.isfinite(rec["loss"]) else "gradient norm"
                self.status = (f"stopped: non-finite {what} ({rec['loss']} / {rec['grad_norm']}) "
                               f"at step {step}; nothing was saved from this step on")
                self.log.note(f"ptd: {self.status}")
                break
            for hook in self.after_step:
                hook(self, rec)
            if getattr(self, "stop_requested", False):  # Ctrl-C, agreed by every rank
                break
        if ran and skipped == ran and self.status == "ok":  # --on-nan skip: nothing learned
            self.status = (f"failed: every one of the {ran} step(s) had a non-finite loss or "
                           f"gradient and was skipped (--on-nan skip); no update was applied")
            self.log.note(f"ptd: {self.status}")
        return summarize(self.log.records) | {"status": self.status}

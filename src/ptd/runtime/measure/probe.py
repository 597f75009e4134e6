"""The measuring half, attached to a running :class:`~ptd.runtime.trainer.Trainer`.

:meth:`Probe.attach` registers :meth:`Probe.hook` among the trainer's phase hooks
(``Trainer.phase_hooks``): each phase runs in a ``record_function`` span with a wall-clock
timer, the step in ``ptd:step``; it also turns on the blocks' ``ptd:block`` spans (not with
``torch.compile``). The runners and pipeline stages open their own spans (``ptd:forward``,
``ptd:backward``, ...; see :mod:`.timeline`). Outside the profiled window the overhead is
one ``perf_counter`` pair per phase and a no-op ``record_function`` per span.

Which steps do what (``measure.*`` of the config; defaults for a long run):

* step 1: warm-up (lazy allocations, first-touch page faults): timed, not used;
* ``memory_step`` (2): model states counted from the tensors, activation peak tracked
  (:mod:`.memory`) -- the dispatch mode slows this step, so its time is not used either;
* ``profile_steps`` steps after it (3): ``torch.profiler`` records every op and collective
  of each rank; :mod:`.timeline` breaks each step down; their mean is the measured
  breakdown;
* every step: wall-clock time per phase (data, forward+backward, loss, optimizer) in
  ``metrics.jsonl`` (``t_data_s``, ``t_fwd_bwd_s``, ``t_loss_s``, ``t_optimizer_s``).

The measured step time and throughput are the mean over the steps that were neither the
first, nor the memory step, nor profiled ("clean" steps; all steps after the first when a
run is too short to have any).

At the end :meth:`Probe.finish` (a collective: every rank calls it) gathers every rank's
measurements on rank 0, which compares them with the cost model (:mod:`.compare`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any, Iterator

import torch
from .spans import set_device_sync
from .spans import span as ptd_span

from .device_memory import ActivationTracker, grads_of, model_state_bytes
from .timeline import Span, analyse_step, mean_breakdown


# phase -> (profiler span, wall-clock timer key)
_TIMED = {"next_batch": ("ptd:data", "data"), "global_loss": ("ptd:loss", "loss"),
          "clip_gradients": ("ptd:optimizer", "optimizer"),
          "optimizer_step": ("ptd:optimizer", "optimizer")}


def _modules_of(trainer: Any) -> list[torch.nn.Module]:
    runner = trainer.runner
    mods = [trainer.model]
    mods += list(getattr(runner, "modules", []))
    return mods


# torch.autograd.profiler's utility ops, which its own event list leaves out too
_SKIPPED = frozenset({"[memory]", "[OutOfMemory]", "profiler::_record_function_enter",
                      "profiler::_record_function_enter_new", "profiler::_record_function_exit",
                      "aten::is_leaf", "aten::output_nr", "aten::_version"})


def kineto_spans(prof: Any) -> list[Span]:
    """The spans of ``prof.events()`` (``FunctionEvent.cpu_parent`` tree), read from the raw
    Kineto results.

    ``prof.events()`` builds a Python ``FunctionEvent`` tree with memory and kernel
    bookkeeping this analysis does not use: 6-9 s per rank for the ~37,000 events of three
    profiled steps of the tiny model on 4 workers here, against a tenth of that for this.
    The tree is built as torch builds it: per thread, by time containment, synchronous CPU
    events only (``EventList._populate_cpu_children``), then an only child named as its
    parent is folded into it (``EventList._remove_dup_nodes``)."""
    from torch.autograd import DeviceType

    from .timeline import comm_kind
    res = prof.profiler.kineto_results
    t0 = res.trace_start_ns()
    raw = [e for e in res.events() if e.name() not in _SKIPPED and not e.is_hidden_event()]
    # a CPU event linked to another (a device runtime call) belongs to its launcher's thread
    front = {e.correlation_id(): e.start_thread_id() for e in raw if e.linked_correlation_id() == 0}
    rows = []
    for e in raw:
        cpu = e.device_type() == DeviceType.CPU
        thread, link = e.start_thread_id(), e.linked_correlation_id()
        if cpu and link > 0 and link in front:
            thread = front[link]
        sync = cpu and not e.is_async() and e.start_thread_id() == e.end_thread_id()
        rows.append((thread, (e.start_ns() - t0) / 1e3, (e.end_ns() - t0) / 1e3, e.name(), sync))
    rows.sort(key=lambda r: (r[0], r[1], -r[2]))  # parents before their children
    n = len(rows)
    parent = [-1] * n
    children = [0] * n
    stack: list[int] = []
    for i, (thread, start, end, _, sync) in enumerate(rows):
        if not sync:
            continue
        while stack and (rows[stack[-1]][0] != thread or start >= rows[stack[-1]][2]
                         or end > rows[stack[-1]][2]):
            stack.pop()
        if stack:
            parent[i] = stack[-1]
            children[stack[-1]] += 1
        stack.append(i)
    gone = [False] * n
    out: list[Span] = []
    depth = [0] * n
    comm_below = [False] * n  # this span or an ancestor is a communication op
    for i, (thread, start, end, name, _) in enumerate(rows):
        p = parent[i]
        while p >= 0 and gone[p]:
            p = parent[p]
        parent[i] = p
        if p >= 0 and rows[p][3] == name and children[p] == 1:
            gone[i] = True  # folded into its parent, which takes over its children
            children[p] = children[i]
            continue
        depth[i] = depth[p] + 1 if p >= 0 else 0
        anc = comm_below[p] if p >= 0 else False
        comm_below[i] = anc or comm_kind(name) is not None
        out.append(Span(name, int(thread), start, end, depth[i], anc))
    return out


_TIMELINE_SPANS = {"ptd:forward": "F", "ptd:backward": "B", "ptd:backward_w": "W",
                   "ptd:optimizer": "opt", "ptd:grad_sync": "sync", "ptd:loss": "loss",
                   "ptd:data": "data"}


def step_timeline(spans: list[Span], main: int, step: Span) -> list[tuple[str, float, float]]:
    """The phases of one step on the main thread and the collectives on the others, in
    milliseconds from the step's start (for the pipeline timeline plot)."""
    from .timeline import comm_kind
    out = []
    for sp in spans:
        if sp.end <= step.start or sp.start >= step.end:
            continue
        if sp.thread == main and sp.name in _TIMELINE_SPANS and sp.depth <= 3:
            label = _TIMELINE_SPANS[sp.name]
        elif sp.thread != main and sp.name.startswith(("gloo:", "nccl:")):
            label = "comm:" + (comm_kind(sp.name) or "other")
        else:
            continue
        out.append((label, round((sp.start - step.start) / 1e3, 3), round((sp.end - step.start) / 1e3, 3)))
    out.append(("step", 0.0, round((step.end - step.start) / 1e3, 3)))
    return out


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 for a moment: Kineto (torch 2.13) writes a ``USDT: ...
    profiler_start`` / ``profiler_stop`` line from C++ at each start and stop, on every rank,
    with no switch to turn it off."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class Probe:
    def __init__(self, trainer: Any, cfg: Any, dims: Any, *, memory_step: int = 2,
                 profile_steps: int = 3) -> None:
        self.trainer = trainer
        self.cfg = cfg
        self.dims = dims
        steps = cfg.steps
        # Counted from the step this run starts at (a resumed run starts past 0); its first
        # step is warm-up either way.
        base = int(getattr(trainer, "step", 0))
        self.first_step = base + 1
        self.memory_step = min(base + memory_step, steps) if memory_step > 0 else 0
        first_prof = max(self.memory_step, base + 1) + 1
        self.profile_range = range(first_prof, min(steps, first_prof + profile_steps - 1) + 1) \
            if profile_steps > 0 else range(0)
        self.timer: dict[str, float] = {}
        self.step_times: dict[int, float] = {}
        self.memory: dict[str, Any] = {}
        self.breakdowns: list = []
        self._prof: Any = None
        self._tracker: ActivationTracker | None = None
        self.profile_overhead: dict[str, float] = {}
        self.timeline: list[tuple[str, float, float]] = []

    # ------------------------------------------------------------ attach
    @classmethod
    def attach(cls, trainer: Any, cfg: Any, dims: Any, **kw: Any) -> "Probe":
        p = cls(trainer, cfg, dims, **kw)
        trainer.phase_hooks.append(p.hook)
        trainer.record_hooks.append(p.annotate)
        if not cfg.compile:
            from ..model.layers import Attention
            from ..model.transformer import Block
            for m in _modules_of(trainer):
                for sub in m.modules():
                    if isinstance(sub, (Block, Attention)):
                        sub.span = True
        return p

    def hook(self, phase: str, step: int | None = None) -> contextlib.AbstractContextManager[Any]:
        """The trainer's phase hook: what this probe does around each phase."""
        if phase == "train_step" and step is not None:
            return self._step(step)
        if phase == "forward_backward":
            return self._forward_backward()
        if phase in _TIMED:
            return self._timed(*_TIMED[phase])
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def _timed(self, span: str, key: str) -> Iterator[None]:
        t0 = time.perf_counter()
        with ptd_span(span):
            yield
        self.timer[key] = self.timer.get(key, 0.0) + time.perf_counter() - t0

    @contextlib.contextmanager
    def _forward_backward(self) -> Iterator[None]:
        """Timed; on the memory step, the activation peak tracked and the model states
        counted from the tensors."""
        t0 = time.perf_counter()
        tracker = self._tracker
        if tracker is None:
            yield
        else:
            cuda = self.dims.device.type == "cuda"
            if cuda:
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            with tracker:
                yield
            mods = _modules_of(self.trainer)
            grads = tracker.uids_of(grads_of(mods))
            self.memory["activations"] = tracker.peak_excluding(grads)
            self.memory["activations_with_grads"] = tracker.peak
            if cuda:
                torch.cuda.synchronize()
                self.memory["allocator_peak_above_start"] = torch.cuda.max_memory_allocated() - base
            self.memory["model_states"] = model_state_bytes(mods, self.trainer.optimizer)
        self.timer["fwd_bwd"] = self.timer.get("fwd_bwd", 0.0) + time.perf_counter() - t0

    # ------------------------------------------------------------ per step
    @contextlib.contextmanager
    def _step(self, step: int) -> Iterator[None]:
        self.timer.clear()
        if step == self.memory_step:
            self._tracker = ActivationTracker()
        if step in self.profile_range and self._prof is None:
            self._start_profiler()
        t0 = time.perf_counter()
        with ptd_span("ptd:step"):
            yield
        dt = time.perf_counter() - t0
        self._tracker = None
        if step == self.memory_step and "model_states" not in self.memory:
            mods = _modules_of(self.trainer)
            self.memory["model_states"] = model_state_bytes(mods, self.trainer.optimizer)
        self.step_times[step] = dt
        if self._prof is not None and step == self.profile_range[-1]:
            self._stop_profiler()

    def annotate(self, rec: dict[str, Any]) -> None:
        """Add this step's phase timings and what the step was used for to its record."""
        step = rec["step"]
        for k in ("data", "fwd_bwd", "loss", "optimizer"):
            rec[f"t_{k}_s"] = self.timer.get(k, 0.0)
        if step in self.profile_range:
            rec["profiled"] = True
        if step == self.memory_step:
            rec["memory_tracked"] = True

    def _start_profiler(self) -> None:
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU]
        if self.dims.device.type == "cuda":
            acts.append(ProfilerActivity.CUDA)
            set_device_sync(True)  # spans hold their own kernels' time (see .spans)
        self._prof = profile(activities=acts, record_shapes=False, with_stack=False)
        with _quiet_stderr():
            self._prof.__enter__()

    def _stop_profiler(self) -> None:
        set_device_sync(False)
        t0 = time.perf_counter()
        with _quiet_stderr():
            self._prof.__exit__(None, None, None)
        spans = kineto_spans(self._prof)
        steps = sorted((s for s in spans if s.name == "ptd:step"), key=lambda s: s.start)
        main = steps[0].thread if steps else 0
        self.breakdowns = [analyse_step(spans, main, (s.start, s.end)) for s in steps]
        if steps:
            self.timeline = step_timeline(spans, main, steps[-1])
        if os.environ.get("PTD_PROBE_DUMP"):
            from .timeline import comm_kind
            from collections import Counter
            names = Counter((sp.thread == main, sp.name) for sp in spans if sp.depth <= 2)
            path = os.path.join(self.cfg.out, f"probe_rank{self.dims.rank}.txt")
            with open(path.replace(".txt", ".spans"), "w") as f:
                st = steps[-1]
                for sp in spans:
                    if sp.start >= st.start and sp.end <= st.end and (
                            comm_kind(sp.name) or sp.name.startswith(("ptd:", "PP:"))):
                        f.write(f"{sp.thread == main}\t{sp.depth}\t{(sp.start - st.start) / 1e3:.3f}"
                                f"\t{(sp.end - st.start) / 1e3:.3f}\t{sp.name}\n")
            with open(path, "w") as f:
                for (is_main, name), c in sorted(names.items(), key=lambda kv: -kv[1]):
                    f.write(f"{'main' if is_main else 'other'}\t{c}\t{name}\n")
        self.profile_overhead["analysis_s"] = time.perf_counter() - t0
        self.profile_overhead["events"] = len(spans)
        self._prof = None

    # ------------------------------------------------------------ results
    def clean_steps(self) -> list[int]:
        special = {self.first_step, self.memory_step, *self.profile_range}
        clean = [s for s in sorted(self.step_times) if s not in special]
        return (clean or [s for s in sorted(self.step_times) if s != self.first_step]
                or sorted(self.step_times))

    def local_result(self) -> dict[str, Any]:
        b = mean_breakdown(self.breakdowns) if self.breakdowns else None
        return {
            "rank": self.dims.rank,
            "coords": dict(self.dims.coords),
            "step_times": self.step_times,
            "breakdown": None if b is None else {
                "step": b.step, "parts": b.parts, "comm_total": b.comm_total,
                "comm_exposed_by_phase": b.comm_exposed_by_phase},
            "memory": self.memory,
            "profile_overhead": self.profile_overhead,
            "timeline": self.timeline,
        }

    def finish(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Gather every rank's results on rank 0 and compare with the cost model; returns
        the keys to add to ``summary.json`` (empty on other ranks). A collective."""
        import torch.distributed as dist
        mine = self.local_result()
        ranks: list[Any] = [None] * self.dims.world_size
        if dist.is_initialized() and self.dims.world_size > 1:
            dist.all_gather_object(ranks, mine)
        else:
            ranks = [mine]
        if not self.dims.is_main:
            return {}
        from ...summary.compare import build_report
        from ..calibrate.first_run import resolve_hardware
        hw, hw_src = resolve_hardware(self.cfg.hardware,
                                      str(summary.get("device", "cpu")).split(":")[0])
        return build_report(self.cfg, ranks, self.clean_steps(), hw, hw_src)

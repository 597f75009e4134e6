"""Turn one rank's profiler events of one optimizer step into a step-time breakdown.

Pure Python (no torch): the input is a list of :class:`Span` -- name, thread, start and end
in microseconds -- taken from ``torch.profiler`` events (:mod:`ptd.runtime.measure.probe`
converts them), so the arithmetic is testable on hand-made timelines.

**What is on the timeline.** The trainer's phases are ``record_function`` spans on the main
thread, opened by :mod:`ptd.runtime.measure.probe` around the real calls:

=====================  ================================================================
span                   what
=====================  ================================================================
``ptd:step``           one optimizer step (the interval that is broken down)
``ptd:data``           the data loader (data wait)
``ptd:forward``        a micro-batch's forward (a pipeline stage's ``forward_one_chunk``)
``ptd:backward``       its backward (``backward_one_chunk``: input and weight gradients)
``ptd:backward_w``     zero-bubble weight-gradient pass (``backward_weight_one_chunk``)
``ptd:block``          one transformer block's forward; inside a backward span it is the
                       activation checkpoint's **recompute**
``ptd:grad_sync``      the runner's explicit data-parallel gradient average (tp/pp layouts)
``ptd:schedule``       a pipeline schedule's whole ``step`` (what is not F/B/W in it is
                       waiting for the neighbours or moving activations)
``ptd:loss``           the all-reduce of the step's loss (bookkeeping the cost model lacks)
``ptd:optimizer``      gradient-norm, clipping, the optimizer step (ZeRO-1 broadcast inside)
=====================  ================================================================

Communication is the work of the collectives themselves: gloo runs them on its own worker
threads (``gloo:all_reduce``, ``gloo:broadcast``, ``gloo:send``, ...; NCCL kernels would
be ``nccl:*``), and the main thread records their launches and waits (``c10d::allreduce_``,
``_c10d_functional::all_gather_into_tensor``, ``wait_tensor`` ...). DDP launches its
bucket all-reduces from the backward and they run on the gloo thread while the backward
goes on; DTensor tensor-parallel collectives are waited for at once (exposed).

**The partition.** Every instant of the step goes to exactly one part, so the parts add up
to the step time by construction (``other`` is what lies between phase spans):

1. the main thread runs a communication op (launch or wait): **exposed communication** of
   that op's kind;
2. else it runs a compute op (any other op): the innermost phase (recompute > backward
   weight > backward > forward > grad sync > loss > optimizer > data);
3. else (no op on the main thread: Python, dispatch, or blocked) while a collective is in
   flight: **exposed communication** of the kinds in flight (shared equally) -- except,
   inside a pipeline schedule, point-to-point transfers alone: on gloo a send or receive
   lasts until the peer posts its side, so this is the stage waiting for its neighbour:
   **bubble** (the pipeline's exposed transfer time is then only what the main thread spends
   in the send/receive calls themselves);
4. else, inside a pipeline schedule but outside its F/B/W actions: **bubble**;
5. else: the innermost phase (its Python overhead), or ``other`` outside every phase.

**Total** communication per kind is the busy time of the communication threads (the union
of their spans of that kind), hidden or not.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Iterable, Sequence

# Innermost first: the part an instant goes to when several phase spans cover it.
PHASES = ("recompute", "backward_w", "backward", "forward", "grad_sync", "loss", "optimizer",
          "data", "schedule")
PHASE_SPANS = {"ptd:forward": "forward", "ptd:backward": "backward",
               "ptd:backward_w": "backward_w", "ptd:grad_sync": "grad_sync",
               "ptd:schedule": "schedule", "ptd:loss": "loss", "ptd:optimizer": "optimizer",
               "ptd:data": "data"}
MARKERS = ("ptd:", "PP:", "Forward ", "Backward ", "ProfilerStep", "## ", "FSDP::",
           "RegisterPostBackwardFunction", "autograd::engine::evaluate_function", "EPAllToAll")
"""Span names that mark regions rather than run work (ours, torch.distributed.pipelining's,
the profiler's own, FSDP2's ``record_function`` regions and its post-backward autograd node,
the autograd engine's per-node wrapper, which runs the node's hooks, and expert
parallelism's all-to-all autograd function, forward and backward, which waits in
``dist.all_to_all_single``: ``runtime/parallel/ep.py``). The work inside them
shows as operators of its own; what is left is Python, or waiting: on a CPU FSDP2's
gathers and gradient reductions run to their end inside these regions (no streams to
overlap them on), and that wait is the collective's exposed time, not computation."""

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send", "recv",
         "barrier", "wait")


@dataclass(frozen=True)
class Span:
    name: str
    thread: int
    start: float
    """Microseconds."""
    end: float
    depth: int = 0
    """Nesting depth on its thread (0: top level)."""
    comm_ancestor: bool = False
    """Nested inside a communication op (its work belongs to that op)."""


def comm_kind(name: str) -> str | None:
    """The collective kind of a communication span, or None for anything else."""
    n = name.lower()
    if not (n.startswith(("gloo:", "nccl:", "c10d::", "_c10d_functional", "c10d_functional",
                          "record_param_comms", "mpi:"))
            or "wait_tensor" in n):
        return None
    if "wait_tensor" in n or n.endswith("::wait"):
        return "wait"
    for key, kind in (("allreduce", "all_reduce"), ("all_reduce", "all_reduce"),
                      ("reduce_scatter", "reduce_scatter"), ("reducescatter", "reduce_scatter"),
                      ("allgather", "all_gather"), ("all_gather", "all_gather"),
                      ("alltoall", "all_to_all"), ("all_to_all", "all_to_all"),
                      ("broadcast", "broadcast"), ("barrier", "barrier"),
                      ("recv", "recv"), ("send", "send")):
        if key in n:
            return kind
    return "wait" if n.startswith(("c10d::", "_c10d_functional")) else None


def is_marker(name: str) -> bool:
    return name.startswith(MARKERS)


@dataclass
class MeasuredStep:
    """Seconds of one optimizer step on one rank, by part; ``parts`` sum to ``step``."""

    step: float
    parts: dict[str, float] = field(default_factory=dict)
    """data, forward, backward, backward_w, recompute, grad_sync, loss, optimizer, schedule,
    bubble, other, and ``comm:KIND`` for each exposed collective kind."""
    comm_total: dict[str, float] = field(default_factory=dict)
    """Busy time of the communication threads per kind (hidden or not)."""
    comm_exposed_by_phase: dict[str, dict[str, float]] = field(default_factory=dict)
    """Exposed communication per phase it happened in, then per kind."""

    @property
    def comm_exposed(self) -> dict[str, float]:
        return {k[5:]: v for k, v in self.parts.items() if k.startswith("comm:")}


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(intervals: Sequence[tuple[float, float]], lo: float, hi: float) -> float:
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in intervals)


@functools.lru_cache(maxsize=8192)
def _span_key(name: str) -> str | None:
    """What a span named ``name`` is to :func:`analyse_step`: ``bg:KIND`` (a collective's
    own work, on whatever thread it was recorded: gloo records point-to-point work under the
    launching thread, asynchronously), ``mc:KIND`` (the main thread launching or waiting),
    ``ph:PHASE``, ``blk`` (a transformer block), ``""`` (a marker: skipped) or None (an op).
    Cached: ~37,000 spans a profile, a few hundred distinct names."""
    kind = comm_kind(name)
    if kind is not None:
        return ("bg:" if name.lower().startswith(("gloo:", "nccl:", "mpi:")) else "mc:") + kind
    if name in PHASE_SPANS:
        return "ph:" + PHASE_SPANS[name]
    if name == "ptd:block":
        return "blk"
    if name.startswith(("PP:", "Forward ", "Backward ")) or is_marker(name):
        return ""
    return None


def analyse_step(spans: Sequence[Span], main_thread: int, step: tuple[float, float]
                 ) -> MeasuredStep:
    """Break the step interval ``step`` (µs) down from ``spans`` (see the module docstring).
    Returned values are in seconds."""
    s0, s1 = step
    pts, comm_spans = _boundaries(spans, main_thread, s0, s1)
    parts: dict[str, float] = {}
    by_phase: dict[str, dict[str, float]] = {}
    for st, dt in _time_in_sets(pts, s0, s1).items():
        _credit(st, dt, parts, by_phase)
    scale = 1e-6
    totals = {k: _length(_union(v), s0, s1) * scale for k, v in comm_spans.items()}
    return MeasuredStep(step=(s1 - s0) * scale,
                        parts={k: v * scale for k, v in parts.items()},
                        comm_total=totals,
                        comm_exposed_by_phase={p: {k: v * scale for k, v in d.items()}
                                               for p, d in by_phase.items()})


def _boundaries(spans: Sequence[Span], main_thread: int, s0: float, s1: float
                ) -> tuple[list[tuple[float, int, str]], dict[str, list[tuple[float, float]]]]:
    """Sorted (time, +1/-1, key) boundaries of the spans that count, clipped to the step,
    and the intervals of each background collective kind."""
    pts: list[tuple[float, int, str]] = []
    comm_spans: dict[str, list[tuple[float, float]]] = {}

    def add(a: float, b: float, key: str) -> None:
        a, b = max(a, s0), min(b, s1)
        if b > a:
            pts.append((a, 1, key))
            pts.append((b, -1, key))

    for sp in spans:
        if sp.end <= s0 or sp.start >= s1:
            continue
        key = _span_key(sp.name)
        if key is not None and key.startswith("bg:"):
            add(sp.start, sp.end, key)
            comm_spans.setdefault(key[3:], []).append((sp.start, sp.end))
        elif sp.thread != main_thread:
            continue
        elif key is None:
            if not sp.comm_ancestor:
                add(sp.start, sp.end, "op")
        elif key:
            add(sp.start, sp.end, key)
    pts.sort(key=lambda p: (p[0], -p[1]))
    return pts, comm_spans


def _time_in_sets(pts: list[tuple[float, int, str]], s0: float, s1: float
                  ) -> dict[frozenset[str], float]:
    """Time spent in each set of open span keys. The boundaries are swept once and each
    distinct set credited once later (the credit rule is linear in time): a profile of three
    steps has ~70,000 boundaries but only a few hundred distinct sets."""
    count: dict[str, int] = {}
    open_keys: set[str] = set()
    time_in: dict[frozenset[str], float] = {}
    prev = s0
    for t, delta, key in pts:
        if t > prev:
            st = frozenset(open_keys)
            time_in[st] = time_in.get(st, 0.0) + (t - prev)
            prev = t
        n = count.get(key, 0) + delta
        count[key] = n
        if n > 0:
            open_keys.add(key)
        else:
            open_keys.discard(key)
    if s1 > prev:
        st = frozenset(open_keys)
        time_in[st] = time_in.get(st, 0.0) + (s1 - prev)
    return time_in


def _phase(st: frozenset[str]) -> str | None:
    if "blk" in st and ("ph:backward" in st or "ph:backward_w" in st):
        return "recompute"
    for ph in PHASES[1:]:
        if "ph:" + ph in st:
            return ph
    return None


def _credit(st: frozenset[str], dt: float, parts: dict[str, float],
            by_phase: dict[str, dict[str, float]]) -> None:
    """Add ``dt`` spent with the keys ``st`` open to the part it belongs to."""
    ph = _phase(st)
    main_comm = sorted(k[3:] for k in st if k.startswith("mc:"))
    bg = sorted(k[3:] for k in st if k.startswith("bg:"))
    if main_comm:
        kinds = main_comm if main_comm != ["wait"] or not bg else bg
    elif "op" in st:
        kinds = []
    else:
        kinds = bg
    if kinds and set(kinds) <= {"send", "recv"} and "ph:schedule" in st and not main_comm:
        # On gloo a point-to-point transfer lasts until the peer has posted its side:
        # with nothing else to run, this stage waits for its neighbour.
        parts["bubble"] = parts.get("bubble", 0.0) + dt
        return
    if kinds:
        for k in kinds:
            parts["comm:" + k] = parts.get("comm:" + k, 0.0) + dt / len(kinds)
            d = by_phase.setdefault(ph or "other", {})
            d[k] = d.get(k, 0.0) + dt / len(kinds)
        return
    if ph == "schedule" and "op" not in st:
        parts["bubble"] = parts.get("bubble", 0.0) + dt
        return
    key = ph or "other"
    parts[key] = parts.get(key, 0.0) + dt


def mean_breakdown(steps: Sequence[MeasuredStep]) -> MeasuredStep:
    """Average of several steps' breakdowns (part by part)."""
    n = len(steps)
    out = MeasuredStep(step=sum(s.step for s in steps) / n)
    for s in steps:
        for k, v in s.parts.items():
            out.parts[k] = out.parts.get(k, 0.0) + v / n
        for k, v in s.comm_total.items():
            out.comm_total[k] = out.comm_total.get(k, 0.0) + v / n
        for p, d in s.comm_exposed_by_phase.items():
            o = out.comm_exposed_by_phase.setdefault(p, {})
            for k, v in d.items():
                o[k] = o.get(k, 0.0) + v / n
    return out

"""No silent hangs: a collective that times out becomes an error naming this rank, the
operation, the step, and which peer is stuck where.

``timeout_s`` (``--timeout``) already bounds every collective (``init_process_group``), but
torch's message says neither who waited for what nor who did not come: gloo reports
``Timed out waiting 5000ms for recv operation to complete``. So every worker

* marks which phase of which step it is in (the trainer's phases -- ``next_batch``,
  ``forward_backward``, ``global_loss``, ``clip_gradients``, ``optimizer_step``,
  ``evaluate`` -- and checkpoint saving/loading), through the trainer's phase hooks
  (:meth:`Watch.hook` in ``Trainer.phase_hooks``);
* publishes that position to the job's key-value store from a background thread about
  once a second (``ptd/heartbeat/<rank>``), which keeps running while the main thread is
  blocked in a collective or asleep;
* turns a timeout (or a lost connection) raised inside a phase into
  :class:`CollectiveTimeout`: ``rank 0: DDP gradient all-reduce (forward_backward) at step 2
  timed out after 5 s; rank 1 is stuck at step 2 in 'start of step' for 5.1 s ...``,
  chained to torch's own error.
"""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

import torch.distributed as dist

from ...specs import ParallelPlan


class CollectiveTimeout(RuntimeError):
    """A collective gave up waiting for a peer (or lost it)."""


def describe_phase(phase: str, plan: ParallelPlan) -> str:
    """What collective a phase waits in, for the plan at hand."""
    grads = "DDP gradient all-reduce" if plan.zero == 0 else "FSDP all-gather / reduce-scatter"
    if plan.tp > 1:
        grads += " and tensor-parallel collectives"
    if plan.pp > 1:
        grads += " and pipeline send/recv"
    return {
        "train_step": "start of step",
        "end_of_step": "end of step (logging, checkpoint)",
        "next_batch": "data loading",
        "forward_backward": f"{grads} (forward_backward)",
        "global_loss": "all-reduce of the step's loss (global_loss)",
        "clip_gradients": "all-reduce of the gradient norm (clip_gradients)",
        "optimizer_step": "optimizer step",
        "evaluate": "all-reduce of the validation loss (evaluate)",
        "checkpoint_save": "checkpoint save (plan exchange, barrier)",
        "checkpoint_load": "checkpoint validation and load",
    }.get(phase, phase)


_TIMEOUT_WORDS = ("timed out", "timeout", "watchdog")
_LOST_WORDS = ("connection closed by peer", "connection reset", "broken pipe", "socket closed",
               "connection refused", "no route to host")


def _kind(e: BaseException) -> str | None:
    text = str(e).lower()
    if any(w in text for w in _TIMEOUT_WORDS):
        return "timeout"
    if any(w in text for w in _LOST_WORDS):
        return "lost"
    return None


class Watch:
    """This rank's position (step, phase), published for its peers; see the module doc."""

    def __init__(self, rank: int, world: int, plan: ParallelPlan, timeout_s: float,
                 store: Any = None, interval_s: float = 1.0) -> None:
        self.rank, self.world, self.plan, self.timeout_s = rank, world, plan, timeout_s
        self.store = store
        self.interval_s = interval_s
        self.step = 0
        self.phase = "setup"
        self.since = time.time()
        self._last_publish = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_job(cls, rank: int, world: int, plan: ParallelPlan, timeout_s: float) -> "Watch":
        store = None
        if world > 1 and dist.is_initialized():
            try:
                store = dist.distributed_c10d._get_default_store()
            except Exception:  # noqa: BLE001 - no store: still annotate, without peer positions
                store = None
        w = cls(rank, world, plan, timeout_s, store, interval_s=min(1.0, max(0.2, timeout_s / 5)))
        w.start()
        return w

    # ------------------------------------------------------------ heartbeat
    def _key(self, rank: int) -> str:
        return f"ptd/heartbeat/{rank}"

    def publish(self) -> None:
        if self.store is None:
            return
        msg = {"step": self.step, "phase": self.phase, "since": self.since, "at": time.time(),
               "pid": os.getpid()}
        self._last_publish = msg["at"]
        try:
            self.store.set(self._key(self.rank), json.dumps(msg))
        except Exception:  # noqa: BLE001 - the store going away must not kill training
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.publish()

    def start(self) -> None:
        if self.store is not None and self._thread is None:
            self.publish()
            self._thread = threading.Thread(target=self._run, name="ptd-heartbeat", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def peers(self) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        if self.store is None:
            return out
        for r in range(self.world):
            if r == self.rank:
                continue
            try:
                if self.store.check([self._key(r)]):
                    out[r] = json.loads(self.store.get(self._key(r)))
            except Exception:  # noqa: BLE001
                continue
        return out

    # ------------------------------------------------------------ phases
    @contextmanager
    def phase_of(self, phase: str, step: int | None = None) -> Iterator[None]:
        prev = (self.step, self.phase, self.since)
        if step is not None:
            self.step = step
        self.phase, self.since = phase, time.time()
        try:
            yield
        except CollectiveTimeout:
            raise
        except Exception as e:  # noqa: BLE001 - re-raised, annotated or as is
            kind = _kind(e)
            if kind is None:
                raise
            raise CollectiveTimeout(self.explain(kind, e)) from e
        finally:
            if step is None:
                self.step, self.phase, self.since = prev
            else:  # a step ended (or failed): what follows is logging and checkpointing
                self.phase, self.since = "end_of_step", time.time()

    @contextmanager
    def hook(self, phase: str, step: int | None = None) -> Iterator[None]:
        """The trainer's phase hook: this rank is in ``phase`` (of ``step``, when a step
        starts: then peers are told at once)."""
        with self.phase_of(phase, step):
            if step is not None:
                self.maybe_publish()
            yield

    def maybe_publish(self, min_interval_s: float = 0.25) -> None:
        """Publish now unless the heartbeat did so very recently (at step starts: peers
        then see every step, not only one position a second)."""
        if time.time() - self._last_publish >= min_interval_s:
            self.publish()

    def explain(self, kind: str, err: BaseException) -> str:
        op = describe_phase(self.phase, self.plan)
        what = (f"timed out after {self.timeout_s:g} s" if kind == "timeout"
                else "lost the connection to a peer")
        head = f"rank {self.rank}: {op} at step {self.step} {what}"
        torch_says = next((ln.strip() for ln in str(err).splitlines() if ln.strip()), "")
        return f"{head}; {self.peer_report()}; torch: {torch_says[:160]}"

    def peer_report(self) -> str:
        if self.store is None:
            return "peer positions unknown (no store)"
        now = time.time()
        peers = self.peers()
        stale_after = 3 * self.interval_s + 2.0
        notes = []
        for r in range(self.world):
            if r == self.rank:
                continue
            p = peers.get(r)
            if p is None:
                notes.append(f"rank {r} never reported")
                continue
            where = f"step {p['step']} in '{describe_phase(p['phase'], self.plan)}'"
            silent = now - p["at"]
            if silent > stale_after:
                notes.append(f"rank {r} silent for {silent:.1f} s (last at {where}): dead or frozen")
            elif (p["step"], p["phase"]) != (self.step, self.phase):
                if p["at"] >= self.since and now - p["since"] > 2 * self.interval_s:
                    # Reported while this rank was waiting, and there for a while: stuck.
                    notes.append(f"rank {r} is stuck at {where} for {now - p['since']:.1f} s")
                else:
                    notes.append(f"rank {r} last reported {where} {silent:.1f} s ago")
        if not notes:
            return f"every peer is at step {self.step} in the same phase (a slow peer, or the network)"
        if len(notes) > 4:
            notes = notes[:4] + [f"{len(notes) - 4} more"]
        return "; ".join(notes)


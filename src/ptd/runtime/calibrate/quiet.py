"""Was the machine quiet while ``ptd calibrate`` timed it? The CPU time other processes took.

A calibration measures the rates every prediction on this machine is priced at. Other work
running beside one of its stages (a test suite, a training run, workers a stopped
calibration left behind) makes that stage read slow, and nothing in the timings says so: on
2026-11-28 a calibration read two workers' matmuls at 0.54 of one worker's rate because a
stopped calibration's workers were still running, and the bench priced with it ran at
0.52-0.75 of its predictions (docs/measuring.md, seventeenth session). The load average
before the start does not see work that starts later.

So at the start of each stage the parent reads the machine's busy CPU time (``/proc/stat``:
user, nice, system, irq, softirq and steal, over all CPUs) and the CPU time of itself and
its descendants (``/proc/PID/stat``); the rest, divided by the stage's wall time, is the
number of cores other work kept busy then. A hypervisor's steal counts as other work: the
time was not the calibration's. Linux only; elsewhere nothing is measured.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

WARN_CORES = 0.25
"""Other work above this many cores in any stage gets a warning: a quarter of a core is
well above what an idle machine's daemons take (0.01-0.03 on the 2-core box measured)."""


def _busy_ticks() -> int | None:
    try:
        f = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    # cpu user nice system idle iowait irq softirq steal ...
    return sum(int(f[i]) for i in (1, 2, 3, 6, 7, 8) if i < len(f))


def _stat(pid: str) -> tuple[int, int, int] | None:
    """(parent pid, user + system ticks, the same of its reaped children) of one process."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(rest[1]), int(rest[11]) + int(rest[12]), int(rest[13]) + int(rest[14])


def _own_ticks(root: int) -> int:
    """CPU ticks of ``root``, of every descendant alive (threads included) and of those it
    has reaped (a worker that has exited and been joined still counts)."""
    procs: dict[int, tuple[int, int, int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (s := _stat(d)) is not None:
            procs[int(d)] = s
    mine, grew = {root}, True
    total = procs.get(root, (0, 0, 0))[2]
    while grew:
        grew = False
        for pid, (ppid, _, _) in procs.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                grew = True
    for pid in mine:
        total += procs.get(pid, (0, 0, 0))[1]
    return total


def other_cores(t0: float, busy0: int, own0: int, t1: float, busy1: int, own1: int,
                hz: float) -> float:
    """Cores other work kept busy between two samples: (machine busy - ours) / wall."""
    if t1 <= t0:
        return 0.0
    return max(0.0, ((busy1 - busy0) - (own1 - own0)) / hz / (t1 - t0))


class OtherLoad:
    """Samples at each stage's start (:meth:`tick` wraps the progress callback)."""

    def __init__(self) -> None:
        self.hz = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
        self.root = os.getpid()
        self.samples: list[tuple[str, float, int, int]] = []
        self.ok = _busy_ticks() is not None

    def mark(self, label: str) -> None:
        """A stage (or run) named ``label`` starts now."""
        if self.ok:
            busy = _busy_ticks()
            if busy is not None:
                self.samples.append((label, time.monotonic(), busy, _own_ticks(self.root)))

    def tick(self, on_tick: Callable[[str], None]) -> Callable[[str], None]:
        def both(label: str) -> None:
            self.mark(label)
            on_tick(label)
        return both

    def stop(self) -> None:
        """The end of the last stage (a stage begun after it starts a new interval)."""
        self.mark("")

    def stages(self) -> list[dict]:
        """``{"stage", "seconds", "cores"}`` for each stage, in order."""
        out = []
        for (label, t0, b0, o0), (_, t1, b1, o1) in zip(self.samples, self.samples[1:]):
            out.append({"stage": label, "seconds": round(t1 - t0, 2),
                        "cores": round(other_cores(t0, b0, o0, t1, b1, o1, self.hz), 3)})
        return out


MIN_STAGE_S = 0.5
"""Shorter stages are not judged: the kernel counts CPU time in ticks of 10 ms, so one tick
more or less in a 0.1 s stage reads as 0.1 core (0.0-0.23 in short stages of a quiet run)."""


def warning(entries: list[dict], cpu_count: int, key: str = "stage",
            consequence: str = "the rates measured then read low; run ptd calibrate again "
                               "on a quiet machine") -> str | None:
    """The warning line for stages (or a bench's runs, ``key="run"``) that other work
    shared, or None."""
    judged = [s for s in entries if s["seconds"] >= MIN_STAGE_S]
    busy = [s for s in judged if s["cores"] >= WARN_CORES]
    if not busy:
        return None
    worst = max(busy, key=lambda s: s["cores"])
    return (f"warning: other processes kept {worst['cores']:.2f} of {cpu_count} cores busy "
            f"during '{worst[key]}' ({len(busy)} of {len(judged)} {key}s of "
            f"{MIN_STAGE_S:g} s or more above {WARN_CORES}): {consequence}")

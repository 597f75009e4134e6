"""Processes ptd starts end with it.

``ptd calibrate`` times the machine in worker processes, and ``ptd bench`` and ``ptd plan
--try`` run each ``ptd train`` as a child. Python's default answer to SIGTERM (what a job
scheduler, ``kill`` or a CI runner sends) is to die at once, skipping every ``finally``: the
children were left running, and a calibration's orphaned workers went on timing matmuls
for minutes beside whatever ran next, which then measured a machine that was not quiet.
So while children run, SIGTERM raises :class:`Terminated` in the main thread (the
``finally`` blocks stop the children; ``ptd`` exits 143), and each child asks the kernel
to signal it when its parent dies (Linux ``PR_SET_PDEATHSIG``), which also covers a
parent killed with SIGKILL, where no code of the parent runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from typing import Any, Iterator, Sequence

EXIT_TERMINATED = 128 + signal.SIGTERM
_PR_SET_PDEATHSIG = 1


class Terminated(BaseException):
    """SIGTERM reached ptd while it had children (a BaseException, so that ``except
    Exception`` handlers on the way out do not swallow it)."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated(f"signal {signum}")


@contextlib.contextmanager
def terminate_on_sigterm() -> Iterator[None]:
    """While inside, SIGTERM raises :class:`Terminated` (main thread only: elsewhere
    Python cannot install handlers, and nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


_prctl: Any = None


def _load_prctl() -> Any:
    """libc's ``prctl``, looked up once (None off Linux or where it cannot be found). Looked
    up in the parent before a fork, so that the child's ``preexec_fn`` only calls it: a
    ``dlopen`` between ``fork`` and ``exec`` could wait on a loader lock another thread of
    the parent held at the fork."""
    global _prctl
    if _prctl is None and sys.platform.startswith("linux"):
        try:
            _prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            _prctl = False
    return _prctl or None


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux); False
    where that cannot be asked. A parent already gone by then counts as dead: ``sig`` now."""
    prctl = _load_prctl()
    if prctl is None:
        return False
    parent = os.getppid()
    if prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), sig)
    return True


def run_child(cmd: Sequence[str], timeout: float | None = None, grace: float = 20.0,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True)``, but a child that must stop
    early (the timeout, Ctrl-C, SIGTERM to ptd) is asked with SIGTERM first, so that a
    ``ptd train`` child's elastic agent stops its own workers, and killed after ``grace``
    seconds; the child gets SIGTERM if ptd dies without a word (SIGKILL).
    ``subprocess.TimeoutExpired`` is raised after the child has ended."""
    _load_prctl()  # here, not in the forked child
    p = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, preexec_fn=lambda: die_with_parent(signal.SIGTERM))
    with terminate_on_sigterm():
        try:
            out, err = p.communicate(timeout=timeout)
        except KeyboardInterrupt:
            # Ctrl-C at a terminal reached the child too (one process group): a ptd train
            # finishes its step and saves; asked again with SIGTERM only if it does not
            _stop(p, grace, ask_after=grace)
            raise
        except BaseException:
            _stop(p, grace)
            raise
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def _stop(p: subprocess.Popen, grace: float, ask_after: float = 0.0) -> None:
    """After ``ask_after`` seconds, SIGTERM, up to ``grace`` seconds to finish, then
    SIGKILL; the pipes drained."""
    if ask_after > 0:
        try:
            p.communicate(timeout=ask_after)
            return
        except subprocess.TimeoutExpired:
            pass
    if p.poll() is None:
        p.terminate()
        try:
            p.communicate(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            p.kill()
    p.communicate()

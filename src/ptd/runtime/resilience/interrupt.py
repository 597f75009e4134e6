"""Ctrl-C (SIGINT) in a training worker: finish the step, save, stop -- all ranks at once.

The first SIGINT only sets a flag. After every step, every rank joins one all-reduce (MAX)
of that flag, so that all of them stop after the *same* step even when the signal reached
them at different moments (a rank that stopped one step earlier than its peers would leave
them waiting in a collective until the timeout). The stopping step is saved when
checkpointing is on (so ``--resume`` continues it exactly), the summary's status says
``interrupted at step N`` and ``ptd train`` exits 130.

The same Ctrl-C usually arrives twice: from the terminal (the whole foreground process
group) and again from torchrun's agent, which forwards the signal it got to its workers.
SIGINTs within :data:`SAME_PRESS_S` of the first count as that one press. A later SIGINT --
a second press -- leaves at once (``os._exit(130)``, no cleanup: what the user asked for).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

SAME_PRESS_S = 2.0
EXIT_INTERRUPTED = 130


class Interrupt:
    def __init__(self, dims: Any, checkpointer: Any = None) -> None:
        self.dims, self.checkpointer = dims, checkpointer
        self.first: float | None = None
        self._previous: Any = None

    # ------------------------------------------------------------ signal side
    def _on_sigint(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = now
            return
        if now - self.first > SAME_PRESS_S:  # a second press: stop now
            sys.stderr.write("ptd train: interrupted again; stopping at once\n")
            sys.stderr.flush()
            os._exit(EXIT_INTERRUPTED)

    @classmethod
    def install(cls, trainer: Any, dims: Any, checkpointer: Any = None) -> "Interrupt":
        """Handle SIGINT from now on (main thread only) and stop ``trainer`` on it."""
        it = cls(dims, checkpointer)
        if threading.current_thread() is threading.main_thread():
            it._previous = signal.signal(signal.SIGINT, it._on_sigint)
        trainer.after_step.append(it.after_step)
        return it

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    # ------------------------------------------------------------ trainer side
    def agreed(self) -> bool:
        """Whether any rank was interrupted (a collective over the world when > 1 rank)."""
        mine = self.first is not None
        if self.dims.world_size <= 1:
            return mine
        import torch
        import torch.distributed as dist
        # on the default group's device (NCCL takes no CPU tensor)
        flag = torch.tensor([1 if mine else 0], dtype=torch.int32, device=self.dims.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def after_step(self, trainer: Any, rec: dict[str, Any]) -> None:
        if not self.agreed():
            return
        step = trainer.step
        ck = self.checkpointer
        if ck is not None and not (ck.saved and ck.saved[-1].name.endswith(f"{step:08d}")):
            ck.save(trainer, rec)  # (unless this step's save just ran)
        trainer.status = f"interrupted at step {step}"
        trainer.stop_requested = True
        trainer.log.note(f"ptd: interrupted (Ctrl-C) at step {step}"
                         + ("; checkpoint saved" if ck is not None else "; no checkpointing"))


# ------------------------------------------------------------------ launcher side
def _descendants(root: int) -> list[int]:
    """Pids of every process below ``root`` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


class Forward:
    """In the launcher (the elastic agent runs in this process, CPU hosts): the first
    Ctrl-C is passed on to the workers (they may not have it: ``kill -INT`` reaches only
    this process) and the agent keeps watching them finish their step; a second press
    passes it on again (the workers leave at once) and stops the launcher.

    torchrun's agent would instead forward SIGINT and then wait for workers that wait for
    it (its return-value handshake) until its 30 s timeout, then SIGKILL them; so the agent
    is told not to handle SIGINT (``LaunchConfig.signals_to_handle``)."""

    SIGNALS = "SIGTERM,SIGHUP,SIGQUIT"

    def __init__(self) -> None:
        self.first: float | None = None
        self._previous: Any = None

    def _on_sigint(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        again = self.first is not None and now - self.first > SAME_PRESS_S
        if self.first is None or again:
            for pid in _descendants(os.getpid()):
                try:
                    os.kill(pid, signal.SIGINT)  # (forkserver, resource tracker ignore it)
                except OSError:
                    pass
        if self.first is None:
            self.first = now
            sys.stderr.write("ptd train: Ctrl-C: finishing the current step (again to stop "
                             "at once)\n")
            sys.stderr.flush()
        elif again:
            raise KeyboardInterrupt

    def __enter__(self) -> "Forward":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

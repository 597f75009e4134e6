"""Fault injection for tests (hidden; read from the environment by every worker).

``PTD_FAULT="ACTION:rank=R:step=S[:restart=K]"``, several separated by commas:

* ``crash``: raise ``RuntimeError("PTD_FAULT: injected crash ...")`` -- an ordinary Python
  failure, recorded by torchrun's error file;
* ``kill``: ``SIGKILL`` the worker itself (no Python cleanup, no error file) -- what a lost
  node looks like;
* ``hang``: sleep forever -- a stuck peer; the others must fail within ``timeout_s``;
* ``nan``: the model's output on that rank becomes NaN for the step's first micro-batch
  (a forward-pass blow-up: the global loss and the gradients are NaN; needs
  :meth:`FaultInjector.attach`).

It fires at the start of optimizer step ``S`` (1-based) on global rank ``R`` (``*`` means
every rank), and only in torchrun restart number ``K`` (``TORCHELASTIC_RESTART_COUNT``)
if given -- so a resumed run does not crash again at the same step.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from ...errors import PtdError

ACTIONS = ("crash", "kill", "hang", "nan")


@dataclass(frozen=True)
class Fault:
    action: str
    rank: int | None
    step: int
    restart: int | None = None

    def matches(self, rank: int, step: int, restart: int) -> bool:
        return (self.step == step and self.rank in (None, rank)
                and self.restart in (None, restart))


def parse(spec: str) -> list[Fault]:
    faults = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        action, *fields = item.split(":")
        kv = dict(f.split("=", 1) for f in fields if "=" in f)
        if action not in ACTIONS or "step" not in kv:
            raise PtdError(f"PTD_FAULT: cannot parse {item!r} (want ACTION:rank=R:step=S)")
        rank = None if kv.get("rank", "*") == "*" else int(kv["rank"])
        restart = int(kv["restart"]) if "restart" in kv else None
        faults.append(Fault(action, rank, int(kv["step"]), restart))
    return faults


class FaultInjector:
    def __init__(self, rank: int, spec: str | None = None) -> None:
        self.rank = rank
        self.faults = parse(os.environ.get("PTD_FAULT", "") if spec is None else spec)
        self.restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.model = None

    def attach(self, model) -> None:
        """The module whose output a ``nan`` fault poisons."""
        self.model = model

    def at_step(self, step: int) -> None:
        for f in self.faults:
            if f.matches(self.rank, step, self.restart):
                self._fire(f, step)

    def _fire(self, f: Fault, step: int) -> None:
        if f.action == "crash":
            raise RuntimeError(f"PTD_FAULT: injected crash on rank {self.rank} at step {step}")
        if f.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if f.action == "nan":
            if self.model is None:
                raise RuntimeError("PTD_FAULT: nan needs FaultInjector.attach(model)")
            handle = None

            def poison(module, args, output):
                handle.remove()  # one micro-batch only
                return output * float("nan")
            handle = self.model.register_forward_hook(poison)
            return
        while True:  # hang
            time.sleep(3600)

"""Memory, measured: model states counted from the real tensors, activations tracked.

**Model states** (:func:`model_state_bytes`): bytes of the tensors this rank really holds --
each parameter's local tensor (``DTensor.to_local()`` for FSDP and tensor-parallel shards),
each gradient's local tensor, and the optimizer's state tensors (under ZeRO-1/2/3 those of
this rank's shards). AdamW keeps
``exp_avg`` and ``exp_avg_sq`` per parameter **and a scalar ``step`` tensor per parameter**;
the step counters are bookkeeping, not model state (4 bytes per tensor, 0.03% of the tiny
model's states), so they are reported apart (``optimizer_step_counters``) and neither the
measured ``optimizer`` bytes nor the cost model's 8 bytes/parameter include them.

**Activations** (:class:`ActivationTracker`): a ``TorchDispatchMode`` active during one
step's forward and backward records every storage an operator creates (not views or
in-place results, which share an input's storage), with a weak
reference that notices its release; the running sum of live bytes and its peak follow.
Tensors that existed before (parameters, optimizer states, DDP's gradient buckets) are not
counted. Storages that end up as parameter gradients (``.grad``) are removed from the peak
afterwards: what is left is the peak of activations and working tensors of forward and
backward, which the cost model calls activations (plus, under FSDP, the gathered
parameters and unsharded gradients it calls buffers). On a GPU the allocator's own peak
(``torch.cuda.max_memory_allocated`` above the step's starting point) is reported beside it.
"""

from __future__ import annotations

import weakref
from typing import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_iter


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor
    return t.to_local() if isinstance(t, DTensor) else t


def _nbytes(t: torch.Tensor) -> int:
    t = _local(t)
    return t.numel() * t.element_size()


def _unique_params(modules: Iterable[torch.nn.Module]) -> list[torch.nn.Parameter]:
    seen: set[int] = set()
    out = []
    for m in modules:
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def model_state_bytes(modules: Iterable[torch.nn.Module], optimizer: torch.optim.Optimizer
                      ) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer states held by this rank (see the
    module docstring). Call it after a backward (gradients present) and after at least one
    optimizer step (states created)."""
    params = _unique_params(modules)
    out = {"params": sum(_nbytes(p) for p in params),
           "grads": sum(_nbytes(p.grad) for p in params if p.grad is not None),
           "optimizer": 0, "optimizer_step_counters": 0}
    for state in optimizer.state.values():
        for name, v in state.items():
            if not isinstance(v, torch.Tensor):
                continue
            key = "optimizer_step_counters" if name == "step" else "optimizer"
            out[key] += _nbytes(v)
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


class ActivationTracker(TorchDispatchMode):
    """Peak bytes of the storages created while active (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._uid = 0
        self._seen: dict[int, tuple[int, int, weakref.ref]] = {}  # data_ptr -> (uid, bytes, ref)
        self._events: list[tuple[int, int]] = []  # (allocation uid, +bytes / -bytes)

    def _freed(self, ptr: int, uid: int) -> None:
        entry = self._seen.get(ptr)
        if entry is not None and entry[0] == uid:
            del self._seen[ptr]
            self.live -= entry[1]
            self._events.append((uid, -entry[1]))

    def _track(self, t: torch.Tensor) -> None:
        if t.device.type == "meta":
            return
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        ptr = st.data_ptr()
        if not ptr or ptr in self._seen:
            return
        n = st.nbytes()
        self._uid += 1
        uid = self._uid
        ref = weakref.ref(st, lambda r, p=ptr, u=uid: self._freed(p, u))
        self._seen[ptr] = (uid, n, ref)
        self.live += n
        self._events.append((uid, n))
        if self.live > self.peak:
            self.peak = self.live

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        # A DTensor (tensor parallel, FSDP) has no storage of its own and the mode does not
        # see the local ops it runs: its memory is its local tensor's, counted here.
        inputs = set()
        for t in tree_iter((args, kwargs or {})):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                try:
                    inputs.add(_local(t).untyped_storage().data_ptr())
                except (RuntimeError, NotImplementedError):
                    pass
        for t in tree_iter(out):
            if isinstance(t, torch.Tensor):
                t = _local(t)
                try:
                    if t.untyped_storage().data_ptr() in inputs:
                        continue  # a view or an in-place result: no new memory
                except (RuntimeError, NotImplementedError):
                    continue
                self._track(t)
        return out

    def uids_of(self, tensors: Iterable[torch.Tensor]) -> set[int]:
        """Allocation ids of the live storages behind ``tensors``."""
        out = set()
        for t in tensors:
            entry = self._seen.get(_local(t).untyped_storage().data_ptr())
            if entry is not None:
                out.add(entry[0])
        return out

    def peak_excluding(self, uids: set[int]) -> int:
        """The peak of the live sum with the allocations ``uids`` left out (gradients)."""
        live = peak = 0
        for uid, delta in self._events:
            if uid in uids:
                continue
            live += delta
            peak = max(peak, live)
        return peak


def grads_of(modules: Iterable[torch.nn.Module]) -> list[torch.Tensor]:
    return [p.grad for p in _unique_params(modules) if p.grad is not None]

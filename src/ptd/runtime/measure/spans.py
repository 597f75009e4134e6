"""The ``ptd:*`` profiler spans the measurement reads, and what keeps them true on a GPU.

A span is a ``record_function`` range on the host. On a CPU the host does the work inside
it; on a GPU the host only issues kernels, which run later, so a host-side span of the
backward can close in microseconds while its kernels run on, and the next span to wait for
the device (the loss, the optimizer) collects their time. Measured on an H100 before this:
"backward 5.9 us, other 306 ms" for a step of 400 ms. While the probe profiles (a few steps
of a run, never the ones whose throughput is reported), :func:`span` synchronises the
device as it closes, so each span holds the time of its own kernels."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch.autograd.profiler import record_function

_sync = False


def set_device_sync(on: bool) -> None:
    """Synchronise the GPU at the end of every span (only where CUDA is present)."""
    global _sync
    _sync = bool(on) and torch.cuda.is_available()


@contextlib.contextmanager
def span(name: str) -> Iterator[None]:
    """``record_function(name)``, closed only when the device has finished the work issued
    inside it while the probe profiles on a GPU."""
    with record_function(name):
        yield
        if _sync:
            torch.cuda.synchronize()


@contextlib.contextmanager
def block_span(name: str) -> Iterator[None]:
    """:func:`span` for one block's forward: synchronised only when it runs inside the
    backward, where it is a recomputation the timeline must tell from the backward. In the
    forward the phase's own span collects the blocks' kernels; a synchronisation per block
    would drain the device's queue at every block, so each block would wait for the host to
    issue its first kernels -- on an H200, GPT-2 1.5B's profiled forward measured 103 ms
    where its kernels ran ~66 ms (docs/gpu-h100.md)."""
    with record_function(name):
        try:
            yield
        finally:  # also when the non-reentrant checkpoint stops recomputing early (it raises)
            if _sync and torch._C._current_graph_task_id() != -1:
                torch.cuda.synchronize()

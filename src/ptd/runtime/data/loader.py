"""Batches that do not depend on the layout.

The training stream is cut into non-overlapping windows of ``seq_len + 1`` tokens (inputs
and next-token targets). Windows are visited in a seeded random order, one permutation per
epoch. Sample ``g`` of the run -- a *global* counter -- is window ``perm_e[g mod n]`` of
epoch ``e = g div n``. Step ``s`` trains on samples ``[s*B, (s+1)*B)`` (``B`` the global
batch): the same sequences in the same order whatever the layout.

Data-parallel rank ``r`` of ``dp`` takes rows ``[r*B/dp, (r+1)*B/dp)`` of that global batch
(disjoint from every other replica's) and cuts them into micro-batches of ``micro_batch``
rows. Tensor-parallel peers share a dp index and so read the same rows; a pipeline takes
inputs on its first stage and targets on its last from the same batch.

The loader's state is the global sample counter (see :meth:`DataLoader.state_dict`): a run
resumed from a checkpoint continues with the next global batch even on another dp degree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...errors import PtdError
from .corpus import TokenStream


@dataclass(frozen=True)
class MicroBatch:
    """``inputs`` and ``targets``: int64 ``(rows, seq_len)``; targets are inputs shifted by one."""

    inputs: torch.Tensor
    targets: torch.Tensor

    @property
    def n_tokens(self) -> int:
        return self.targets.numel()


class WindowOrder:
    """Seeded permutation of the stream's windows, one per epoch."""

    def __init__(self, n_tokens: int, seq_len: int, seed: int) -> None:
        self.seq_len = seq_len
        self.seed = seed
        self.n_windows = (n_tokens - 1) // seq_len
        if self.n_windows < 1:
            raise PtdError(f"data: {n_tokens} tokens hold no window of seq_len+1 = {seq_len + 1}")
        self._epoch = -1
        self._perm = np.empty(0, dtype=np.int64)

    def start(self, sample: int) -> int:
        """Token offset of global sample ``sample``'s window."""
        epoch, i = divmod(sample, self.n_windows)
        if epoch != self._epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.n_windows)
            self._epoch = epoch
        return int(self._perm[i]) * self.seq_len


def _micro_batches(stream: TokenStream, starts: list[int], seq_len: int, micro_batch: int,
                   device: torch.device | str) -> list[MicroBatch]:
    rows = np.stack([stream.read(s, seq_len + 1) for s in starts])
    tokens = torch.from_numpy(rows)
    out = []
    for i in range(0, len(starts), micro_batch):
        chunk = tokens[i:i + micro_batch]
        out.append(MicroBatch(chunk[:, :-1].to(device), chunk[:, 1:].to(device)))
    return out


class DataLoader:
    """This data-parallel rank's micro-batches, step after step."""

    def __init__(self, stream: TokenStream, *, seq_len: int, global_batch: int, micro_batch: int,
                 dp_rank: int, dp_size: int, seed: int, device: torch.device | str = "cpu") -> None:
        if global_batch % (micro_batch * dp_size):
            raise PtdError(f"global batch {global_batch} is not divisible by micro-batch*dp")
        self.stream = stream
        self.order = WindowOrder(len(stream), seq_len, seed)
        self.seq_len = seq_len
        self.global_batch = global_batch
        self.micro_batch = micro_batch
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.device = device
        self.samples = 0
        """Global samples consumed so far by all replicas together."""

    def rows(self) -> range:
        """Global sample ids of this rank's share of the next step."""
        per = self.global_batch // self.dp_size
        first = self.samples + self.dp_rank * per
        return range(first, first + per)

    def next(self) -> list[MicroBatch]:
        starts = [self.order.start(g) for g in self.rows()]
        self.samples += self.global_batch
        return _micro_batches(self.stream, starts, self.seq_len, self.micro_batch, self.device)

    @property
    def epoch(self) -> int:
        return self.samples // self.order.n_windows

    def state_dict(self) -> dict[str, Any]:
        """``samples`` is the whole position; the rest is there to detect a mismatch."""
        return {"samples": self.samples, "epoch": self.epoch, "seed": self.order.seed,
                "seq_len": self.seq_len, "n_windows": self.order.n_windows}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, mine in (("seed", self.order.seed), ("seq_len", self.seq_len),
                          ("n_windows", self.order.n_windows)):
            if key in state and state[key] != mine:
                raise PtdError(f"data state: {key} {state[key]} does not match this run's {mine}")
        self.samples = int(state["samples"])


def eval_batches(stream: TokenStream, *, seq_len: int, global_batch: int, micro_batch: int,
                 dp_rank: int, dp_size: int, device: torch.device | str = "cpu",
                 max_steps: int = 4) -> list[list[MicroBatch]]:
    """Fixed validation batches: the first windows of the held-out stream, in order, at
    most ``max_steps`` global batches, split over replicas like training batches."""
    n_windows = (len(stream) - 1) // seq_len
    steps = min(max_steps, n_windows // global_batch)
    if steps < 1:
        raise PtdError(f"data: the validation split holds {n_windows} windows, fewer than one "
                       f"global batch ({global_batch}); raise val_fraction")
    per = global_batch // dp_size
    out = []
    for s in range(steps):
        first = s * global_batch + dp_rank * per
        starts = [w * seq_len for w in range(first, first + per)]
        out.append(_micro_batches(stream, starts, seq_len, micro_batch, device))
    return out

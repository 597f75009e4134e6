"""ZeRO-2 the way DeepSpeed's stage 2 does it: parameters whole, gradients and AdamW states
partitioned over the data-parallel group.

Each rank owns whole parameters: ``ZeroRedundancyOptimizer``'s partition (the same one
ZeRO-1 uses; greedy by size, so a share is only about 1/dp, and the rank that gets the
embedding holds more). :class:`ReduceToOwner` packs the gradients, bucket by bucket (25 MiB,
in backward order), into flat buffers laid out rank-major (the parameters owned by rank 0,
then rank 1's, ...; each segment padded to the largest) and reduce-scatters each: a rank
gets the averaged gradients of the parameters it owns and drops the others (``.grad =
None``) as soon as they are packed. The optimizer steps the owned parameters and broadcasts
them (ZeRO-1's step). Between steps a rank holds all parameters and the gradients and AdamW
states of its own: the ZeRO paper's ``P_os+g``.

Why not FSDP2 without resharding after forward (what ptd did before): that shards the
parameters as well and runs an all-gather and a reduce-scatter per block, whose gloo threads
compete with the compute on a CPU; this is what DeepSpeed's stage 2 does, and it measured
faster on 4 workers of a 2-core box (docs/benchmarks.md, "Against other frameworks").

Gradient accumulation: micro-steps before the last accumulate locally
(:func:`~ptd.runtime.parallel.gradient_sync` switches the hooks off). On gloo the
reduce-scatter is an all-reduce of the bucket and this rank's chunk of it (gloo's
``reduce_scatter_tensor`` is ~2x slower than its ``all_reduce``, see :mod:`.fsdp`); NCCL
runs ``reduce_scatter_tensor`` with ``AVG``. Checkpoints are ZeRO-1's (the same optimizer),
so they reshard to and from any layout.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


BUCKET_BYTES = 25 * 1024 * 1024  # DDP's default bucket size


class _Bucket:
    """Parameters reduced together: per owning rank a list, each rank's segment padded to
    the largest so that the flat buffer splits into equal chunks."""

    def __init__(self, params: list[torch.Tensor], owner: dict[int, int], size: int) -> None:
        self.by_rank: list[list[torch.Tensor]] = [[] for _ in range(size)]
        for p in params:
            self.by_rank[owner[id(p)]].append(p)
        self.segment = max(sum(_local(p).numel() for p in ps) for ps in self.by_rank)
        self.n = len(params)
        self.ready = 0
        self.pending: tuple | None = None  # (work, flat, this rank's chunk) once launched


class ReduceToOwner:
    """The ZeRO-2 gradient reduction (see the module docstring). The runner calls it once per
    optimizer step, after the last backward; with ``overlap`` the buckets are already being
    reduced by then: each is launched (asynchronously, in a fixed order) from the gradient
    hooks as soon as all its parameters have their gradient, and its gradients of other
    ranks' parameters are freed at once, as DDP overlaps its all-reduce and DeepSpeed its
    stage-2 reduction. ``overlap`` needs every gradient final when its hook fires: not so
    under tensor parallelism (:class:`~.tp.AlignTPGrads` reshapes some gradients after the
    backward) or a pipeline schedule (its micro-batches accumulate inside one call), where
    everything is reduced after the backward, bucket by bucket.

    ``enabled`` is switched off by :func:`ptd.runtime.parallel.gradient_sync` for the
    micro-steps before the last (gradients accumulate locally)."""

    def __init__(self, optimizer: torch.optim.Optimizer, group: dist.ProcessGroup,
                 model: torch.nn.Module, overlap: bool, bucket_bytes: int = BUCKET_BYTES) -> None:
        parts = optimizer._partition_parameters()  # type: ignore[attr-defined]
        owner = {id(p): r for r, part in enumerate(parts) for g in part for p in g["params"]}
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.gloo = dist.get_backend(group) == "gloo"
        self.enabled = True
        # reverse registration order: roughly the order the backward produces gradients
        order = [p for p in reversed(list(model.parameters())) if id(p) in owner]
        self.buckets: list[_Bucket] = []
        self.bucket_of: dict[int, _Bucket] = {}
        current: list[torch.Tensor] = []
        nbytes = 0
        for p in order + [None]:  # type: ignore[list-item]
            if current and (p is None or nbytes + 4 * _local(p).numel() > bucket_bytes):
                b = _Bucket(current, owner, self.size)
                self.buckets.append(b)
                self.bucket_of.update({id(q): b for q in current})
                current, nbytes = [], 0
            if p is not None:
                current.append(p)
                nbytes += 4 * _local(p).numel()
        self.next = 0  # the first bucket not launched yet
        self.done = 0  # the first bucket not finished yet
        if overlap:
            for p in order:
                p.register_post_accumulate_grad_hook(self._on_grad)
        model.ptd_grad_reducer = self  # found by gradient_sync (accumulation micro-steps)

    def _on_grad(self, p: torch.Tensor) -> None:
        if not self.enabled:
            return
        b = self.bucket_of[id(p)]
        b.ready += 1
        while self.next < len(self.buckets) and self.buckets[self.next].ready == self.buckets[self.next].n:
            self._launch(self.buckets[self.next])

    @torch.no_grad()
    def _launch(self, b: _Bucket) -> None:
        """Pack the bucket rank-major (freeing other ranks' gradients) and start reducing it.
        At most two buckets are in flight: a flat buffer is as big as the gradients it
        replaces, so holding them all would save nothing until the end."""
        self.next += 1
        in_flight = self.buckets[self.done:self.next - 1]
        for older in in_flight[:-1]:
            self._finish(older)
        first = next(p for ps in b.by_rank for p in ps)
        flat = torch.empty(self.size * b.segment, dtype=torch.float32, device=_local(first).device)
        for r, params in enumerate(b.by_rank):
            off = r * b.segment
            for p in params:
                n = _local(p).numel()
                if p.grad is None:  # unused here (an expert no token chose): adds nothing
                    flat[off:off + n].zero_()
                else:
                    flat[off:off + n].copy_(_local(p.grad).reshape(-1))
                    if r != self.rank:
                        p.grad = None  # freed as soon as it is packed
                off += n
            flat[off:(r + 1) * b.segment].zero_()
        if self.gloo:  # all-reduce + own chunk: faster than gloo's reduce_scatter_tensor
            work = dist.all_reduce(flat, group=self.group, async_op=True)
            mine = flat.view(self.size, b.segment)[self.rank]
        else:
            mine = torch.empty(b.segment, dtype=flat.dtype, device=flat.device)
            work = dist.reduce_scatter_tensor(mine, flat, op=dist.ReduceOp.AVG, group=self.group,
                                              async_op=True)
        b.pending = (work, flat, mine)

    @torch.no_grad()
    def _finish(self, b: _Bucket) -> None:
        """Wait for a bucket and keep this rank's averaged gradients (in order)."""
        work, _, mine = b.pending  # type: ignore[misc]
        work.wait()
        if self.gloo:
            mine.div_(self.size)
        off = 0
        for p in b.by_rank[self.rank]:
            n = _local(p).numel()
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            _local(p.grad).view(-1).copy_(mine[off:off + n])
            off += n
        b.pending, b.ready = None, 0
        self.done += 1

    @torch.no_grad()
    def __call__(self) -> None:
        while self.next < len(self.buckets):  # not launched by hooks (or no overlap)
            self._launch(self.buckets[self.next])
        while self.done < len(self.buckets):
            self._finish(self.buckets[self.done])
        self.next = self.done = 0

"""ZeRO-2's gradient reduction (:class:`ReduceToOwner`) on 3 ranks, after the backward and
overlapped with it (from the gradient hooks), in several buckets: each rank ends with the
average over ranks of the gradients of exactly the parameters it owns (ZeroRedundancyOptimizer's
partition) and no other gradient -- including a parameter one rank did not use (no gradient
there). The loss-parity tests check ZeRO-2 training end to end."""

import pytest
import torch
import torch.distributed as dist

from helpers import spawn_world

pytestmark = pytest.mark.dist


CASES = [(False, False), (True, False), (False, True), (True, True)]  # (overlap, NCCL branch)


class _Done:
    def wait(self) -> bool:
        return True


def _reference_reduce_scatter(out, inp, op=dist.ReduceOp.SUM, group=None, async_op=False):
    full = inp.clone()
    dist.all_reduce(full, group=group)
    chunk = full.view(dist.get_world_size(group), -1)[dist.get_rank(group)]
    if op == dist.ReduceOp.AVG:
        chunk = chunk / dist.get_world_size(group)
    elif op != dist.ReduceOp.SUM:
        raise NotImplementedError(op)
    out.copy_(chunk)
    return _Done()


def _worker(rank: int, world: int) -> list:
    """One rank of a gloo world (``helpers.spawn_world``); its results."""
    from ptd.runtime.parallel.ddp import zero1_optimizer
    from ptd.runtime.parallel.zero2 import ReduceToOwner
    results = []
    real_rs = dist.reduce_scatter_tensor
    for overlap, nccl_path in CASES:
        # The NCCL branch (reduce_scatter_tensor with AVG) on CPU: gloo has no AVG, so a
        # reference reduce-scatter stands in -- the sum over ranks (all_reduce), this
        # rank's rank-major chunk, divided by the group size only for AVG. A SUM in
        # the NCCL branch (the planted bug) then leaves gradients `world` times too big.
        dist.reduce_scatter_tensor = _reference_reduce_scatter if nccl_path else real_rs
        torch.manual_seed(0)  # the same parameters everywhere
        params = [torch.nn.Parameter(torch.randn(*s))
                  for s in [(7, 5), (5,), (13, 3), (2, 2), (9,)]]
        holder = torch.nn.ParameterList(params)
        opt = zero1_optimizer([{"params": params}], dist.group.WORLD, lr=0.1)
        # buckets of 40 bytes: several, each with its own rank-major layout
        reduce = ReduceToOwner(opt, dist.group.WORLD, holder, overlap=overlap, bucket_bytes=40)
        reduce.gloo = not nccl_path  # take the branch GPUs take
        g = torch.Generator().manual_seed(100 + rank)
        coefs = [torch.randn(p.shape, generator=g) for p in params]
        used = [i for i in range(len(params)) if not (i == 3 and rank == 1)]  # rank 1: not 3
        # (before the backward: with overlap, rank 1 launches the bucket that holds
        # parameter 3 only when called, so no other collective may come in between)
        want = [coefs[i].clone() if i in used else torch.zeros_like(params[i])
                for i in range(len(params))]
        for t in want:
            dist.all_reduce(t)
            t.div_(world)
        # d loss / d p = coef: the gradients are known; with overlap the buckets are
        # reduced from the hooks during this backward
        sum((params[i] * coefs[i]).sum() for i in used).backward()
        owned = {id(p) for grp in opt._partition_parameters()[rank] for p in grp["params"]}
        # with overlap, every bucket whose parameters all got a gradient here was packed
        # (and other ranks' gradients freed) during the backward: all of them on 0 and 2
        freed = all(p.grad is None for p in params if id(p) not in owned)
        reduce()
        errors, wrong_holding = [], []
        for p, w in zip(params, want):
            if id(p) in owned:
                errors.append(float((p.grad - w).abs().max()) if p.grad is not None
                              else float("inf"))
            elif p.grad is not None:
                wrong_holding.append(tuple(p.shape))
        results.append((len(owned), errors, wrong_holding, freed))
    dist.reduce_scatter_tensor = real_rs
    return results


@pytest.mark.timeout(90)
def test_reduce_to_owner_keeps_the_average_of_owned_gradients_only(tmp_path):
    out = spawn_world(_worker, 3, tmp_path / "store")
    for case, (overlap, _) in enumerate(CASES):  # after the backward or overlapped; gloo/NCCL
        assert sum(out[r][case][0] for r in out) == 5  # every parameter has exactly one owner
        for rank, results in out.items():
            n, errors, wrong, freed = results[case]
            assert freed == (overlap and rank != 1), (case, rank)
            assert n >= 1 and len(errors) == n, (case, rank, n, errors)
            assert max(errors) <= 1e-6, (case, rank, errors)
            assert wrong == [], (case, rank, wrong)


def test_cost_model_prices_the_runtime_bucket():
    from ptd.cost.memory import ZERO2_BUCKET_BYTES
    from ptd.runtime.parallel.zero2 import BUCKET_BYTES
    assert ZERO2_BUCKET_BYTES == BUCKET_BYTES

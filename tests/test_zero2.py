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


def _worker(rank: int, world: int) -> list:
    """One rank of a gloo world (``helpers.spawn_world``); its results."""
    from ptd.runtime.parallel.ddp import zero1_optimizer
    from ptd.runtime.parallel.zero2 import ReduceToOwner
    results = []
    for overlap in (False, True):
        torch.manual_seed(0)  # the same parameters everywhere
        params = [torch.nn.Parameter(torch.randn(*s))
                  for s in [(7, 5), (5,), (13, 3), (2, 2), (9,)]]
        holder = torch.nn.ParameterList(params)
        opt = zero1_optimizer([{"params": params}], dist.group.WORLD, lr=0.1)
        # buckets of 40 bytes: several, each with its own rank-major layout
        reduce = ReduceToOwner(opt, dist.group.WORLD, holder, overlap=overlap, bucket_bytes=40)
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
    return results


@pytest.mark.timeout(90)
def test_reduce_to_owner_keeps_the_average_of_owned_gradients_only(tmp_path):
    out = spawn_world(_worker, 3, tmp_path / "store")
    for case in (0, 1):  # after the backward; overlapped with it
        assert sum(out[r][case][0] for r in out) == 5  # every parameter has exactly one owner
        for rank, results in out.items():
            n, errors, wrong, freed = results[case]
            assert freed == (case == 1 and rank != 1), (case, rank)
            assert n >= 1 and len(errors) == n, (case, rank, n, errors)
            assert max(errors) <= 1e-6, (case, rank, errors)
            assert wrong == [], (case, rank, wrong)


def test_cost_model_prices_the_runtime_bucket():
    from ptd.cost.memory import ZERO2_BUCKET_BYTES
    from ptd.runtime.parallel.zero2 import BUCKET_BYTES
    assert ZERO2_BUCKET_BYTES == BUCKET_BYTES

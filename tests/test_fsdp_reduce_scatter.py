"""The all-reduce-and-slice reduce-scatter ptd installs in FSDP2 on gloo gives exactly what
gloo's own reduce-scatter gives, for the ops FSDP2 uses (SUM, AVG, and the PREMUL_SUM of a
gradient divide factor, which gloo lacks: the experts' units under ep), on 3 ranks (the loss
parity tests check ZeRO-2/3 training with it end to end)."""

import pytest
import torch
import torch.distributed as dist

from helpers import spawn_world

pytestmark = pytest.mark.dist


def _worker(rank: int, world: int) -> list:
    """One rank of a gloo world (``helpers.spawn_world``); its results."""
    from ptd.runtime.parallel.fsdp import AllReduceScatter
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(world * 1000, generator=g)
    results = []
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
        want = torch.empty(1000)
        dist.reduce_scatter_tensor(want, x.clone(), op=op)
        got = torch.empty(1000)
        AllReduceScatter()(got, x.clone(), dist.group.WORLD, op)
        results.append(float((got - want).abs().max()))
    # FSDP's op for set_gradient_divide_factor(5) (what fsdp.shard_experts sets, dp there)
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import _get_gradient_divide_factors
    premul = _get_gradient_divide_factors(dist.group.WORLD, None, torch.float32, "cpu", 5.0)[2]
    want = torch.empty(1000)
    dist.reduce_scatter_tensor(want, x.clone(), op=dist.ReduceOp.SUM)
    got = torch.empty(1000)
    AllReduceScatter(divide_by=5)(got, x.clone(), dist.group.WORLD, premul)
    results.append(float((got - want / 5).abs().max()))
    try:  # without the divisor it must not guess
        AllReduceScatter()(got, x.clone(), dist.group.WORLD, premul)
        results.append("no error")
    except ValueError as e:
        results.append(str(e))
    return results


@pytest.mark.timeout(90)
def test_all_reduce_scatter_equals_reduce_scatter(tmp_path):
    out = spawn_world(_worker, 3, tmp_path / "store")
    for rank, (err_sum, err_avg, err_premul, refused) in out.items():
        assert err_sum <= 1e-6 and err_avg <= 1e-6 and err_premul <= 1e-6, (rank, err_sum, err_avg,
                                                                            err_premul)
        assert "needs divide_by" in refused, refused

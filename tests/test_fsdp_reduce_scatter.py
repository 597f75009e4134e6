"""The all-reduce-and-slice reduce-scatter ptd installs in FSDP2 on gloo gives exactly what
gloo's own reduce-scatter gives, for the ops FSDP2 uses (SUM, AVG), on 3 ranks (the loss
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
    return results


@pytest.mark.timeout(90)
def test_all_reduce_scatter_equals_reduce_scatter(tmp_path):
    out = spawn_world(_worker, 3, tmp_path / "store")
    for rank, (err_sum, err_avg) in out.items():
        assert err_sum <= 1e-6 and err_avg <= 1e-6, (rank, err_sum, err_avg)

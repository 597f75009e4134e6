"""fp16 loss scaling agrees on overflows over the whole world.

Ranks hold different gradients (pipeline stages, tensor-parallel shards, FSDP shards): an
overflow on one must skip the optimizer step on all, and every rank must lower its scale
alike, or the stages' and replicas' parameters drift apart. Two gloo ranks, one with an
infinite gradient: both skip and both halve the scale (GradScaler's backoff 0.5); then a
finite step on both updates both. A per-rank scaler (the plain ``GradScaler``) would step
rank 1 at the first step.
"""

import pytest
import torch

from helpers import spawn_world

pytestmark = pytest.mark.dist


def _worker(rank: int, world: int) -> list:
    from ptd.runtime.precision import Precision
    prec = Precision("fp16", torch.device("cpu"), fsdp=False, distributed=True)
    w = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([w], lr=0.1)
    scale0 = float(prec.scaler.get_scale())
    out = []
    for bad in (True, False):
        loss = (w * 2.0).sum()
        prec.backward(loss)  # gradient 2 * scale on every element
        if bad and rank == 0:
            w.grad[0] = float("inf")
        prec.unscale_(opt)
        prec.step(opt)
        opt.zero_grad(set_to_none=True)
        out.append((w.detach().clone().tolist(), float(prec.scaler.get_scale())))
    return [scale0, out]


@pytest.mark.timeout(90)
def test_an_overflow_on_one_rank_skips_the_step_on_all(tmp_path):
    out = spawn_world(_worker, 2, tmp_path / "store")
    for rank, (scale0, ((w1, s1), (w2, s2))) in out.items():
        assert scale0 == 2.0 ** 16, rank  # GradScaler's initial scale
        assert w1 == [1.0] * 4, (rank, w1)  # skipped everywhere
        assert s1 == scale0 / 2, (rank, s1)  # backoff on every rank
        # the next, finite step is taken: w - lr * grad = 1 - 0.1 * 2
        assert w2 == pytest.approx([0.8] * 4), (rank, w2)
        assert s2 == s1, (rank, s2)  # growth only after 2000 good steps

"""Single-process tests for two survivors of the sampled mutation run of runtime/parallel
(docs/testing.md, "runtime/parallel and runtime/checkpoint, sampled"): the 2-D
tensor-parallel LayerNorm's mean (``tp2d.py:209``, ``/ h`` as ``% h``) and the pipeline's
evaluation forward (``pp.py:242,248``: receiving from stage ``s - 1`` and sending to stage
``s + 1``, mutated to ``s // 1`` and ``s * 1``), and two from a second sample (seed
20261128): the same receive test as ``s << 1`` (seen only where one rank holds two
consecutive stages: the zero-bubble V) and ``parallelize`` applying only some recompute
modes (``__init__.py:59``, ``!= "none"`` as ``<= "none"``: "selective" dropped), and
``dp_cp_group``'s check that the rank is in a group (``cp.py:161``, ``and`` as ``or``),
on a fake process group.

No multi-process run is needed: on a ``1 x 1`` grid the norms' row all-reduce is over a
one-rank gloo group (an identity), so ``LayerNorm2D``'s arithmetic is checked against values
worked by hand; ``ForwardOnly`` is run rank after rank (or on threads) in one process with
``torch.distributed``'s point-to-point calls replaced by a recorded wire, which checks every
message's source and destination."""

import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ptd.runtime.model.layers import RMSNorm
from ptd.runtime.parallel.tp2d import LayerNorm2D, RMSNorm2D
from ptd.specs import ParallelPlan


# ------------------------------------------------------------------ tp2d.py: LayerNorm2D
def _on_1x1_grid(norm, cls2d, group):
    """``norm`` swapped in place for its 2-D form (as ``apply_tp2d`` does) on a 1 x 1 grid:
    the row and column groups are the one rank (norms do not read the mesh)."""
    from ptd.runtime.parallel.tp2d import Grid
    norm.__class__ = cls2d
    norm.grid = Grid(mesh=None, q=1, r=0, c=0, row=group, col=group)
    return norm


@pytest.mark.timeout(60)
def test_layernorm_2d_on_one_rank_by_hand(one_rank_gloo):
    norm = _on_1x1_grid(nn.LayerNorm(4, eps=0.0), LayerNorm2D, one_rank_gloo)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
        norm.bias.copy_(torch.tensor([0.5, 0.0, 0.0, -1.0]))
    x = torch.tensor([[[0.0, 0.0, 4.0, 4.0],
                       [1.0, 2.0, 3.0, 6.0]]])
    # by hand, row 1: mean 8/4 = 2, centred [-2, -2, 2, 2], variance 16/4 = 4 (biased, as
    # LayerNorm), std 2 -> normalised [-1, -1, 1, 1]; times the weight, plus the bias:
    # [-1 + 0.5, -2, 3, 4 - 1] = [-0.5, -2, 3, 3].
    # Row 2: mean 12/4 = 3, centred [-2, -1, 0, 3], variance (4 + 1 + 0 + 9)/4 = 3.5 ->
    # normalised c / sqrt(3.5); times the weight, plus the bias:
    # [-2/s + 0.5, -2/s, 0, 12/s - 1], s = sqrt(3.5).
    s = 3.5 ** 0.5
    want = torch.tensor([[[-0.5, -2.0, 3.0, 3.0],
                          [-2 / s + 0.5, -2 / s, 0.0, 12 / s - 1]]])
    torch.testing.assert_close(norm(x), want)
    # (with the mean as sum % h, row 1's mean would be 8 % 4 = 0 and its output
    # [0.5, 0, 3*4/sqrt(8), 4*4/sqrt(8) - 1]: wrong in every column)


@pytest.mark.timeout(60)
def test_layernorm_2d_without_bias_keeps_the_dtype(one_rank_gloo):
    norm = _on_1x1_grid(nn.LayerNorm(2, eps=0.0, bias=False), LayerNorm2D, one_rank_gloo)
    # [1, 3]: mean 2, centred [-1, 1], variance 1 -> [-1, 1] (weight 1 as initialised); the
    # statistics in fp32, the output back in bf16 (both values exact in bf16)
    y = norm(torch.tensor([[1.0, 3.0]], dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16
    assert y.tolist() == [[-1.0, 1.0]]


@pytest.mark.timeout(60)
def test_rmsnorm_2d_on_one_rank_by_hand(one_rank_gloo):
    norm = _on_1x1_grid(RMSNorm(4, eps=0.0), RMSNorm2D, one_rank_gloo)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    x = torch.tensor([[1.0, 1.0, 1.0, 5.0]])
    # by hand: mean of squares (1 + 1 + 1 + 25)/4 = 7, rms sqrt(7); x / sqrt(7) times the
    # weight: [1, 2, 3, 20] / sqrt(7)
    r = 7 ** 0.5
    torch.testing.assert_close(norm(x), torch.tensor([[1 / r, 2 / r, 3 / r, 20 / r]]))


# ------------------------------------------------------------------ pp.py: ForwardOnly
class Wire:
    """``dist.send``/``dist.recv`` between ranks that run on threads of this process (or one
    after another: a send never blocks): each message is queued at its destination with its
    source; a receive takes the oldest message queued for the receiving rank (waiting up to
    5 s for it) and checks it came from the rank asked for."""

    def __init__(self):
        self.queues: dict[int, queue.Queue] = {}
        self.lock = threading.Lock()
        self.local = threading.local()
        self.log: list[tuple[int, int]] = []  # (source, destination) of every message

    @property
    def me(self):
        return self.local.rank

    @me.setter
    def me(self, rank):
        self.local.rank = rank

    def _queue(self, rank):
        with self.lock:
            return self.queues.setdefault(rank, queue.Queue())

    def send(self, tensor, dst):
        with self.lock:
            self.log.append((self.me, dst))
        self._queue(dst).put((self.me, tensor.clone()))

    def recv(self, tensor, src):
        assert src != self.me, f"rank {self.me} receives from itself"
        came_from, data = self._queue(self.me).get(timeout=5)
        assert came_from == src, f"rank {self.me} asked {src}, the message came from {came_from}"
        assert tensor.shape == data.shape and tensor.dtype == data.dtype, (tensor, data)
        tensor.copy_(data)
        return src

    def drained(self):
        return all(q.empty() for q in self.queues.values())


def wired(monkeypatch, first_global_rank):
    """A :class:`Wire` in place of ``dist.send``/``dist.recv``, the pp group's rank ``r``
    being global rank ``first_global_rank + r``."""
    wire = Wire()
    monkeypatch.setattr(dist, "get_global_rank", lambda group, r: first_global_rank + r)
    monkeypatch.setattr(dist, "send", wire.send)
    monkeypatch.setattr(dist, "recv", wire.recv)
    return wire


class Affine(nn.Module):
    """One pipeline stage: ``x * a + b`` (distinct per stage, so a skipped or repeated stage
    changes the result)."""

    def __init__(self, a, b):
        super().__init__()
        self.a, self.b = a, b

    def forward(self, x):
        return x * self.a + self.b


@pytest.mark.timeout(60)
def test_pipeline_evaluation_forward_passes_activations_stage_to_stage(monkeypatch):
    from ptd.runtime.parallel.pp import ForwardOnly
    # three stages on pp ranks 0, 1, 2 (1F1B: stage s on rank s); the group's global ranks
    # 10, 11, 12, so a pp rank used as a global one would show
    plan = ParallelPlan(pp=3, schedule="1f1b", micro_batch=1, global_batch=2, seq_len=2)
    wire = wired(monkeypatch, 10)
    stages = [Affine(2.0, 0.0), Affine(3.0, 1.0), Affine(4.0, 2.0)]
    inputs = [torch.tensor([[1.0, 2.0]], dtype=torch.float64),
              torch.tensor([[0.0, -1.0]], dtype=torch.float64)]
    targets = [torch.tensor([[1.0, -1.0]], dtype=torch.float64),
               torch.tensor([[2.0, 1.0]], dtype=torch.float64)]

    def loss_fn(y, t):
        return (y * t).sum()

    out = {}
    for rank in range(3):  # every rank runs the same global order; sends do not block here
        wire.me = 10 + rank
        out[rank] = ForwardOnly([stages[rank]], [rank], plan, group=None).losses(inputs, targets, loss_fn)

    # by hand: micro-batch 1, [1, 2] -> stage 0 (x*2): [2, 4] -> stage 1 (x*3+1): [7, 13]
    # -> stage 2 (x*4+2): [30, 54]; loss 30*1 + 54*(-1) = -24.
    # micro-batch 2, [0, -1] -> [0, -2] -> [1, -5] -> [6, -18]; loss 6*2 + (-18)*1 = -6.
    assert out[0] == [] and out[1] == []          # only the last stage's rank has losses
    assert [float(v) for v in out[2]] == [-24.0, -6.0]
    # each activation goes as three messages (header length, header, tensor) to the next
    # stage's global rank: 10 -> 11 for both micro-batches, then 11 -> 12
    assert wire.log == [(10, 11)] * 6 + [(11, 12)] * 6
    assert wire.drained()  # every message was received


@pytest.mark.timeout(60)
def test_pipeline_evaluation_header_carries_dtype_and_shape(monkeypatch):
    from ptd.runtime.parallel.pp import ForwardOnly
    # two stages; rank 0's output is bf16 of shape (2, 1, 3): the receiver must allocate
    # exactly that (the Wire refuses a receive buffer of another shape or dtype)
    plan = ParallelPlan(pp=2, schedule="gpipe", micro_batch=2, global_batch=2, seq_len=1)
    wire = wired(monkeypatch, 0)
    first = Affine(1.0, 0.5)
    x = torch.zeros(2, 1, 3, dtype=torch.bfloat16)
    seen = []

    def last(y):
        seen.append((y.dtype, tuple(y.shape), y.float().sum().item()))
        return y

    wire.me = 0
    assert ForwardOnly([first], [0], plan, group=None).losses([x], [None], lambda y, t: y) == []
    wire.me = 1
    [y] = ForwardOnly([last], [1], plan, group=None).losses([x], [None], lambda y, t: y.sum())
    # received: zeros * 1 + 0.5 in bf16, six of them -> sum 3.0
    assert seen == [(torch.bfloat16, (2, 1, 3), 3.0)]
    assert float(y) == 3.0
    assert wire.log == [(0, 1)] * 3


@pytest.mark.timeout(60)
def test_pipeline_evaluation_forward_on_the_zero_bubble_v(monkeypatch):
    from ptd.runtime.parallel.pp import ForwardOnly
    # zero-bubble on pp 2: four stages in a V (docs: stage s and 2p-1-s on rank s), so rank 0
    # holds stages 0 and 3, rank 1 stages 1 and 2 -- two consecutive stages on one rank,
    # whose activation must stay local (no receive from itself), and rank 0 must wait for
    # rank 1's stage 2 before its stage 3: the ranks run on two threads
    plan = ParallelPlan(pp=2, schedule="zero-bubble", micro_batch=1, global_batch=1, seq_len=2)
    wire = wired(monkeypatch, 20)
    stage = [Affine(2.0, 0.0), Affine(3.0, 1.0), Affine(1.0, -5.0), Affine(-1.0, 0.0)]
    inputs, targets = [torch.tensor([[1.0, 2.0]])], [torch.tensor([[1.0, 1.0]])]

    def run(rank, ids):
        wire.me = 20 + rank
        return ForwardOnly([stage[i] for i in ids], ids, plan, group=None).losses(
            inputs, targets, lambda y, t: (y * t).sum())

    with ThreadPoolExecutor(2) as pool:
        f0, f1 = pool.submit(run, 0, [0, 3]), pool.submit(run, 1, [1, 2])
        out0, out1 = f0.result(timeout=30), f1.result(timeout=30)
    # by hand: [1, 2] -> stage 0 (x*2): [2, 4] -> stage 1 (x*3+1): [7, 13] -> stage 2
    # (x-5): [2, 8] -> stage 3 (-x): [-2, -8]; loss -2 + -8 = -10, on rank 0 (the last stage's)
    assert [float(v) for v in out0] == [-10.0] and out1 == []
    # messages: stage 0's output 20 -> 21, stage 2's back 21 -> 20 (three each); none
    # between stages 1 and 2, which share rank 1
    assert sorted(wire.log) == [(20, 21)] * 3 + [(21, 20)] * 3
    assert wire.drained()


# ------------------------------------------------------------------ __init__.py: recompute
@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_parallelize_sets_each_blocks_recompute(one_rank_gloo, mode):
    from ptd.runtime.model.transformer import build_model
    from ptd.runtime.parallel import parallelize, unwrap
    from ptd.specs import get_preset
    spec = get_preset("tiny")
    plan = ParallelPlan(recompute=mode, micro_batch=1, global_batch=1, seq_len=8)
    # one process, no tp/pp/cp/zero: only the recompute switch and the (one-rank) DDP wrapper
    dims = SimpleNamespace(device=torch.device("cpu"), ep_mesh=None,
                           group=lambda axis: one_rank_gloo)
    model = unwrap(parallelize(build_model(spec), plan, dims, seed=0))
    # Block.recompute is the plan's mode (the Block docstring: "none", "full" whole block,
    # "selective" the attention core only -> attention.recompute_core only for "selective")
    assert [b.recompute for b in model.layers.values()] == [mode] * spec.n_layers
    assert [b.attention.recompute_core for b in model.layers.values()] == [mode == "selective"] * spec.n_layers


# ------------------------------------------------------------------ cp.py: dp_cp_group
@pytest.fixture
def fake_world():
    """A fake process group (no communication) of ``world`` ranks in which this process is
    ``rank``: group creation works, collectives are not run."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def init(rank, world):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    yield init
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.timeout(60)
def test_dp_cp_group_is_this_ranks_dp_x_cp_replicas(fake_world):
    from ptd.runtime.parallel.cp import dp_cp_group
    fake_world(5, 8)
    plan = ParallelPlan(dp=2, cp=2, tp=2, micro_batch=1, global_batch=2, seq_len=8)
    # by hand (tp fastest, then cp, dp, pp): rank 5 = tp 1, cp 0, dp 1, pp 0; the ranks that
    # share its pp 0 and tp 1 are tp 1 + 2*cp + 4*dp for cp, dp in {0, 1}: 1, 3, 5, 7
    assert dist.get_process_group_ranks(dp_cp_group(plan)) == [1, 3, 5, 7]


@pytest.mark.timeout(60)
def test_dp_cp_group_refuses_a_rank_outside_the_plan(fake_world):
    from ptd.runtime.parallel.cp import dp_cp_group
    # a world of 8 for a plan of dp 2 x cp 2 = 4 ranks: rank 5 is in none of the groups, and
    # returning no group (None) would make the gradient all-reduce run over the whole world
    fake_world(5, 8)
    with pytest.raises(AssertionError):
        dp_cp_group(ParallelPlan(dp=2, cp=2, micro_batch=1, global_batch=2, seq_len=8))

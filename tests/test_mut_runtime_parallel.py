"""``gradient_sync``'s per-stage choices under FSDP (written from the sampled mutation run of
runtime/parallel; docs/testing.md, "runtime/parallel and runtime/checkpoint, sampled").

The expected calls follow from the rule in ``gradient_sync``'s docstring, not from its
code: on a micro-step that does not sync, ZeRO-2 reduce-scatters all the same (so it never
turns gradient sync off), ZeRO-1 and ZeRO-3 defer the reduction (sync off); ZeRO-1 and
ZeRO-2 keep the gathered parameters for the next micro-step (reshard-after-backward off),
ZeRO-3 gathers again (its parameters stay sharded: reshard stays on). Afterwards both are
switched back on. A stand-in FSDPModule records the calls: no process group is needed."""

import pytest
from torch.distributed.fsdp import FSDPModule

from ptd.runtime.parallel import gradient_sync


class Recorder(FSDPModule):
    calls: list

    def set_requires_gradient_sync(self, on):
        self.calls.append(("sync", on))

    def set_reshard_after_backward(self, on):
        self.calls.append(("reshard", on))


def stand_in(zero):
    m = object.__new__(Recorder)  # FSDPModule.__new__ builds the wrapped class; not wanted here
    m.calls = []
    m.ptd_zero = zero
    return m


# (zero stage, calls on entering a micro-step without sync), worked from the rule above
@pytest.mark.parametrize("zero,inside", [
    (1, [("sync", False), ("reshard", False)]),
    (2, [("reshard", False)]),
    (3, [("sync", False)]),
])
def test_no_sync_micro_step_per_zero_stage(zero, inside):
    m = stand_in(zero)
    with gradient_sync(m, enabled=False):
        assert m.calls == inside
    assert m.calls == inside + [("sync", True), ("reshard", True)]


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_syncing_micro_step_changes_nothing(zero):
    m = stand_in(zero)
    with gradient_sync(m, enabled=True):
        pass
    assert m.calls == []


def test_tensor_parallel_peers_share_one_rng_stream():
    # tp peers are consecutive ranks: with tp 2, ranks 0,1 -> stream 0, ranks 2,3 -> stream 1;
    # with tp 1 every rank is its own stream; with tp 4, ranks 0..3 -> 0, 4..7 -> 1
    from ptd.runtime.parallel.mesh import rng_stream
    assert [rng_stream(r, 2) for r in range(4)] == [0, 0, 1, 1]
    assert [rng_stream(r, 1) for r in range(3)] == [0, 1, 2]
    assert [rng_stream(r, 4) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(type(rng_stream(r, 2)) is int for r in range(4))


@pytest.mark.timeout(60)
def test_vocab_parallel_cross_entropy_on_one_rank_is_cross_entropy(one_rank_gloo):
    # On a row of one rank the vocabulary-parallel loss is plain cross-entropy per token and
    # its logits gradient softmax - onehot: compared with torch's own F.cross_entropy.
    import torch
    import torch.nn.functional as F
    from ptd.runtime.parallel.tp2d import _VocabParallelCE
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 7, generator=g, dtype=torch.float64)
    target = torch.tensor([0, 6, 3, 3, 1])
    a = logits.clone().requires_grad_(True)
    ours = _VocabParallelCE.apply(a, target, 0, one_rank_gloo)
    b = logits.clone().requires_grad_(True)
    ref = F.cross_entropy(b, target, reduction="none")
    torch.testing.assert_close(ours, ref)
    w = torch.arange(1.0, 6.0, dtype=torch.float64)  # a different incoming gradient per token
    (ours * w).sum().backward()
    (ref * w).sum().backward()
    torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize("dp,tp,pp,zero,runner_reduces", [
    # plain DDP (dp 2, no tp/pp, zero 0): DDP's own hooks reduce, the runner must not again
    (2, 1, 1, 0, False),
    # one replica: nothing to reduce
    (1, 2, 1, 0, False),
    # FSDP (zero >= 1) reduce-scatters itself
    (2, 2, 1, 1, False),
    # dp 2 with tp or pp: no DDP wrapper, so the runner all-reduces over dp
    (2, 2, 1, 0, True),
    (2, 1, 2, 0, True),
])
def test_who_reduces_gradients_over_dp(dp, tp, pp, zero, runner_reduces):
    from torch import nn
    from ptd.runtime.parallel.ddp import dp_grad_sync
    from ptd.specs import ParallelPlan
    plan = ParallelPlan(dp=dp, tp=tp, pp=pp, zero=zero)
    got = dp_grad_sync(nn.Linear(2, 2), plan, None)
    assert (got is not None) == runner_reduces


@pytest.mark.timeout(60)
def test_one_process_without_a_launcher_makes_its_own_world(monkeypatch):
    # no RANK in the environment (not started by torchrun): a world of one, rank 0, built
    # from an in-memory store -- no MASTER_ADDR needed
    import torch.distributed as dist
    from ptd.runtime.parallel.mesh import init_distributed, shutdown
    from ptd.specs import ParallelPlan
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    try:
        dims = init_distributed(ParallelPlan(), timeout_s=30)
        assert (dims.rank, dist.get_world_size(), dims.is_main) == (0, 1, True)
    finally:
        shutdown()


# --- tp.py:50 (docs/testing.md, sampled run): the residual stream's layout between the
# parallel regions. tp.py's module docstring: under sequence parallelism it is split along the
# sequence (Shard(1)), the row-parallel outputs reduce-scattered into it; without sp it is
# replicated. parallelize_module is replaced by a recorder, so no mesh or process is needed.

@pytest.mark.parametrize("sp", [False, True])
def test_tp_residual_layout_follows_sp(monkeypatch, sp):
    from torch.distributed.tensor import Replicate, Shard
    from ptd.runtime.model.transformer import build_model
    from ptd.runtime.parallel import tp
    from ptd.specs import ParallelPlan, load_model
    plans = []
    monkeypatch.setattr(tp, "parallelize_module", lambda m, mesh, plan: plans.append(plan))
    model = build_model(load_model({"preset": "tiny"}), "meta")
    tp.apply_tp(model, None, ParallelPlan(tp=2, sp=sp, seq_len=16))
    between = Shard(1) if sp else Replicate()
    top, blocks = plans[0], [p for p in plans[1:] if isinstance(p, dict)]
    assert top["output"].input_layouts == (between,)
    assert len(blocks) == len(model.layers)
    for layer in blocks:
        assert layer["attention.wo"].output_layouts == (between,)
        assert layer["feed_forward.w2"].output_layouts == (between,)
        assert ("attention_norm" in layer) == sp

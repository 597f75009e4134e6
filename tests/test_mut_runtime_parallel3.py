"""Single-process tests for the real survivors of a fresh sample of runtime/parallel's
mutants (seed 20261201, N 25, issue 21; the method of docs/testing.md, "runtime/parallel
re-sampled"): the random stream's seed formula (``mesh.py:38``, ``* 1_000_003`` as
``** 1_000_003``); the tied-embedding group's last pipeline stage (``mesh.py:106``,
``n_stages - 1`` as ``n_stages ^ 1``: the same rank only at pp 2); DDP's
gradient-compression hook (``ddp.py:52``, ``== "fp16"`` as ``> "fp16"``: "none" and
"powersgd" sort after "fp16"); the stacked experts' FSDP shard dimension (``fsdp.py:146``,
``% edp`` as ``^ edp``); pinned memory for CPU offload on cuda only (``fsdp.py:85``,
``== "cuda"`` as ``is not "cuda"``); and the context-parallel attention's second query
chunk, global chunk ``2cp-1-rank`` (``cp.py:133``, ``2 * cp`` as ``2 ^ cp``: the same for
cp 2, the only cp the existing tests ran).

Every expected value is worked by hand in a comment, or is torch's own causal attention.
No worker process: the tied group on a fake process group (``fake_world`` of
test_mut_runtime_parallel2), DDP over a one-rank gloo group (``one_rank_gloo`` of
conftest), ``fully_shard`` and the cp ring's exchange replaced by stand-ins."""

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ptd.runtime.parallel.mesh import ParallelDims, stream_seed
from ptd.specs import ParallelPlan
from test_mut_runtime_parallel2 import fake_world  # noqa: F401  (a fixture)


# ------------------------------------------------------------------ mesh.py: stream_seed
def test_stream_seed_by_hand():
    # ((3 * 100_003 + 5) * 1_000_003 + 7): 300_009 + 5 = 300_014; 300_014 * 1_000_003 =
    # 300_014_000_000 + 900_042 = 300_014_900_042; + 7 = 300_014_900_049 (< 2**63: kept whole)
    assert stream_seed(3, 5, 7) == 300_014_900_049
    # default step 0: 300_014 * 1_000_003 = 300_014_900_042
    assert stream_seed(3, 5) == 300_014_900_042


def test_stream_seed_keeps_63_bits():
    # seed 2**62, stream 0, step 0: 2**62 * (100_003 * 1_000_003); the product of two odd
    # numbers is odd, and 2**62 * odd modulo 2**63 is 2**62 (a non-negative int64 for torch)
    assert stream_seed(2 ** 62, 0) == 2 ** 62
    # 2**63 * anything is 0 modulo 2**63
    assert stream_seed(2 ** 63, 0) == 0


# ------------------------------------------------------------------ mesh.py: tied_group
def _dims(plan, rank):
    """ParallelDims of ``rank`` with the mesh's rank grid only (tied_group reads
    ``mesh.mesh``): global ranks 0..world-1 in the mesh's row-major (pp, dp, cp, tp) order."""
    grid = torch.arange(plan.world_size).reshape(plan.pp, plan.dp, plan.cp, plan.tp)
    return ParallelDims(plan, rank, plan.world_size, rank, torch.device("cpu"),
                        SimpleNamespace(mesh=grid))  # type: ignore[arg-type]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("rank,want", [(1, [1, 7]), (6, [0, 6]), (3, None)])
def test_tied_group_pairs_first_and_last_pipeline_rank(fake_world, rank, want):  # noqa: F811
    # pp 4 x dp 2 (8 ranks; dp fastest here): pipeline rank p holds ranks 2p, 2p + 1. The
    # first stage is on pipeline rank 0 (ranks 0, 1), the last (stage 3 of 4) on rank 3
    # (ranks 6, 7): pairs [0, 6] and [1, 7]. Rank 3 (pipeline rank 1) is in neither.
    fake_world(rank, 8)
    plan = ParallelPlan(pp=4, dp=2, micro_batch=1, global_batch=8)
    g = _dims(plan, rank).tied_group()
    if want is None:
        assert g is None
    else:
        assert dist.get_process_group_ranks(g) == want


@pytest.mark.timeout(60)
def test_tied_group_with_two_chunks_per_rank(fake_world):  # noqa: F811
    # pp 3, vpp 2 (round robin): 6 stages, the last (5) on pipeline rank 5 % 3 = 2, i.e.
    # global rank 2 (dp 1): the pair is [0, 2]
    fake_world(2, 3)
    plan = ParallelPlan(pp=3, vpp=2, schedule="interleaved-1f1b", micro_batch=1, global_batch=3)
    assert plan.n_stages == 6
    assert dist.get_process_group_ranks(_dims(plan, 2).tied_group()) == [0, 2]


@pytest.mark.timeout(60)
def test_tied_group_is_none_on_the_zero_bubble_v(fake_world):  # noqa: F811
    # ZB-V on pp 2: stages 0..3 on ranks 0, 1, 1, 0 -- the last stage is on rank 0 with the
    # first, so both copies of a tied embedding are one tensor: no group
    fake_world(0, 2)
    plan = ParallelPlan(pp=2, schedule="zero-bubble", micro_batch=1, global_batch=2)
    assert plan.n_stages == 4
    assert _dims(plan, 0).tied_group() is None


# ------------------------------------------------------------------ ddp.py: compression
@pytest.mark.timeout(60)
@pytest.mark.parametrize("compression", ["none", "fp16", "powersgd"])
def test_apply_ddp_registers_the_asked_compression_hook(one_rank_gloo, compression):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

    from ptd.runtime.parallel.ddp import apply_ddp
    plan = ParallelPlan(grad_compression=compression)
    ddp = apply_ddp(nn.Linear(2, 2), one_rank_gloo, plan, torch.device("cpu"))
    hooks = ddp._comm_hooks  # (hook, state) per register_comm_hook call (torch 2.13)
    if compression == "none":
        assert hooks == []
    elif compression == "fp16":
        assert hooks == [(default_hooks.fp16_compress_hook, one_rank_gloo)]
    else:
        assert len(hooks) == 1 and hooks[0][0] is ps.powerSGD_hook
        state = hooks[0][1]
        assert isinstance(state, ps.PowerSGDState)
        assert state.matrix_approximation_rank == 1 and state.start_powerSGD_iter == 10


# ------------------------------------------------------------------ fsdp.py
@pytest.mark.parametrize("shape,ep,edp,want", [
    # (E // ep) % edp == 0: whole experts per rank -> dim 0, however dim 1 divides
    ((8, 16, 4), 1, 4, 0),  # 8 experts over edp 4: 2 each
    ((8, 6, 4), 2, 2, 0),   # 8 / ep 2 = 4 experts over edp 2: 2 each
    ((4, 8), 1, 1, 0),      # edp 1: nothing to split
    # (E // ep) % edp != 0 and dim 1 divides -> dim 1
    ((6, 4, 4), 2, 2, 1),   # 3 experts over 2 ranks; 4 rows over 2
    ((4, 16, 4), 1, 8, 1),  # the docstring's 4 experts over edp 8; 16 over 8
])
def test_expert_shard_dim_by_hand(shape, ep, edp, want):
    from ptd.runtime.parallel.fsdp import expert_shard_dim
    assert expert_shard_dim(shape, ep, edp) == want


@pytest.mark.parametrize("device,offload,pin", [
    ("cpu", True, False), ("cuda", True, True), ("cpu", False, None)])
def test_apply_fsdp_pins_offloaded_parameters_on_cuda_only(monkeypatch, device, offload, pin):
    # CPU offload keeps the parameters in host memory; pinned (page-locked) host memory is
    # for copies to a GPU, so it is asked for on cuda only. fully_shard is replaced by a
    # recorder of the policy each unit gets (a torch.device("cuda", 0) needs no GPU to exist).
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    from ptd.runtime.parallel import fsdp
    seen = []
    monkeypatch.setattr(fsdp, "fully_shard", lambda unit, **kw: seen.append(kw["offload_policy"]))
    monkeypatch.setattr(fsdp.dist, "get_backend", lambda group: "nccl")  # no gloo hook to set
    model = nn.Module()
    model.layers = nn.ModuleDict({"0": nn.Linear(2, 2), "1": nn.Linear(2, 2)})
    plan = ParallelPlan(dp=2, zero=3, offload=offload, global_batch=2)
    fsdp.apply_fsdp(model, SimpleNamespace(get_group=lambda: None), plan, torch.device(device, 0))
    assert len(seen) == 3  # one unit per block at zero 3, and the root
    for policy in seen:
        if pin is None:
            assert type(policy) is OffloadPolicy
        else:
            assert isinstance(policy, CPUOffloadPolicy) and policy.pin_memory is pin


# ------------------------------------------------------------------ cp.py: CPAttention
def _sdpa_causal(q, k, v):
    """torch's own causal attention over the whole sequence, ``(b, s, heads, d)`` layout."""
    import torch.nn.functional as F
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          is_causal=True, enable_gqa=True).transpose(1, 2)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cp", [3, 4])
def test_cp_attention_on_more_than_two_ranks_equals_sdpa(monkeypatch, cp):
    """Every cp rank's output (its zig-zag slice) equals torch's causal attention over the
    whole sequence, for cp 3 and 4 (test_cp runs cp 2 with worker processes, where chunk
    2cp-1-rank is also (2 xor (cp-1-rank)) for both ranks). Ranks run one after another; the
    ring's exchange is replaced by the message a ring delivers: at step j rank r receives
    the K/V that rank r - j started with, from rank r - 1, while sending to rank r + 1."""
    from ptd.runtime.parallel import cp as cpm
    g = torch.Generator().manual_seed(0)
    b, s, h, hkv, d = 2, 8 * cp, 4, 2, 8  # 2cp chunks of 4 tokens; 2 query heads per kv head
    q, k, v = (torch.randn(b, s, n, d, generator=g, dtype=torch.float64) for n in (h, hkv, hkv))
    want = _sdpa_causal(q, k, v)
    sl = {r: [cpm.split_sequence(t, cp, r) for t in (q, k, v)] for r in range(cp)}
    monkeypatch.setattr(dist, "get_global_rank", lambda group, i: i)
    for r in range(cp):
        step = iter(range(1, cp))

        def exchange(x, group, to, frm, r=r):
            j = next(step)
            assert (to, frm) == ((r + 1) % cp, (r - 1) % cp)
            return torch.stack(sl[(r - j) % cp][1:])
        monkeypatch.setattr(cpm, "_exchange", exchange)
        got = cpm.CPAttention(None, r, cp)(*sl[r], None)
        assert next(step, None) is None  # cp - 1 ring steps
        torch.testing.assert_close(got, cpm.split_sequence(want, cp, r), rtol=0, atol=1e-12)

"""The gradient norm's scalar all-reduces, priced in the optimizer phase.

The expected groups are what ptd's runtime ran (`runtime/optim.py global_grad_norm`,
2026-11-27: each layout below trained 2 steps with the groups it reduced over printed on
rank 0), not what `cost.step` computes: one all-reduce per mesh axis a gradient is sharded
along, gradients on equal meshes and axes summed first, then one over the pipeline stages.
Measured:

=====================================  ===============================================
layout                                 runtime's (mesh, sharded axes) keys, extra groups
=====================================  ===============================================
dp 2 (DDP)                             none
dp 2 ZeRO-1, dp 2 ZeRO-3               (dp), axes (0,)
tp 2 (with and without sp)             (tp), axes (0,)
dp 2 x tp 2 ZeRO-3                     (dp, tp) axes (0, 1); (dp) axes (0,)
dp 2 x tp 2 ZeRO-1 sp                  (dp, tp) axes (0, 1); (dp, tp) axes (0,)
tp 4 as 2 x 2 (2-D)                    (tpr, tpc) axes (0, 1); (tpr, tpc) axes (1,)
pp 2                                   none; the pp group
dp 2 x pp 2 ZeRO-2                     (dp) axes (0,); the pp group
cp 2                                   none
tiny-moe dp 2 = ep 2, dp 4 ep 2        (ep) axes (0,)
tiny-moe dp 4 ep 2 ZeRO-1 or ZeRO-3    (dp) axes (0,); (edp, ep) axes (0, 1)
tiny-moe dp 2 x tp 2, ep 2             (tp) axes (0,); (ep) axes (0,)
tiny-moe dp 2 x pp 2, ep 2             (ep) axes (0,); the pp group
dp 2 x tp 2 x pp 2 ZeRO-1 sp           (dp, tp) axes (0, 1); (dp, tp) axes (0,); pp
=====================================  ===============================================

(Before the runtime keyed its sums by the mesh's value, dp 2 x tp 2 under ZeRO-3 ran 13
all-reduces: FSDP hands out equal meshes as distinct objects.)
"""

import pytest

import ptd.cost.step as S
from ptd.specs import ClusterSpec, ParallelPlan, get_hardware_preset, get_preset

TINY, MOE = get_preset("tiny"), get_preset("tiny-moe")


def _cluster(n, per_node=8):
    return ClusterSpec(get_hardware_preset("h100-sxm"), n, devices_per_node=per_node)


def _groups(model, n, **kw):
    kw.setdefault("micro_batch", 1)
    dp = kw.get("dp", 1)
    kw.setdefault("global_batch", dp * kw["micro_batch"] * max(1, kw.get("pp", 1)))
    return S.grad_norm_groups(model, ParallelPlan(seq_len=64, **kw), _cluster(n))


# (size, nodes, members per node) of each all-reduce; all inside one node of 8 here
G2, G4 = (2, 1, 2), (4, 1, 4)


@pytest.mark.parametrize("model, n, kw, expected", [
    (TINY, 2, dict(dp=2), []),
    (TINY, 2, dict(dp=2, zero=1), [G2]),
    (TINY, 2, dict(dp=2, zero=3), [G2]),
    (TINY, 2, dict(tp=2), [G2]),
    (TINY, 2, dict(tp=2, sp=True), [G2]),
    # (dp, tp) axes (0, 1): over dp, then tp; the norms' (dp) axes (0,): over dp
    (TINY, 4, dict(dp=2, tp=2, zero=3), [G2, G2, G2]),
    (TINY, 4, dict(dp=2, tp=2, zero=1, sp=True), [G2, G2, G2]),
    # 2 x 2: matrices along rows and columns, the norms' weights along the columns
    (TINY, 4, dict(tp=4, tp_mode="2d", micro_batch=2), [G2, G2, G2]),
    (TINY, 2, dict(pp=2, micro_batch=1), [G2]),
    (TINY, 4, dict(dp=2, pp=2, zero=2), [G2, G2]),
    (TINY, 2, dict(cp=2), []),
    (MOE, 2, dict(dp=2, ep=2), [G2]),
    (MOE, 4, dict(dp=4, ep=2), [G2]),
    # dense shards over dp 4; experts over (edp 2, ep 2)
    (MOE, 4, dict(dp=4, ep=2, zero=1), [G4, G2, G2]),
    (MOE, 4, dict(dp=4, ep=2, zero=3), [G4, G2, G2]),
    (MOE, 4, dict(dp=2, tp=2, ep=2), [G2, G2]),
    (MOE, 4, dict(dp=2, pp=2, ep=2), [G2, G2]),
    (TINY, 8, dict(dp=2, tp=2, pp=2, zero=1, sp=True), [G2, G2, G2, G2]),
])
def test_groups_are_the_runtimes(model, n, kw, expected):
    assert _groups(model, n, **kw) == expected


def test_groups_across_nodes():
    # dp 16 on two nodes of 8: the shards' all-reduce spans both nodes, 8 ranks on each
    assert _groups(TINY, 16, dp=16, zero=1) == [(16, 2, 8)]
    # ep 2 out of dp 16 (ep groups are consecutive data-parallel ranks): inside a node;
    # the experts' edp 8 group takes every second rank: 4 on each of the two nodes
    assert _groups(MOE, 16, dp=16, ep=2, zero=3) == [(16, 2, 8), (2, 1, 2), (8, 2, 4)]


def test_comm_is_each_groups_latency(monkeypatch):
    calls = []

    def coll(kind, nbytes, n, hw, nodes=1, per_node=None):
        calls.append((kind, nbytes, n, nodes, per_node))
        return 0.001 * n  # a stand-in: 1 ms per member
    monkeypatch.setattr(S, "_coll", coll)
    plan = ParallelPlan(dp=4, ep=2, zero=3, micro_batch=1, global_batch=4, seq_len=64)
    # dp 4 (4 ms), ep 2 (2 ms), edp 2 (2 ms): one fp32 scalar each
    assert S.grad_norm_comm(MOE, plan, _cluster(4)) == pytest.approx(0.008)
    assert calls == [("all_reduce", 4, 4, 1, 4), ("all_reduce", 4, 2, 1, 2),
                     ("all_reduce", 4, 2, 1, 2)]


def test_real_latency_is_small_on_a_gpu_node():
    # one 4-byte all-reduce on 8 H100s of a node costs its latency, tens of microseconds:
    # the whole term stays far below a millisecond on the presets
    plan = ParallelPlan(dp=2, tp=4, zero=3, micro_batch=1, global_batch=2, seq_len=64)
    t = S.grad_norm_comm(TINY, plan, _cluster(8))
    assert 0 < t < 1e-3


def test_runtime_reduces_equal_meshes_once(one_rank_gloo, monkeypatch):
    """The runtime side of the count: gradients on two equal meshes made apart (as FSDP and
    tensor parallelism hand them out) are summed first and reduced once per sharded axis;
    a different set of axes is a group of its own; plain gradients need none."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from ptd.runtime import optim
    a = DeviceMesh("cpu", [[0]], mesh_dim_names=("dp", "tp"))
    b = DeviceMesh("cpu", [[0]], mesh_dim_names=("dp", "tp"))
    assert a is not b and a == b

    def param(mesh, placements, value):
        p = torch.nn.Parameter(distribute_tensor(torch.zeros(2), mesh, placements))
        p.grad = distribute_tensor(torch.full((2,), value), mesh, placements)
        return p
    ps = [param(a, [Shard(0), Shard(0)], 1.0), param(b, [Shard(0), Shard(0)], 2.0),
          param(b, [Shard(0), Replicate()], 3.0)]
    plain = torch.nn.Parameter(torch.zeros(2))
    plain.grad = torch.full((2,), 4.0)
    calls = []
    real = dist.all_reduce

    def counting(t, *args, **kw):
        calls.append(kw.get("group"))
        return real(t, *args, **kw)
    monkeypatch.setattr(optim.dist, "all_reduce", counting)
    norm = optim.global_grad_norm([*ps, plain], torch.device("cpu"))
    # (dp, tp) axes (0, 1): one over dp, one over tp; (dp, tp) axes (0,): one over dp
    assert len(calls) == 3
    # 2 x (1 + 4 + 9 + 16) = 60
    assert norm.item() == pytest.approx(60 ** 0.5)

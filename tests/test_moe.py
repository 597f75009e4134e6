"""The mixture-of-experts layer (single process): routing, grouped experts, auxiliary
losses, capacity, shared experts, checked against a per-token reference written from the
papers' formulas (not from the layer's sort/gather code); and the ep plan checks."""

import math

import pytest
import torch
import torch.nn.functional as F

from ptd.errors import PtdError
from ptd.runtime.model.init import materialize
from ptd.runtime.model.transformer import build_model
from ptd.runtime.model.moe import MoE, grouped_mm, step_metrics
from ptd.specs import ParallelPlan, get_preset

SPEC = get_preset("tiny-moe")


def _layer(seed=0, **changes):
    spec = SPEC.replace(**changes)
    torch.manual_seed(seed)
    m = MoE(spec)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.3)
    return m


def _expert(m, e, x):
    w = m.experts
    return (F.silu(x @ w.w1[e]) * (x @ w.w3[e])) @ w.w2[e]


def _reference(m, x, capacity=None):
    """Token by token, Mixtral eq. 1-2: softmax over the top-k logits, weighted sum of the
    chosen experts; with ``capacity``, GShard's rule: an expert takes assignments in token
    order (then slot order) until full. Returns (output, dropped count, aux, z)."""
    logits = x @ m.router.weight.T
    T, E = logits.shape
    out, used, dropped = [], [0] * E, 0
    for t in range(T):
        top = sorted(range(E), key=lambda e: -float(logits[t, e].detach()))[:m.top_k]
        w = torch.softmax(torch.stack([logits[t, e] for e in top]), 0)
        acc = torch.zeros_like(x[t])
        for j, e in enumerate(top):
            if capacity is not None and used[e] >= capacity:
                dropped += 1
                continue
            used[e] += 1
            acc = acc + w[j] * _expert(m, e, x[t])
        out.append(acc)
    # Switch eq. 4-6 with top-k assignments: f_e = share of the T*k assignments
    chosen = logits.topk(m.top_k, -1).indices
    f = torch.tensor([float((chosen == e).sum()) / (T * m.top_k) for e in range(E)])
    P = torch.softmax(logits, -1).mean(0)
    aux = E * (f * P).sum()
    z = (torch.logsumexp(logits, -1) ** 2).mean()  # ST-MoE eq. 5
    return torch.stack(out), dropped, aux, z


def _assert_equals_reference(y, m, x):
    """``y = m(x)`` against :func:`_reference`, output and every gradient: fp32, summed in
    another order, so within 1e-5 of each one's scale."""
    ref, dropped, _, _ = _reference(m, x)
    assert dropped == 0
    scale = float(ref.detach().abs().max())
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5 * scale)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, [x, *m.parameters()], g)
    want = torch.autograd.grad(ref, [x, *m.parameters()], g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max()))


def test_forward_and_gradients_equal_the_per_token_reference():
    m = _layer(aux_loss_coef=0.0, z_loss_coef=0.0)
    x = torch.randn(40, SPEC.hidden, requires_grad=True)
    _assert_equals_reference(m(x[None])[0], m, x)


def test_the_layer_compiles_in_fp32_and_equals_the_reference():
    """``ptd train --compile`` on a MoE model: Dynamo traces the layer with fake tensors, and
    torch 2.13's rule for ``_grouped_mm`` takes bf16 only ("Expected inputs of BF16 type"
    on fp32, which failed every fp32 MoE run with --compile); fp32 runs the loop there.
    ``aot_eager`` traces as inductor does, without compiling kernels."""
    torch._dynamo.reset()
    m = _layer(aux_loss_coef=0.0, z_loss_coef=0.0)
    x = torch.randn(40, SPEC.hidden, requires_grad=True)
    _assert_equals_reference(torch.compile(m, backend="aot_eager")(x[None])[0], m, x)
    torch._dynamo.reset()


def test_aux_and_z_losses_values_and_their_gradient():
    m = _layer(aux_loss_coef=0.3, z_loss_coef=0.05)
    T = 24
    m.aux_scale = 1.0 / 96  # as if this rank's replica saw 96 tokens in the step
    x = torch.randn(T, SPEC.hidden)
    y = m(x[None])[0]
    ref, _, aux, z = _reference(m, x)
    assert m.stats.calls == 1
    assert float(m.stats.aux) == pytest.approx(float(aux), rel=1e-5)
    assert float(m.stats.z) == pytest.approx(float(z), rel=1e-5)
    assert float(aux) > 1.0  # not balanced at random init: the loss has something to push
    # the injected gradient equals that of loss + coef * aux * T / replica_tokens
    g = torch.randn_like(y)
    (got,) = torch.autograd.grad(y, [m.router.weight], g)
    extra = (0.3 * aux + 0.05 * z) * T / 96
    (want,) = torch.autograd.grad((ref * g).sum() + extra, [m.router.weight])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))
    # no auxiliary gradient in eval mode, and no statistics
    m.eval()
    m.stats = None
    m(x[None])
    assert m.stats is None


def test_capacity_drops_in_token_order_and_counts():
    m = _layer(capacity_factor=0.5, aux_loss_coef=0.0, z_loss_coef=0.0)
    T = 32
    x = torch.randn(T, SPEC.hidden)
    y = m(x[None])[0]
    cap = math.ceil(0.5 * T * 2 / 8)  # GShard: ceil(c * T * k / E) = 4
    ref, dropped, _, _ = _reference(m, x, capacity=cap)
    assert dropped > 0
    assert int(m.stats.dropped) == dropped
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5 * float(ref.abs().max()))


def test_shared_experts_add_a_dense_mlp():
    m = _layer(n_shared_experts=1, aux_loss_coef=0.0, z_loss_coef=0.0)
    assert sum(p.numel() for p in m.parameters()) == SPEC.replace(n_shared_experts=1).param_counts()["mlp"]
    x = torch.randn(16, SPEC.hidden)
    routed, _, _, _ = _reference(m, x)
    s = m.shared[0]
    shared = s.w2(F.silu(s.w1(x)) * s.w3(x))
    want = routed + shared
    torch.testing.assert_close(m(x[None])[0], want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))


def test_grouped_mm_equals_a_loop_including_empty_groups():
    x = torch.randn(30, 8, requires_grad=True)
    w = torch.randn(4, 8, 12, requires_grad=True)
    counts = torch.tensor([7, 0, 20, 3])
    want = torch.cat([x[:7] @ w[0], x[7:27] @ w[2], x[27:] @ w[3]])
    got = grouped_mm(x, w, counts)
    torch.testing.assert_close(got, want)
    got.sum().backward()  # an expanded gradient: the kernel's backward needs it contiguous
    assert w.grad[1].abs().max() == 0 and w.grad[0].abs().max() > 0
    torch.testing.assert_close(grouped_mm(x.double(), w.double(), counts), want.double(),  # loop path
                               rtol=1e-5, atol=1e-5)
    empty = grouped_mm(x[:0], w, torch.zeros(4, dtype=torch.long))  # an ep rank sent no rows
    assert empty.shape == (0, 12)
    empty.sum().backward()
    torch.testing.assert_close(grouped_mm(x[:, :5], w[:, :5, :5], counts), torch.cat(  # 20-byte rows: loop
        [x[:7, :5] @ w[0, :5, :5], x[7:27, :5] @ w[2, :5, :5], x[27:, :5] @ w[3, :5, :5]]))


def test_step_metrics_single_process():
    # a one-rank group of its own, destroyed after: later tests create theirs
    import torch.distributed as dist
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        _check_step_metrics()
    finally:
        if created:
            dist.destroy_process_group()


def _check_step_metrics():
    model = materialize(build_model(SPEC), "cpu", 0)
    x = torch.randint(0, 256, (2, 16))
    model(x).sum().backward()
    rec = step_metrics(model, SPEC.n_layers, torch.device("cpu"))
    counts = rec["moe_tokens_per_expert"]
    assert sum(counts) == 2 * 16 * SPEC.top_k * SPEC.n_layers
    per_layer_mean = 2 * 16 * SPEC.top_k / SPEC.n_experts
    assert rec["moe_imbalance"] >= max(counts) / SPEC.n_layers / per_layer_mean  # worst layer >= average
    assert rec["moe_dropped"] == 0 and rec["moe_aux_loss"] >= 1.0 - 1e-6
    assert step_metrics(model, SPEC.n_layers, torch.device("cpu"))["moe_tokens_per_expert"] == [0] * 8  # reset


@pytest.mark.parametrize("plan,model,match", [
    (dict(dp=4, ep=3), "tiny-moe", "ep 3 does not divide dp 4"),
    (dict(dp=6, ep=3, global_batch=12), "tiny-moe", "8 experts are not divisible by ep 3"),
    (dict(dp=2, ep=2), "tiny", "needs a mixture-of-experts model"),
])
def test_ep_plan_checks(plan, model, match):
    with pytest.raises(PtdError, match=match):
        ParallelPlan(**plan).validate(get_preset(model))


@pytest.mark.parametrize("flags,match", [
    (["--nproc", "4", "--ep", "3"], "ep 3 does not divide dp 4"),
    (["--nproc", "2", "--ep", "2", "--model", "tiny"], "needs a mixture-of-experts model"),
    (["--nproc", "2", "--capacity-factor", "0"], "capacity-factor"),
    (["--nproc", "2", "--capacity-factor", "-1"], "capacity-factor"),
])
def test_bad_moe_input_is_one_line_exit_2(ptd_cli, no_workers, tmp_path, flags, match):
    argv = ["train", "--model", "tiny-moe", "--out", str(tmp_path / "o"), *flags]
    if argv.count("--model") == 2:
        argv[1:3] = []
    rc, out, err = ptd_cli(*argv)
    assert rc == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and match in lines[0] and lines[0].startswith("ptd") and "error:" in lines[0], err


def test_routing_summary_line_and_report_table():
    from ptd.summary.routing import routing_line, routing_summary, routing_table_html
    recs = [{"step": 1, "moe_tokens_per_expert": [6, 2], "moe_imbalance": 1.5, "moe_dropped": 2,
             "moe_dropped_frac": 0.25, "moe_aux_loss": 1.2, "moe_z_loss": 3.0},
            {"step": 2, "moe_tokens_per_expert": [4, 4], "moe_imbalance": 1.0, "moe_dropped": 0,
             "moe_dropped_frac": 0.0, "moe_aux_loss": 1.1, "moe_z_loss": 2.0}]
    m = routing_summary(recs)
    assert m["tokens_per_expert"] == [10, 6] and m["dropped"] == 2 and m["dropped_frac"] == 2 / 16
    assert m["imbalance_mean"] == 1.25 and m["imbalance_max"] == 1.5
    assert (m["aux_loss_first"], m["aux_loss_last"], m["z_loss_last"]) == (1.2, 1.1, 2.0)
    assert "1.25 mean, 1.50 worst" in routing_line(m) and "(12.50%)" in routing_line(m)
    assert routing_table_html(recs).count("<tr>") == 3
    assert routing_summary([{"step": 1}]) is None and routing_table_html([{"step": 1}]) == ""


# ------------------------------------------------------------------ cost model and planner
def test_expert_params_per_rank_under_ep_by_hand():
    from ptd.cost.memory import model_state_bytes
    from ptd.cost.params import local_numel
    m = get_preset("mixtral-8x7b")
    one_expert = 3 * 4096 * 14336  # SwiGLU w1, w3, w2 of Mixtral 8x7B
    dense = local_numel(m, ParallelPlan(dp=8, global_batch=8), 0)
    assert dense == m.param_count()
    for ep in (2, 8):
        held = local_numel(m, ParallelPlan(dp=8, ep=ep, global_batch=8), 0)
        assert dense - held == 32 * (8 - 8 // ep) * one_expert
    # fp32 params, grads and AdamW states (4+4+8 bytes) of what a rank holds, ZeRO 0
    p, g, o = model_state_bytes(m, ParallelPlan(dp=8, ep=8, global_batch=8))
    held = m.param_count() - 32 * 7 * one_expert
    assert (p, g, o) == (4 * held, 4 * held, 8 * held)


# ZeRO with ep, by hand (tiny-moe: hidden 64, 8 heads of 8, 4 kv heads: q 64, kv 32; SwiGLU
# experts (E, 64, 64) x 3, no biases; every dense tensor's dim 0 chunked over dp like
# torch.chunk; embedding and output (256, 64), final norm (64,)).
#
# (a) 6 experts, dp 4 = edp 2 x ep 2: 3 experts a rank do not divide over edp 2, so they are
#   sharded evenly by dim 1: 3 x 32 x 64 = 6144 a tensor, 18432 a block on every rank.
#   Dense over dp 4: norms 16 each, wq and wo 16 rows x 64 = 1024 each, wk and wv 8 x 64 = 512
#   each -> 3104; the router (6, 64) in chunks of 2 rows: 128 on dp ranks 0-2, none on 3.
#   Blocks [21664, 21664, 21664, 21536]; embedding and output 64 rows = 4096 each, norm 16.
#   (Chunking by experts would put 2 experts on edp 0 and 1 on edp 1; chunking the whole
#   (6, ...) over dp 4, 2 experts on dp ranks 0-2 and none on 3.)
# (b) 8 experts, dp 6 = edp 3 x ep 2: 4 experts a rank do not divide over 3, nor does 64:
#   chunked by experts, 2, 2 and 0 -> 3 x 2 x 4096 = 24576 on dp ranks 0-3 (edp 0, 1), 0 on
#   4 and 5 (edp 2). Dense over dp 6 in chunks of ceil(n/6): norms 11 (rank 5: 9), wq and wo
#   11 rows x 64 = 704 (rank 5: 9 x 64 = 576), wk and wv 6 rows = 384 (rank 5: 2 rows = 128),
#   router (8, 64) 2 rows = 128 on ranks 0-3 -> 2326 (ranks 0-3), 2198 (4), 1426 (5);
#   embedding and output 43 rows = 2752 (rank 5: 41 rows = 2624), norm 11 (rank 5: 9).
SPEC6 = SPEC.replace(n_experts=6)
EP_ZERO_CASES = {
    "6-experts-dim1": (SPEC6, ParallelPlan(dp=4, ep=2, zero=3, global_batch=8, seq_len=64),
                       [4 * 21664 + 8208] * 3 + [4 * 21536 + 8208], 1),
    "8-experts-dim0": (SPEC, ParallelPlan(dp=6, ep=2, zero=3, global_batch=12, seq_len=64),
                       [4 * (2326 + 24576) + 2 * 2752 + 11] * 4 + [4 * 2198 + 2 * 2752 + 11,
                                                                  4 * 1426 + 2 * 2624 + 9], 0),
}


@pytest.mark.parametrize("case", list(EP_ZERO_CASES))
def test_zero_shards_of_experts_under_ep_by_hand(case):
    from ptd.cost.memory import model_state_bytes
    from ptd.cost.params import rank_fsdp_numel
    spec, plan, by_hand, _ = EP_ZERO_CASES[case]
    plan.validate(spec)
    assert [rank_fsdp_numel(spec, plan, 0, d) for d in range(plan.dp)] == by_hand
    # the most loaded rank (dp rank 0) and a given one: fp32 params, grads, AdamW states
    n, last = by_hand[0], by_hand[-1]
    assert model_state_bytes(spec, plan) == (4 * n, 4 * n, 8 * n)
    assert model_state_bytes(spec, plan, pp_rank=0, dp_rank=plan.dp - 1) == (4 * last, 4 * last, 8 * last)
    # ZeRO-1/2 under the "ptd" convention hold the same shards
    for zero in (1, 2):
        assert rank_fsdp_numel(spec, plan.replace(zero=zero), 0, plan.dp - 1) == last


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(EP_ZERO_CASES))
def test_runtime_zero_shards_under_ep_are_the_cost_models(case):
    """The runtime's FSDP shards (meta model, one fake process group per rank) hold exactly
    the elements above on every rank, and the experts are 2-D (edp, ep) DTensors sharded on
    the dimension worked out above."""
    import contextlib

    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import Shard
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from ptd.runtime.model.moe import GroupedExperts
    from ptd.runtime.parallel.ep import apply_ep
    from ptd.runtime.parallel.fsdp import apply_fsdp
    from ptd.specs.layout import AXES, mesh_shape
    spec, plan, by_hand, dim = EP_ZERO_CASES[case]
    for rank in range(plan.world_size):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=plan.world_size)
        with contextlib.ExitStack() as stack:
            stack.callback(dist.destroy_process_group)
            mesh = init_device_mesh("cpu", mesh_shape(plan), mesh_dim_names=AXES)
            ep_mesh = DeviceMesh("cpu", torch.arange(plan.world_size).view(1, plan.dp // 2, 2, 1),
                                 mesh_dim_names=("pp", "edp", "ep", "tp"))
            model = build_model(spec, "meta")
            apply_ep(model, ep_mesh)
            apply_fsdp(model, mesh["dp"], plan, torch.device("cpu"), ep_mesh=ep_mesh)
            held = sum(p.to_local().numel() for p in model.parameters())
            assert held == by_hand[rank], rank
            experts = [m for m in model.modules() if isinstance(m, GroupedExperts)]
            assert len(experts) == 4 and all(isinstance(m, FSDPModule) for m in experts)
            w1 = experts[0].w1
            assert w1.device_mesh.mesh_dim_names == ("edp", "ep") and w1.placements[1] == Shard(0)
            assert w1.placements[0].dim == dim and w1.shape == (spec.n_experts, 64, 64)


def test_all_to_all_time_counts_and_bytes():
    from ptd.cost.moe import ep_comm_time, ep_group_ranks
    m = get_preset("tiny-moe")
    plan = ParallelPlan(dp=4, ep=2, tp=2, micro_batch=2, global_batch=16, seq_len=64)
    calls = []
    t = ep_comm_time(m, plan, moe_layers=4, coll=lambda k, b, n: calls.append((k, b, n)) or 0.5)
    # dispatch + combine, forward + backward, per layer and micro-batch (2 per replica), each
    # all-to-all priced 0.5 s here; and the forward's exchange of per-expert counts
    # (runtime/parallel/ep.py: one int64 per expert leaves each rank), also 0.5 s
    assert t == (4 + 1) * 4 * 2 * 0.5 and calls[0] == ("all_to_all", 2 * 64 * 2 * 64 * 4, 2)  # T*k*h fp32
    assert calls[1] == ("all_to_all", 8 * 8, 2)  # tiny-moe's 8 experts
    assert ep_group_ranks(plan) == [0, 2]  # consecutive dp ranks, tp apart
    from ptd.cost.moe import all_to_all_bytes, routed_expert_numel
    for dtype in ("bf16", "fp16"):  # 2 bytes an element
        assert all_to_all_bytes(m, plan.replace(dtype=dtype)) == 2 * 64 * 2 * 64 * 2
    assert routed_expert_numel(get_preset("tiny")) == 0  # a dense model has none
    # the busiest rank's all-to-alls carry imbalance x the bytes
    calls.clear()
    ep_comm_time(m, plan, 4, lambda k, b, n: calls.append(b) or 0.5, imbalance=2.5)
    assert calls[0] == 2.5 * 2 * 64 * 2 * 64 * 4
    assert ep_comm_time(m, plan.replace(ep=1), 4, lambda *a: 1.0) == 0.0


def test_planner_searches_ep():
    from ptd.planner.search import search
    from ptd.specs import ClusterSpec, load_hardware
    cluster = ClusterSpec(load_hardware("h100-sxm"), 64, 8)
    m = get_preset("mixtral-8x7b")
    res = search(m, cluster, 512, 4096, dtype="bf16", fixed={"tp": 1, "pp": 4})
    plans = [e.plan for e in res.ranked]
    assert {p.ep for p in plans} >= {2, 4, 8} and all(p.dp % p.ep == 0 for p in plans)
    # ep 2 leaves a pipeline rank 8 blocks x 4 experts x 3 x 4096 x 14336 = 5.6 G expert
    # parameters (16 bytes each with AdamW: 90 GB): no fit at zero 0, while
    # ZeRO shards them over the dp/ep = 8 ranks holding the same experts
    assert {p.zero for p in plans if p.ep == 2} == {1, 2, 3}
    assert {p.zero for p in plans if p.ep == 8} == {0, 1, 2, 3}
    assert not any("ZeRO 0" in why for why in res.plans_rejected)
    fixed = search(m, cluster, 512, 4096, dtype="bf16", fixed={"tp": 1, "pp": 4, "ep": 8})
    assert fixed.ranked and {e.plan.ep for e in fixed.ranked} == {8}


def test_regroup_index_by_hand():
    from ptd.runtime.parallel.ep import _regroup_index
    # rows from 2 sources for 2 local experts: source 0 sends (2 for e0, 1 for e1), source 1
    # sends (0 for e0, 3 for e1); arrival order s0e0 s0e0 s0e1 s1e1 s1e1 s1e1 = rows 0..5
    idx = _regroup_index(torch.tensor([[2, 1], [0, 3]]))
    assert idx.tolist() == [0, 1, 2, 3, 4, 5]
    # (1 for e0, 2 for e1) from s0 and (2 for e0, 0 for e1) from s1: rows 0 | 1 2 | 3 4
    # by expert: e0 <- s0 row 0, s1 rows 3 4; e1 <- s0 rows 1 2
    assert _regroup_index(torch.tensor([[1, 2], [2, 0]])).tolist() == [0, 3, 4, 1, 2]


@pytest.mark.parametrize("argv,match", [
    (["estimate", "--model", "tiny", "--hardware", "h100-sxm", "--gpus", "4", "--ep", "2"],
     "needs a mixture-of-experts model"),
    (["estimate", "--model", "tiny-moe", "--hardware", "h100-sxm", "--gpus", "4", "--ep", "3"],
     "ep 3 does not divide dp 4"),
    (["train", "--model", "tiny-moe", "--nproc", "2", "--ep", "2", "--grad-compression", "fp16"],
     "need DDP"),
])
def test_bad_ep_input_elsewhere_is_one_line_exit_2(ptd_cli, no_workers, tmp_path, argv, match):
    rc, out, err = ptd_cli(*argv, *(["--out", str(tmp_path / "o")] if argv[0] == "train" else []))
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and match in lines[0], err


def test_estimate_prices_ep(ptd_cli):
    import json
    base = ["estimate", "--model", "mixtral-8x7b", "--hardware", "h100-sxm", "--gpus", "64", "--tp", "4",
            "--zero", "0", "--micro-batch", "1", "--recompute", "full", "--json"]
    runs = {}
    for ep in (1, 2, 8):
        rc, out, _ = ptd_cli(*base, "--ep", str(ep))
        assert rc == 0
        runs[ep] = json.loads(out)
    step = {ep: r["step_time_s"] for ep, r in runs.items()}
    assert step[1]["ep_comm"] == 0 and 0 < step[2]["ep_comm"] < step[8]["ep_comm"]  # ep 8 spans 4 nodes
    mem = {ep: r["memory_per_device_bytes"]["params"] for ep, r in runs.items()}
    assert mem[1] > mem[2] > mem[8]


def test_imbalance_term_by_hand():
    from ptd.cost.moe import imbalance_compute_time
    m = get_preset("mixtral-8x7b")
    plan = ParallelPlan(dp=16, ep=8, micro_batch=1, global_batch=64, seq_len=4096)
    # 4 micro-batches of 4096 tokens; top-2 of SwiGLU experts 4096 x 14336: 2*2*3*h*F FLOPs
    # per token forward, x3 with the backward; half of it again at imbalance 1.5
    want = 0.5 * 3 * (2 * 2 * 3 * 4096 * 14336) * 4 * 4096 * 32 / 1e15
    assert imbalance_compute_time(m, plan, 32, 1e15, 1.5) == pytest.approx(want, rel=1e-12)
    assert imbalance_compute_time(m, plan.replace(ep=1), 32, 1e15, 1.5) == 0.0
    assert imbalance_compute_time(m, plan, 32, 1e15, 1.0) == 0.0
    assert imbalance_compute_time(m, plan.replace(ep=2), 32, 1e15, 1.5) == pytest.approx(want)
    assert imbalance_compute_time(m, plan, 32, 1e15) == 0.0  # balanced unless told
    assert imbalance_compute_time(m, plan, 32, 1e15, 0.9) == 0.0  # the busiest is never below the mean
    # GELU experts have two matrices, SwiGLU three: 2 k 2 h F forward FLOPs per token
    from ptd.cost.moe import expert_flops_per_token
    gelu = m.replace(mlp="gelu", norm="layernorm", position="learned")
    assert expert_flops_per_token(gelu) == 2 * 2 * 2 * 4096 * 14336
    assert expert_flops_per_token(m) == 2 * 2 * 3 * 4096 * 14336
    assert expert_flops_per_token(m.replace(top_k=3)) == 2 * 3 * 3 * 4096 * 14336
    # 2.5 times the mean: 1.5 times the expert work again
    assert imbalance_compute_time(m, plan, 32, 1e15, 2.5) == pytest.approx(3 * want)


def test_moe_block_products_and_memory_traffic_under_tp_by_hand():
    # tiny-moe with one shared expert (h = F = 64, E = 8, k = 2, SwiGLU), 128 tokens, tp 2:
    # the router and the routed experts are whole on every tp rank (runtime/parallel/tp.py),
    # the shared expert is split like a dense MLP
    from ptd.cost.compute import block_gemms, elementwise_bytes_fwd
    spec = get_preset("tiny-moe").replace(n_shared_experts=1)
    lin, _ = block_gemms(spec, 128, 64, 2, 2)
    mlp = [(g.m, g.n, g.k, g.count) for g in lin[3:]]  # after q, k/v, o
    assert mlp == [(128, 8, 64, 1),             # router
                   (32, 64, 64, 16),            # w1 and w3 of 8 experts, 128 x 2 / 8 rows each
                   (32, 64, 64, 8),             # w2 of 8 experts
                   (128, 32, 64, 2),            # shared w1, w3: F / 2 columns
                   (128, 64, 32, 1)]            # shared w2: F / 2 inner
    # memory traffic: per token (elementwise_bytes_fwd's docstring) with routed experts whole:
    # k (5F + 6h) and the shared expert's 5F / tp
    one = elementwise_bytes_fwd(spec, 128, 1, False, 4)
    two = elementwise_bytes_fwd(spec, 128, 2, False, 4)
    dense_part = lambda t: 4 * 64 + 6 * 64 + 6 * (64 + 32) / t + (2 * (64 + 64) + 2 * 64) / t  # noqa: E731
    assert one == 128 * 4 * (dense_part(1) + 2 * (5 * 64 + 6 * 64) + 5 * 64)
    assert two == 128 * 4 * (dense_part(2) + 2 * (5 * 64 + 6 * 64) + 5 * 64 / 2)


def test_optimizer_prices_expert_dtensors_under_ep_alone_by_hand(monkeypatch):
    # ep without tp or ZeRO: the routed experts are DTensors (sharded over ep), the rest plain
    # tensors, each kind at its measured cost of the optimizer phase per tensor (with memory
    # traffic made free, and the gradient norm's all-reduces, tested in
    # test_cost_grad_norm.py, at no cost). tiny-moe: 4 layers of 10 tensors (2 norms, q k v o, router, w1 w2
    # w3), and 4 more (embedding, final norm, output; the count's constant)
    import dataclasses
    from ptd.cost.step import optimizer_time, micro_batch
    from ptd.specs import ClusterSpec, get_hardware_preset
    import ptd.cost.step as S
    monkeypatch.setattr(S, "_coll", lambda *a, **k: 0.0)
    hw = dataclasses.replace(get_hardware_preset("cpu"), memory_bandwidth=1e30,
                             memory_bandwidth_measured={}, overheads_measured={
                                 "optimizer_tensor": {1: 1e-4},
                                 "optimizer_tensor_dtensor": {1: 5e-4}})
    cluster = ClusterSpec(hw, 1)
    m = get_preset("tiny-moe")
    plan = ParallelPlan(dp=2, ep=2, micro_batch=2, global_batch=4, seq_len=64, dtype="fp32")
    mbt = micro_batch(m, plan, cluster, "flash", True, True)
    assert optimizer_time(m, plan, cluster, mbt)[0] == pytest.approx(32 * 1e-4 + 12 * 5e-4)
    assert optimizer_time(m, plan.replace(ep=1), cluster, mbt)[0] == pytest.approx(44 * 1e-4)
    # under ZeRO every parameter is a DTensor already: all 44 at the DTensor cost
    assert optimizer_time(m, plan.replace(zero=1), cluster, mbt)[0] == pytest.approx(44 * 5e-4)
    # a measured cost per parameter: the rank's 281,152 -- embedding and output 256 x 64
    # each, the final norm 64, and per layer two norms (128), q k v o (12,288), the router
    # (512) and half of the experts' 3 x 8 x 64 x 64 (49,152)
    per = dataclasses.replace(hw, overheads_measured=dict(hw.overheads_measured,
                                                          optimizer_param={1: 1e-9}))
    local = 2 * 256 * 64 + 64 + 4 * (128 + 12288 + 512 + 49152)
    assert optimizer_time(m, plan, ClusterSpec(per, 1), mbt)[0] == pytest.approx(
        32 * 1e-4 + 12 * 5e-4 + local * 1e-9)
    # a measured cost per DTensor parameter (3e-9 s): the experts' 4 x 49,152 parameters pay
    # it instead of the plain one; under ZeRO-1 every parameter of the rank's shard does
    # (281,152 / dp 2 = 140,576 of them)
    dt = dataclasses.replace(per, overheads_measured=dict(per.overheads_measured,
                                                          optimizer_param_dtensor={1: 3e-9}))
    assert optimizer_time(m, plan, ClusterSpec(dt, 1), mbt)[0] == pytest.approx(
        32 * 1e-4 + 12 * 5e-4 + local * 1e-9 + 4 * 49152 * (3e-9 - 1e-9))
    assert optimizer_time(m, plan.replace(zero=1), ClusterSpec(dt, 1), mbt)[0] == pytest.approx(
        44 * 5e-4 + 140576 * 3e-9)
    # without ep and ZeRO (and tp) nothing is a DTensor: the plain cost per parameter
    assert optimizer_time(m, plan.replace(ep=1), ClusterSpec(dt, 1), mbt)[0] == pytest.approx(
        44 * 1e-4 + (local + 4 * 49152) * 1e-9)


def test_experts_run_in_the_autocast_dtype(monkeypatch):
    # autocast does not reach aten._grouped_mm: on fp32 rows it ran Mixtral's experts in fp32
    # on an H200 (7x the step). The rows must reach the products in autocast's dtype, as a
    # Linear's input does, and the layer's output be in it too (as a dense MLP's is)
    import ptd.runtime.model.moe as moe_mod
    seen = []
    real = moe_mod.grouped_mm
    monkeypatch.setattr(moe_mod, "grouped_mm",
                        lambda x, w, c: seen.append((x.dtype, w.dtype)) or real(x, w, c))
    spec = get_preset("tiny-moe")
    layer = MoE(spec)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.1)
    x = torch.randn(2, 16, spec.hidden, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert seen == [(torch.bfloat16, torch.bfloat16)] * 3 and y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and layer.experts.w1.grad.dtype == torch.float32
    seen.clear()
    layer(x)  # without autocast: fp32 throughout
    assert seen == [(torch.float32, torch.float32)] * 3

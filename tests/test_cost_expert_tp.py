"""Expert tensor parallelism (the ``megatron-core`` stack, :mod:`ptd.cost.moe`): routed
experts split over tp like a dense MLP, the dispatched tokens all-gathered over tp after the
all-to-all and reduce-scattered before the way back. Every expected value below is counted
by hand from the model's shapes (h 64, F 128, 4 experts, top 2, SwiGLU, 4 blocks), not read
from the code under test."""

import pytest

from ptd.cost import compute as C
from ptd.cost import memory as M
from ptd.cost import moe as MOE
from ptd.cost import params as P
from ptd.cost import step as S
from ptd.cost.estimate import estimate
from ptd.cost.stacks import STACKS, stack_options
from ptd.specs import ClusterSpec, ModelSpec, ParallelPlan, load_hardware

MOE_MODEL = ModelSpec(name="t", n_layers=4, hidden=64, n_heads=4, n_kv_heads=4, ffn_hidden=128,
                      vocab_size=256, max_seq_len=256, n_experts=4, top_k=2)
# one block's routed experts: 4 experts x (gate, up, down: 3 x 64 x 128) elements
EXPERTS_PER_BLOCK = 4 * 3 * 64 * 128  # 98304


def test_only_megatron_core_splits_experts_over_tp():
    # Megatron-Core's expert_tensor_parallel_size defaults to tp; every other stack (and
    # ptd's runtime) keeps each expert whole on every tp rank
    assert stack_options("megatron-core").expert_tp is True
    assert [n for n, s in STACKS.items() if s.expert_tp] == ["megatron-core"]


def test_a_rank_holds_one_tp_th_of_its_experts():
    # tp 2, ep 2: a rank's 2 experts a block, half of each -- 98304/2 - 98304/4 = 24576
    # fewer elements a block than with whole experts, 98304 over the 4 blocks
    plan = ParallelPlan(dp=2, tp=2, ep=2, global_batch=4, seq_len=64)
    whole, split = P.local_numel(MOE_MODEL, plan, 0), P.local_numel(MOE_MODEL, plan, 0, True)
    assert whole - split == 4 * (EXPERTS_PER_BLOCK // 2 - EXPERTS_PER_BLOCK // 4) == 98304
    assert P.local_expert_numel(MOE_MODEL, plan, 0, True) == 4 * EXPERTS_PER_BLOCK // 4
    assert P.local_block_numel(MOE_MODEL, 2, 2) - P.local_block_numel(MOE_MODEL, 2, 2, True) == 24576
    # at tp 1 the split is no split
    one = plan.replace(tp=1, dp=2)
    assert P.local_numel(MOE_MODEL, one, 0, True) == P.local_numel(MOE_MODEL, one, 0)


def test_distributed_optimizer_shards_experts_over_the_expert_data_parallel_group():
    # dp 4, ep 2, tp 2, ZeRO-1 as Megatron lays it out: the dense part over dp x cp = 4,
    # the rank's experts (4 blocks x 98304 / (ep 2 x tp 2) = 98304 elements) over the
    # dp x cp / ep = 2 ranks holding the same experts
    plan = ParallelPlan(dp=4, tp=2, ep=2, zero=1, global_batch=8, seq_len=64, dtype="bf16")
    e = M.model_state_elements(MOE_MODEL, plan, 0, 0, "megatron", expert_tp=True)
    experts = 98304
    assert e.params == e.grads == P.local_numel(MOE_MODEL, plan, 0, True)
    assert e.optimizer == -(-(e.params - experts) // 4) + experts // 2
    # with cp 2 the groups double: dense over 8, experts over 4
    cp = plan.replace(cp=2, seq_len=64)
    e2 = M.model_state_elements(MOE_MODEL, cp, 0, 0, "megatron", expert_tp=True)
    assert e2.optimizer == -(-(e2.params - experts) // 8) + experts // 4
    # bytes: 2 + 4 a parameter and 12 an optimizer element, for the worst rank
    pb, gb, ob = M.model_state_bytes(MOE_MODEL, plan, "megatron", expert_tp=True)
    assert (pb, gb, ob) == (2 * e.params, 4 * e.params, 12 * e.optimizer)


def test_activations_keep_one_tp_th_of_the_experts_intermediates():
    # per token, 2 assignments, each keeping 4 F intermediates (SwiGLU unfused) at 2 bytes:
    # split over tp 2 a rank keeps 4 x 64 fewer elements an assignment:
    # 64 tokens x 2 assignments x 4 x 64 x 2 bytes = 65536 bytes less
    kw = dict(seq_len=64, micro_batch=1, tp=2, sp=True, act_bytes=2)
    whole = M.activation_bytes_per_layer(MOE_MODEL, **kw)
    split = M.activation_bytes_per_layer(MOE_MODEL, **kw, expert_tp=True)
    assert whole - split == 64 * 2 * 4 * 64 * 2 == 65536
    # the fused SwiGLU keeps 3 F instead of 4 in the routed experts too:
    # 64 tokens x 2 assignments x 128 x 2 bytes (a MoE block has no dense MLP to change)
    fused = M.activation_bytes_per_layer(MOE_MODEL, **kw, fused_swiglu=True)
    assert whole - fused == 64 * 2 * 128 * 2 == 32768


def test_the_experts_products_are_one_tp_th():
    # 64 tokens, 2 assignments each, 3 products of 64 x 128: 2 x 64 x 2 x 3 x 64 x 128 FLOPs
    # whole; 3145728 over tp 2
    whole = sum(g.flops for g in C.routed_gemms(MOE_MODEL, 64))
    split = sum(g.flops for g in C.routed_gemms(MOE_MODEL, 64, 2))
    assert whole == 2 * 64 * 2 * 3 * 64 * 128 == 6291456
    assert split == 3145728
    lin_whole, _ = C.block_gemms(MOE_MODEL, 64, 64, 1, 2)
    lin_split, _ = C.block_gemms(MOE_MODEL, 64, 64, 1, 2, expert_tp=True)
    assert sum(g.flops for g in lin_whole) - sum(g.flops for g in lin_split) == 3145728


def test_dispatch_sends_the_sequence_parallel_share_and_gathers_over_tp():
    # tp 2, ep 2, cp 2, micro-batch 1 of 64 tokens, bf16: a rank routes 32 tokens (its cp
    # share), 16 of them its sp share; all-to-all buffer 16 x 2 x 64 x 2 = 4096 bytes;
    # the gathered buffer over tp 32 x 2 x 64 x 2 = 8192 bytes
    plan = ParallelPlan(dp=2, tp=2, ep=2, cp=2, sp=True, micro_batch=1, global_batch=4,
                        seq_len=64, dtype="bf16")
    calls, tp_calls = [], []

    def coll(kind, nbytes, n):
        calls.append((kind, nbytes, n))
        return nbytes

    def tp_coll(kind, nbytes):
        tp_calls.append((kind, nbytes))
        return nbytes
    t = MOE.ep_comm_time(MOE_MODEL, plan, 4, coll, 1.0, True, tp_coll)
    assert set(calls) == {("all_to_all", 4096, 2), ("all_to_all", 8 * 4, 2)}
    assert sorted(set(tp_calls)) == [("all_gather", 8192), ("reduce_scatter", 8192)]
    # a block and micro-batch: 4 token all-to-alls, the counts, 2 gathers and 2 scatters;
    # 4 blocks x 2 micro-batches
    assert t == 4 * 2 * (4 * 4096 + 32 + 2 * (8192 + 8192))
    # without expert tp: the whole cp share travels, 32 x 2 x 64 x 2, and nothing over tp
    calls.clear(), tp_calls.clear()
    MOE.ep_comm_time(MOE_MODEL, plan, 4, coll, 1.0, False, tp_coll)
    assert ("all_to_all", 8192, 2) in calls and not tp_calls


def test_a_moe_blocks_mlp_has_no_tp_all_reduce_of_its_own_under_expert_tp():
    # with sp a dense block runs 2 gather/scatter pairs forward (attention, MLP) and 2
    # backward (+2 under full recompute); a MoE block under expert tp only the attention's
    plan = ParallelPlan(dp=1, tp=2, sp=True, global_batch=2, seq_len=64)
    cl = ClusterSpec(load_hardware("h100-sxm"), 2, 8)
    t = S._tp_collectives(MOE_MODEL, plan, cl, 64, False, True)
    f, b = t.n_f, t.n_b
    assert (f, b) == (1, 1)
    t = S._tp_collectives(MOE_MODEL, plan.replace(recompute="full"), cl, 64, False, True)
    f, b = t.n_f, t.n_b
    assert (f, b) == (1, 2)
    t = S._tp_collectives(MOE_MODEL, plan, cl, 64, False, False)
    f, b = t.n_f, t.n_b
    assert (f, b) == (2, 2)


def test_megatron_core_prices_split_experts_smaller_and_faster():
    # a wide MoE (8 experts of 4 x 4096 x 16384, top 2) on tp 8: whole experts on each tp
    # rank hold 8x the expert weights Megatron-Core's split does; the split plan is priced
    # smaller and faster on both counts, and the tp-1 plan is the same either way
    big = ModelSpec(name="w", n_layers=8, hidden=4096, n_heads=32, n_kv_heads=8,
                    ffn_hidden=16384, vocab_size=32000, max_seq_len=4096, n_experts=8, top_k=2)
    cl = ClusterSpec(load_hardware("h100-sxm"), 64, 8)
    plan = ParallelPlan(dp=8, tp=8, ep=8, zero=1, sp=True, micro_batch=1, global_batch=64,
                        seq_len=4096, dtype="bf16")
    core = stack_options("megatron-core")
    import dataclasses
    whole = estimate(big, cl, plan, options=dataclasses.replace(core, expert_tp=False))
    split = estimate(big, cl, plan, options=core)
    # params: a rank's 1 expert of 3 x 4096 x 16384 a block, 8 blocks, at 2 bytes: the
    # split holds 7/8 of it less
    assert whole.memory.params - split.memory.params == pytest.approx(
        8 * 3 * 4096 * 16384 * 2 * 7 / 8)
    assert split.step.compute < whole.step.compute and split.step.total < whole.step.total
    one = plan.replace(tp=1, sp=False, dp=64, ep=8)
    cl1 = ClusterSpec(load_hardware("h100-sxm"), 64, 8)
    a = estimate(big, cl1, one, options=dataclasses.replace(core, expert_tp=False))
    b = estimate(big, cl1, one, options=core)
    assert a.step.total == b.step.total and a.memory.total == b.memory.total



def test_megatron_core_moe_with_tp_is_always_sequence_parallel(ptd_cli):
    # Megatron-Core refuses MoE with tp > 1 and no sequence parallelism: the cost model
    # chooses sp on where it is free, and never prices sp off for that stack
    from ptd.cost.estimate import choose
    big = ModelSpec(name="w", n_layers=8, hidden=1024, n_heads=16, n_kv_heads=8,
                    ffn_hidden=4096, vocab_size=32000, max_seq_len=4096, n_experts=8, top_k=2)
    cl = ClusterSpec(load_hardware("h100-sxm"), 16, 8)
    base = ParallelPlan(dp=8, tp=2, ep=8, zero=1, micro_batch=1, global_batch=64,
                        seq_len=4096, dtype="bf16")
    assert choose(big, cl, base, ["sp"], options=stack_options("megatron-core")).plan.sp
    with pytest.raises(Exception, match="only under sequence parallelism"):
        choose(big, cl, base, [], options=stack_options("megatron-core"))
    # ptd's runtime keeps experts whole on every tp rank and does not wire sp into its MoE
    # layer, so ptd estimate and ptd plan (which price only what ptd train runs) have no
    # tp > 1 plan of a MoE model for this stack: a one-line refusal naming both rules, and
    # a ranking of tp 1 plans; ptd's own stack still prices tp > 1 without sp
    args = ("estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--tp", "4", "--ep", "8",
            "--pp", "2")
    rc, out, err = ptd_cli(*args, "--stack", "megatron-core")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "only under sequence parallelism" in err and "ptd train refuses" in err
    rc, out, err = ptd_cli(*args, "--stack", "ptd", "--no-sp")
    assert rc == 0, err
    rc, out, err = ptd_cli("plan", "--model", "mixtral-8x7b", "--gpus", "64", "--stack",
                           "megatron-core", "--fix", "pp=2", "--top", "20", "--json")
    assert rc == 0, err
    import json
    ranked = json.loads(out)["top"]
    assert ranked and all(r["plan"]["tp"] == 1 for r in ranked)


def test_the_step_prices_the_tp_gathers_over_the_tp_group():
    # ep 1, tp 2 on one H100 node: no all-to-all, but per block and micro-batch an
    # all-gather and a reduce-scatter of the 64 x 2 x 64 x 2 = 16384 dispatched bytes over
    # the 2 tp ranks, forward and backward: 4 blocks x 2 micro-batches x 2 x (AG + RS),
    # each priced as the alpha-beta model prices one collective of that size on the node
    from ptd.cost.comm import collective_time
    hw = load_hardware("h100-sxm")
    cl = ClusterSpec(hw, 2, 8)
    plan = ParallelPlan(dp=1, tp=2, sp=True, micro_batch=1, global_batch=2, seq_len=64,
                        dtype="bf16")
    st = S.step_time(MOE_MODEL, plan, cl, expert_tp=True)
    one = collective_time("all_gather", 16384, 2, hw, 1, 2) \
        + collective_time("reduce_scatter", 16384, 2, hw, 1, 2)
    assert st.ep_comm == pytest.approx(4 * 2 * 2 * one, rel=1e-12)
    assert S.step_time(MOE_MODEL, plan, cl).ep_comm == 0.0  # experts whole: nothing to gather


def test_sharded_states_hold_one_tp_th_of_the_experts_too():
    # ZeRO-3 on dp 4 = ep 2 x edp 2, tp 2: the rank's 4 x 98304 / 2 expert elements are
    # sharded over edp 2; split over tp they are half that: 98304 / 2 fewer per rank
    plan = ParallelPlan(dp=4, tp=2, ep=2, zero=3, global_batch=8, seq_len=64, dtype="bf16")
    whole = M.model_state_elements(MOE_MODEL, plan, 0, 0, "zero")
    split = M.model_state_elements(MOE_MODEL, plan, 0, 0, "zero", expert_tp=True)
    assert whole.params - split.params == (4 * 98304 // 2 - 4 * 98304 // 4) // 2 == 49152
    assert P.max_local_numel(MOE_MODEL, plan, True) == P.local_numel(MOE_MODEL, plan, 0, True)


def test_no_tp_gathers_at_tp_1_and_edp_ranks_sit_ep_tp_apart():
    # expert tp at tp 1 is no split: nothing is gathered over a one-rank group
    plan = ParallelPlan(dp=2, tp=1, ep=2, micro_batch=1, global_batch=4, seq_len=64,
                        dtype="bf16")
    tp_calls = []
    MOE.ep_comm_time(MOE_MODEL, plan, 4, lambda k, b, n: b, 1.0, True,
                     lambda k, b: tp_calls.append(k) or b)
    assert tp_calls == []
    # the ranks holding the same experts: dp / ep = 4 of them, ep x tp = 8 global ranks
    # apart (0, 8, 16, 24): on nodes of 16, two nodes of two
    assert MOE.edp_node_split(ParallelPlan(dp=8, tp=4, ep=2, global_batch=8), 16) == (2, 2)


def test_the_heaviest_rank_counts_split_experts_without_ep_too():
    # ep 1, tp 2: every rank holds all 4 experts, half of each: 4 blocks x 98304 / 2 fewer
    plan = ParallelPlan(dp=2, tp=2, global_batch=4, seq_len=64)
    assert P.max_local_numel(MOE_MODEL, plan) - P.max_local_numel(MOE_MODEL, plan, True) \
        == 4 * 98304 // 2


def test_imbalance_work_is_one_tp_th_under_expert_tp():
    # dp 2 = ep 2, tp 2, micro-batch 1 of 64 tokens, 2 micro-batches: at imbalance 2 the
    # busiest rank does one more mean load: 3 x (2 x 2 x 3 x 64 x 128 = 98304 FLOPs a
    # token) x 128 tokens x 4 blocks at 1e12 FLOP/s, half of it split over tp 2
    plan = ParallelPlan(dp=2, tp=2, ep=2, sp=True, micro_batch=1, global_batch=4, seq_len=64)
    whole = MOE.imbalance_compute_time(MOE_MODEL, plan, 4, 1e12, 2.0)
    assert whole == pytest.approx(3 * 98304 * 128 * 4 / 1e12, rel=1e-12)
    assert MOE.imbalance_compute_time(MOE_MODEL, plan, 4, 1e12, 2.0, True) == pytest.approx(
        whole / 2, rel=1e-12)


def test_elementwise_passes_over_split_experts():
    # the routed activation's 5 passes over F per assignment: 64 tokens x 2 assignments x
    # 5 x 128 x (1 - 1/2) x 2 bytes = 81920 bytes fewer a block under tp 2
    whole = C.elementwise_bytes_fwd(MOE_MODEL, 64, 2, True, 2)
    split = C.elementwise_bytes_fwd(MOE_MODEL, 64, 2, True, 2, True)
    assert whole - split == 64 * 2 * 5 * 64 * 2 == 81920


def test_block_time_and_step_pass_the_split_on(monkeypatch):
    # the block's routed products (what sits between the all-to-alls) and its memory-bound
    # passes are the split ones; the step hands the split to the data-parallel terms and
    # the imbalance work
    hw = load_hardware("h100-sxm")
    blk = C.block_time(MOE_MODEL, hw, 64, 1, 2, True, "bf16", 1e14, expert_tp=True)
    want = sum(C.gemm_time(g, 1e14, hw.effective_memory_bandwidth, 2, hw, "bf16")
               for g in C.routed_gemms(MOE_MODEL, 64, 2))
    assert blk.routed_forward == pytest.approx(want, rel=1e-12)
    seen: dict[str, list] = {}

    def spy(mod, name, pick):
        real = getattr(mod, name)

        def wrapped(*a, **kw):
            seen.setdefault(name, []).append(pick(a, kw))
            return real(*a, **kw)
        monkeypatch.setattr(mod, name, wrapped)
    spy(C, "elementwise_bytes_fwd", lambda a, kw: a[5])
    C.block_time(MOE_MODEL, hw, 64, 1, 2, True, "bf16", 1e14, expert_tp=True)
    assert seen["elementwise_bytes_fwd"] == [True]
    from ptd.cost import dp as DP
    spy(DP, "dp_terms", lambda a, kw: a[-1])
    spy(MOE, "imbalance_compute_time", lambda a, kw: a[-1])
    spy(P, "local_block_numel", lambda a, kw: a[3] if len(a) > 3 else kw.get("expert_tp"))
    plan = ParallelPlan(dp=2, tp=2, ep=2, sp=True, zero=1, micro_batch=1, global_batch=4,
                        seq_len=64, dtype="bf16")
    S.step_time(MOE_MODEL, plan, ClusterSpec(hw, 4, 8), expert_tp=True)
    # (``is``: the imbalance, 1.0, would compare equal to True)
    assert [x is True for x in seen["dp_terms"] + seen["imbalance_compute_time"]] == [True, True]
    # ZeRO's per-block gathers and reduce-scatters move the split block
    assert seen["local_block_numel"] and all(seen["local_block_numel"])


def test_zero0_gradients_reduce_the_split_experts():
    # ep 1, dp 2 x tp 2 on one node, no ZeRO: one all-reduce of the rank's fp32 gradients,
    # the experts' half of each, over the 2 data-parallel ranks (global ranks 0 and 2)
    from ptd.cost.comm import collective_time
    hw = load_hardware("h100-sxm")
    plan = ParallelPlan(dp=2, tp=2, sp=True, micro_batch=1, global_batch=4, seq_len=64,
                        dtype="bf16")
    st = S.step_time(MOE_MODEL, plan, ClusterSpec(hw, 4, 8), expert_tp=True)
    grads = 4 * P.local_numel(MOE_MODEL, plan, 0, True)
    assert st.dp_comm_total == pytest.approx(collective_time("all_reduce", grads, 2, hw, 1, 2),
                                             rel=1e-12)


def test_a_dense_model_is_priced_the_same_with_expert_tp():
    # the megatron-core stack on a dense model: expert_tp changes nothing
    dense = ModelSpec(name="d", n_layers=4, hidden=64, n_heads=4, n_kv_heads=4, ffn_hidden=128,
                      vocab_size=256, max_seq_len=256)
    cl = ClusterSpec(load_hardware("h100-sxm"), 4, 8)
    plan = ParallelPlan(dp=2, tp=2, sp=True, micro_batch=1, global_batch=4, seq_len=64,
                        dtype="bf16")
    a, b = S.step_time(dense, plan, cl), S.step_time(dense, plan, cl, expert_tp=True)
    assert a == b
    t = S._tp_collectives(dense, plan, cl, 64, False, True)
    f, bk = t.n_f, t.n_b
    assert (f, bk) == (2, 2)


def test_zero3_gathers_a_split_block():
    # ZeRO-3 keeps a gathered block (16-bit) and its fp32 gradient unit beside the shards:
    # (2 x 2 + 4) bytes a block element; split over tp 2 a block holds 98304 / 2 / 2 fewer
    # expert elements (dp 4 = ep 2 x 2): 8 x 24576 bytes less
    plan = ParallelPlan(dp=4, tp=2, ep=2, zero=3, global_batch=8, seq_len=64, dtype="bf16")
    whole = M.buffer_bytes(MOE_MODEL, plan, convention="zero")
    split = M.buffer_bytes(MOE_MODEL, plan, convention="zero", expert_tp=True)
    assert whole - split == 8 * (98304 // 2 - 98304 // 4) == 196608
    # and memory() hands the split on
    a = M.memory(MOE_MODEL, plan, convention="zero")
    b = M.memory(MOE_MODEL, plan, convention="zero", expert_tp=True)
    assert a.buffers - b.buffers == 196608


"""Tests that bite mutants of ptd.cost.params (mutation sample seed 20261127).

Every expected value is worked out by hand in the comments, from the tensor shapes the
runtime registers (module docstring of ptd.cost.params) and torch.chunk's split rule.
"""

from __future__ import annotations

from ptd.cost import params as P
from ptd.specs.model import ModelSpec


def _dense(**kw) -> ModelSpec:
    base = dict(name="t", n_layers=4, hidden=64, n_heads=4, n_kv_heads=4, ffn_hidden=128,
                vocab_size=1000, max_seq_len=128)
    base.update(kw)
    return ModelSpec(**base)


# ------------------------------------------------------------------ Param.local_shape
def test_local_shape_pads_vocab_then_splits_1d():
    p = P.Param("tok_embeddings.weight", (1000, 64), 0, False, 128)
    # tp=2: pad to a multiple of 128*2=256: ceil(1000/256)=4 -> 1024; 1024/2 = 512 rows
    assert p.local_shape(2) == (512, 64)
    # tp=1: multiple of 128: ceil(1000/128)=8 -> 1024 rows, no split
    assert p.local_shape(1) == (1024, 64)


def test_local_shape_column_row_and_replicated_1d():
    assert P.Param("w", (64, 256), 1, True).local_shape(4) == (64, 64)   # 256/4
    assert P.Param("w", (256, 64), 0, True).local_shape(4) == (64, 64)   # 256/4
    assert P.Param("n", (64,), None, False).local_shape(4) == (64,)      # replicated


def test_local_shape_2d_mode():
    # tp=4 -> q=isqrt(4)=2
    tok = P.Param("tok_embeddings.weight", (1000, 64), 0, False, 128)
    # pad per mesh side: multiple of 128*2=256 -> 1024; blocks 1024/2 x 64/2
    assert tok.local_shape(4, "2d") == (512, 32)
    # vectors split over q on the last dim: 64/2
    assert P.Param("n", (64,), None, False).local_shape(4, "2d") == (32,)
    # the learned position table: hidden (last dim) split over q, rows kept
    assert P.Param("pos_embeddings.weight", (128, 64), None, False).local_shape(4, "2d") == (128, 32)
    # a matrix: q x q blocks (tp_dim ignored in 2d)
    assert P.Param("w", (256, 64), 0, True).local_shape(4, "2d") == (128, 32)
    assert P.Param("w", (64, 256), 1, True).local_shape(4, "2d") == (32, 128)


# ------------------------------------------------------------------ tensors of a block
def test_layer_params_layernorm_bias_gelu_gqa():
    m = _dense(n_kv_heads=2, mlp="gelu", norm="layernorm", bias=True)
    # head_dim 64/4 = 16: q_dim 4*16 = 64, kv_dim 2*16 = 32
    got = [(p.name, p.shape, p.tp_dim, p.decay) for p in P.layer_params(m)]
    assert got == [
        ("attention_norm.weight", (64,), None, False),
        ("attention_norm.bias", (64,), None, False),
        ("attention.wq.weight", (64, 64), 0, True),
        ("attention.wk.weight", (32, 64), 0, True),
        ("attention.wv.weight", (32, 64), 0, True),
        ("attention.wo.weight", (64, 64), 1, True),
        ("attention.wq.bias", (64,), 0, False),
        ("attention.wk.bias", (32,), 0, False),
        ("attention.wv.bias", (32,), 0, False),
        ("attention.wo.bias", (64,), None, False),
        ("ffn_norm.weight", (64,), None, False),
        ("ffn_norm.bias", (64,), None, False),
        ("feed_forward.w1.weight", (128, 64), 0, True),
        ("feed_forward.w2.weight", (64, 128), 1, True),
        ("feed_forward.w1.bias", (128,), 0, False),
        ("feed_forward.w2.bias", (64,), None, False),
    ]


def test_layer_params_rmsnorm_swiglu_no_bias():
    m = _dense()
    got = [(p.name, p.shape, p.tp_dim, p.decay) for p in P.layer_params(m)]
    assert got == [
        ("attention_norm.weight", (64,), None, False),
        ("attention.wq.weight", (64, 64), 0, True),
        ("attention.wk.weight", (64, 64), 0, True),
        ("attention.wv.weight", (64, 64), 0, True),
        ("attention.wo.weight", (64, 64), 1, True),
        ("ffn_norm.weight", (64,), None, False),
        ("feed_forward.w1.weight", (128, 64), 0, True),
        ("feed_forward.w3.weight", (128, 64), 0, True),
        ("feed_forward.w2.weight", (64, 128), 1, True),
    ]


def test_moe_params_shapes():
    m = _dense(n_experts=4, top_k=2, n_shared_experts=1, bias=True)
    got = [(p.name, p.shape, p.tp_dim, p.decay) for p in P._moe_params(m)]
    assert got == [
        ("feed_forward.router.weight", (4, 64), None, True),
        ("feed_forward.experts.w1", (4, 64, 128), None, True),
        ("feed_forward.experts.w2", (4, 128, 64), None, True),
        ("feed_forward.experts.w3", (4, 64, 128), None, True),
        ("feed_forward.experts.w1_bias", (4, 128), None, False),
        ("feed_forward.experts.w2_bias", (4, 64), None, False),
        ("feed_forward.experts.w3_bias", (4, 128), None, False),
        ("feed_forward.shared.0.w1.weight", (128, 64), 0, True),
        ("feed_forward.shared.0.w3.weight", (128, 64), 0, True),
        ("feed_forward.shared.0.w2.weight", (64, 128), 1, True),
        ("feed_forward.shared.0.w1.bias", (128,), 0, False),
        ("feed_forward.shared.0.w3.bias", (128,), 0, False),
        ("feed_forward.shared.0.w2.bias", (64,), None, False),
    ]
    assert P.is_routed_expert(P.Param("feed_forward.experts.w1", (4, 64, 128), None, True))
    assert not P.is_routed_expert(P.Param("feed_forward.router.weight", (4, 64), None, True))


def test_stage_params():
    m = _dense(position="learned", norm="layernorm")
    first = [(p.name, p.shape, p.pad) for p in P.first_stage_params(m)]
    assert first == [("tok_embeddings.weight", (1000, 64), 128),
                     ("pos_embeddings.weight", (128, 64), 0)]
    last = [(p.name, p.shape, p.tp_dim, p.decay) for p in P.last_stage_params(m, True)]
    assert last == [("norm.weight", (64,), None, False), ("norm.bias", (64,), None, False),
                    ("output.weight", (1000, 64), 0, True)]
    assert [p.name for p in P.last_stage_params(m, False)] == ["norm.weight", "norm.bias"]


# ------------------------------------------------------------------ numels
def test_block_numel_tp1_tp2():
    m = _dense()
    # tp=1: norms 64+64, wq/wk/wv/wo 4*64*64 = 16384, w1/w3/w2 3*128*64 = 24576
    assert P.block_numel(m, 1) == 128 + 16384 + 24576  # 41088
    # tp=2: norms 128, wq/wk/wv 3*32*64 = 6144, wo 64*32 = 2048, mlp 3*64*64 = 12288
    assert P.block_numel(m, 2) == 128 + 6144 + 2048 + 12288  # 20608


def test_zero12_unit_blocks():
    m = _dense()
    # 25 MiB = 26214400 bytes; one block 41088 fp32 = 164352 bytes;
    # 164352*159 = 26131968 < 26214400 <= 164352*160 -> ceil = 160
    assert P.zero12_unit_blocks(m, 1) == 160
    # a block over 25 MiB -> at least 1: hidden 4096, ffn 16384: 4*4096^2 + 3*16384*4096 >> 6.5M
    big = _dense(hidden=4096, n_heads=32, n_kv_heads=32, ffn_hidden=16384)
    assert P.zero12_unit_blocks(big, 1) == 1


def test_local_numel_tied_single_stage_vs_untied():
    from ptd.specs.plan import ParallelPlan
    tied = _dense(tied_embeddings=True)
    untied = _dense(tied_embeddings=False)
    plan = ParallelPlan()
    # one rank: 4 blocks * 41088 + tok (1024 padded rows * 64 = 65536) + norm 64,
    # + output (65536) only when untied
    assert P.local_numel(tied, plan, 0) == 4 * 41088 + 65536 + 64
    assert P.local_numel(untied, plan, 0) == 4 * 41088 + 65536 + 64 + 65536
    names = [p.name for p in P.rank_params(tied, plan, 0)]
    assert "output.weight" not in names and names.count("attention.wq.weight") == 4


# ------------------------------------------------------------------ pipeline ends
def test_ends_of():
    # v-shape, 4 ranks, 8 stages: last stage 7 -> 2*4-1-7 = 0
    assert P.ends_of((4, 8, True, 128, False)) == (0, 0)
    # v-shape with one stage per rank: last stage 3 < 4 -> rank 3
    assert P.ends_of((4, 4, True, 128, False)) == (0, 3)
    # interleaved: stage 7 on rank 7 % 4 = 3; 6 stages on 4 ranks: 5 % 4 = 1
    assert P.ends_of((4, 8, False, 128, False)) == (0, 3)
    assert P.ends_of((4, 6, False, 128, False)) == (0, 1)


# ------------------------------------------------------------------ ZeRO sharding
def test_fsdp_numel_torch_chunk_rule():
    # dim 0 of 10 over 4: chunk ceil(10/4)=3 -> rows 3,3,3,1; x3 columns
    assert [P.fsdp_numel([(10, 3)], 4, r) for r in range(4)] == [9, 9, 9, 3]
    # dim 0 of 2 over 4: chunk 1 -> rows 1,1,0,0 (never negative); x5
    assert [P.fsdp_numel([(2, 5)], 4, r) for r in range(4)] == [5, 5, 0, 0]
    # a vector of 7 over 2: chunk 4 -> 4, 3; and sums over tensors
    assert [P.fsdp_numel([(7,), (10, 3)], 2, r) for r in range(2)] == [4 + 15, 3 + 15]


def test_expert_shard_dim():
    assert P.expert_shard_dim((8, 6, 4), 2, 2) == 0   # 8/2 = 4 experts, 4 % 2 == 0
    assert P.expert_shard_dim((6, 4, 4), 2, 2) == 1   # 3 experts odd over 2; dim1 4 % 2 == 0
    assert P.expert_shard_dim((6, 3, 4), 2, 2) == 0   # 3 odd and dim1 3 odd -> experts
    assert P.expert_shard_dim((3,), 1, 2) == 0        # one dimension only


# ------------------------------------------------------------------ survivors of the sample
def test_block_fsdp_numel_experts_over_edp():
    router = P.Param("feed_forward.router.weight", (6, 4), None, True)
    by_dim1 = P.Param("feed_forward.experts.w1", (6, 4, 5), None, True)
    by_experts = P.Param("feed_forward.experts.w2", (4, 6, 5), None, True)
    # dp 4, ep 2 -> edp 2. router over dp: chunk ceil(6/4) = 2 rows of 4 -> 8 on rank 1.
    # (6,4,5): 3 local experts, odd over edp 2, dim 1 = 4 even -> 3*4*5/2 = 30.
    assert P._block_fsdp_numel((router, by_dim1), 1, 4, 2, 1) == 8 + 30
    # (4,6,5): local (2,6,5), 2 experts over edp 2 -> one expert, 30, on edp index 3//2 = 1
    assert P._block_fsdp_numel((by_experts,), 1, 4, 2, 3) == 30
    assert P._block_fsdp_numel((by_experts,), 1, 4, 2, 0) == 30


def test_v_shape_last_rank_holds_no_output():
    from ptd.specs.stages import stage_split
    m = _dense(n_layers=8)
    key = (2, 4, True, 128, False)  # V: stages 0,1,2,3 on ranks 0,1,1,0; last stage on rank 0
    split = stage_split(m, 4, 128, False)
    per_rank = P._local_numels(m, key, 1)
    # block 41088 (test_block_numel_tp1_tp2); tok 1024*64 = 65536; norm 64; output 65536
    assert per_rank[1] == 41088 * (split[1] + split[2])
    assert per_rank[0] == 41088 * (split[0] + split[3]) + 65536 + 64 + 65536


def test_tied_output_is_separate_on_another_stage():
    from ptd.specs.plan import ParallelPlan
    m = _dense(tied_embeddings=True)
    plan = ParallelPlan(pp=2)
    assert "output.weight" in [p.name for p in P.rank_params(m, plan, 1)]
    assert "output.weight" not in [p.name for p in P.rank_params(m, plan, 0)]


def test_heaviest_rank_candidates_include_a_middle_rank():
    from ptd.specs.plan import ParallelPlan
    m = _dense(n_layers=8)
    got = P.heaviest_rank_candidates(m, ParallelPlan(pp=4))
    # first 0, last 3, and one of the middle ranks 1, 2
    assert len(got) == 3 and got[0] == 0 and got[2] == 3 and got[1] in (1, 2)


def test_layout_plan_schedule():
    assert P.layout_plan((2, 2, False, 128, False)).schedule == "1f1b"
    assert P.layout_plan((2, 4, False, 128, False)).schedule == "interleaved-1f1b"

"""cost/memory.py by hand: written from the survivors of a sampled mutation run (issue 21).

Every expected value is worked out in the comment beside it from the module's stated
formulas (Korthikanti et al. 2022 for activations, ZeRO's 2/2/12 and ptd's 4/4/8 bytes per
parameter, the pipeline schedules' micro-batches in flight), on models small enough to count
by hand. Nothing here calls the code under test for an expected value."""

import pytest

from ptd.cost import memory as M
from ptd.specs import ParallelPlan, get_preset
from ptd.specs.model import ModelSpec


def tiny_gpt(**over) -> ModelSpec:
    """GPT block: GELU MLP, LayerNorm, learned positions, biases, untied. h 8, 2 heads of 4
    (q = kv = 8), F 32, V 128 (a multiple of 128: no padding rows), 16 positions, 2 layers.

    Parameters: a block holds LayerNorm w+b 16, wq wk wv wo 4 x 8 x 8 = 256, their biases
    8 + 8 + 8 + 8 = 32, LayerNorm 16, w1 32 x 8 = 256, w2 8 x 32 = 256, biases 32 + 8 = 40:
    872. Embedding 128 x 8 = 1024, positions 16 x 8 = 128, final norm 16, output 1024.
    Psi = 2 x 872 + 1024 + 128 + 16 + 1024 = 3936. Every dim 0 is even."""
    kw = dict(name="tiny-gpt", n_layers=2, hidden=8, n_heads=2, n_kv_heads=2, ffn_hidden=32,
              vocab_size=128, max_seq_len=16, mlp="gelu", norm="layernorm", position="learned",
              bias=True)
    kw.update(over)
    return ModelSpec(**kw)


def tiny_llama(**over) -> ModelSpec:
    """SwiGLU, RMSNorm, RoPE, no biases. h 8, 2 query heads and 1 key/value head of 4
    (q 8, kv 4), F 16, V 128, 16 positions, 2 layers."""
    kw = dict(name="tiny-llama", n_layers=2, hidden=8, n_heads=2, n_kv_heads=1, ffn_hidden=16,
              vocab_size=128, max_seq_len=16, mlp="swiglu", norm="rmsnorm", position="rope")
    kw.update(over)
    return ModelSpec(**kw)


def tiny_moe(**over) -> ModelSpec:
    """:func:`tiny_llama` with 2 key/value heads (q = kv = 8) and a MoE MLP: 4 SwiGLU experts
    of F 16, top 2, no shared experts.

    A block: RMSNorm 8, wq wk wv wo 4 x 64 = 256, RMSNorm 8, router 4 x 8 = 32, routed
    experts w1 w3 (4, 8, 16) and w2 (4, 16, 8): 3 x 512 = 1536. Block 1840; without its
    routed experts 304."""
    kw = dict(n_kv_heads=2, n_experts=4, top_k=2)
    kw.update(over)
    return tiny_llama(**kw)


# --------------------------------------------------------------- the breakdown
def test_breakdown_totals_fit_and_largest_part():
    b = M.MemoryBreakdown(params=1, grads=2, optimizer=3, activations=4, buffers=5, capacity=15)
    assert b.model_states == 6  # 1 + 2 + 3
    assert b.total == 15        # 1 + 2 + 3 + 4 + 5
    assert b.fits               # 15 <= 15: a plan that fills the device exactly fits
    assert not M.MemoryBreakdown(1, 2, 3, 4, 5, capacity=14).fits
    assert M.MemoryBreakdown(1, 2, 3, 4, 5).fits  # capacity 0: unknown, always fits
    assert b.largest == "buffers"
    assert M.MemoryBreakdown(9, 2, 3, 4, 5).largest == "params"
    assert M.MemoryBreakdown(1, 2, 3, 7, 5).largest == "activations"
    assert b.to_dict() == {"params": 1, "grads": 2, "optimizer": 3, "activations": 4,
                           "buffers": 5, "total": 15}


# ------------------------------------------------------------ model states
def test_zero_paper_model_states_by_hand():
    # Psi 1000 over Nd 4, K 12: stage 0 (2 + 2 + 12) Psi = 16000; stage 1 4 Psi + K Psi / Nd
    # = 4000 + 3000; stage 2 2 Psi + (2 + K) Psi / Nd = 2000 + 3500; stage 3 16 Psi / 4 = 4000
    assert [M.zero_paper_model_states(1000, 4, s) for s in range(4)] == [16000, 7000, 5500, 4000]
    # K 4 at stage 1: 4000 + 4 x 1000 / 4 = 5000
    assert M.zero_paper_model_states(1000, 4, 1, k=4) == 5000


def test_bytes_per_parameter_of_each_convention():
    assert M.state_bytes_per_param("bf16", "zero") == (2, 2, 12)
    assert M.state_bytes_per_param("fp16", "zero") == (2, 2, 12)
    assert M.state_bytes_per_param("fp32", "zero") == (4, 4, 8)
    assert M.state_bytes_per_param("bf16") == (4, 4, 8)  # ptd: fp32 whatever the compute dtype


@pytest.mark.parametrize("zero,zero_conv,ptd_conv", [
    # Psi 3936 (tiny_gpt), dp 2: each rank's shard 1968 (every dim 0 even).
    # "zero" in bf16, 2/2/12 bytes: stage 0 all full: 7872, 7872, 3936 x 12 = 47232;
    # stage 1 (P_os) 16-bit parameters and gradients full, K over dp: 7872, 7872, 1968 x 12;
    # stage 2 (P_os+g) gradients over dp too: 1968 x 2 = 3936; stage 3 everything over dp.
    # "ptd" 4/4/8: stage 0 all full, 15744, 15744, 31488; stages 1-3 the fp32 shards
    # 1968 x 4 = 7872, 7872, 1968 x 8 = 15744.
    (0, (7872, 7872, 47232), (15744, 15744, 31488)),
    (1, (7872, 7872, 23616), (7872, 7872, 15744)),
    (2, (7872, 3936, 23616), (7872, 7872, 15744)),
    (3, (3936, 3936, 23616), (7872, 7872, 15744)),
])
def test_model_states_of_each_stage_and_convention(zero, zero_conv, ptd_conv):
    m = tiny_gpt()
    plan = ParallelPlan(dp=2, zero=zero, global_batch=2, seq_len=16, dtype="bf16")
    assert M.model_state_bytes(m, plan, "zero") == zero_conv
    assert M.model_state_bytes(m, plan) == ptd_conv
    # the given rank (dp rank 1 holds the other halves: the same counts here)
    assert M.model_state_bytes(m, plan, "zero", pp_rank=0, dp_rank=1) == zero_conv


def test_most_loaded_pipeline_rank_by_hand():
    # pp 2, one block a rank: rank 0 the embeddings 1024 + positions 128 + a block 872 = 2024,
    # rank 1 a block + final norm 16 + output 1024 = 1912. fp32, no ZeRO, ptd: 4/4/8 bytes.
    m = tiny_gpt()
    plan = ParallelPlan(pp=2, global_batch=2, seq_len=16)
    assert M.model_state_bytes(m, plan) == (4 * 2024, 4 * 2024, 8 * 2024)
    assert M.model_state_bytes(m, plan, pp_rank=1, dp_rank=0) == (4 * 1912, 4 * 1912, 8 * 1912)
    # without the position table (RoPE) the last rank is the heavier: rank 0 1024 + 872 =
    # 1896, rank 1 872 + 16 + 1024 = 1912 (the final norm)
    rope = tiny_gpt(position="rope")
    assert M.model_state_bytes(rope, plan) == (4 * 1912, 4 * 1912, 8 * 1912)


# --------------------------------------------------------------- activations
def test_korthikanti_per_layer_formula_on_a_small_gpt():
    # Korthikanti et al. 2022 sec. 4 (16-bit, dropout, stored scores, F = 4h, LayerNorm):
    # s b h (34 + 5 a s / h). s 16, b 2, h 8, a 2: sbh = 256, 5 a s / h = 5 x 2 x 16 / 8 = 20,
    # 256 x 54 = 13824.
    m = tiny_gpt(dropout=0.1)
    per = lambda **kw: M.activation_bytes_per_layer(m, 16, 2, attention="scores", **kw)  # noqa: E731
    assert per() == 13824
    # tp 2: sbh (10 + 24 / t + 5 a s / (h t)) = 256 (10 + 12 + 10) = 8192
    assert per(tp=2) == 8192
    # and sequence parallel: sbh / t (34 + 5 a s / h) = 13824 / 2 = 6912
    assert per(tp=2, sp=True) == 6912
    # selective recompute drops the s x s terms: 34 sbh / t = 34 x 256 / 2 = 4352
    assert per(tp=2, sp=True, recompute="selective") == 4352
    # full recompute keeps the block's input: 2 sbh = 512, / t with sp = 256
    assert per(recompute="full") == 512
    assert per(tp=2, sp=True, recompute="full") == 256


def test_flash_fp32_block_and_the_whole_model_by_hand():
    # tiny_gpt, fp32 (a_b 4), flash attention, no dropout, s 16, b 1: sbh 128.
    # norms 2 x 4 x 128 = 1024, QKV and MLP inputs 2 x 4 x 128 = 1024, Q K V 4 x 16 x 24 = 1536,
    # attention-out input 4 x 16 x 8 = 512, GELU 2 x 4 x 16 x 32 = 4096, log-sum-exp
    # 4 x 2 x 16 = 128: 8320.
    m = tiny_gpt()
    assert M.activation_bytes_per_layer(m, 16, 1, act_bytes=4) == 8320
    # output: norm input and output-layer input (4 + 4) x 128 = 1024 and fp32 log-probs
    # 4 x 16 x 128 = 8192: 9216; the loss's transient 2 x 4 x 16 x 128 = 16384
    assert M.output_activation_bytes(m, 16, 1, act_bytes=4) == 9216
    assert M.output_transient_bytes(m, 16, 1) == 16384
    # pp 1, m 4: one micro-batch in flight whatever the schedule (gpipe's is ignored at
    # pp 1): 2 x 8320 + 9216 + 16384 = 42240
    for sched in ("1f1b", "gpipe"):
        plan = ParallelPlan(global_batch=4, seq_len=16, schedule=sched)
        assert M.activation_bytes(m, plan) == 42240
    # context parallelism divides the activations: 42240 / 2
    cp = M.memory(m, ParallelPlan(cp=2, global_batch=4, seq_len=16))
    assert cp.activations == 21120


def test_pipeline_schedules_hold_micro_batches_by_hand():
    m = tiny_gpt()  # per layer 8320, output 9216 + 16384 (above); one block a rank
    gpipe = ParallelPlan(pp=2, global_batch=4, seq_len=16, schedule="gpipe")
    # GPipe keeps all 4 micro-batches: rank 0 4 x 8320 = 33280; rank 1 4 x 8320 + 4 x 9216
    # + 16384 = 86528 (the last stage's outputs too)
    assert M.activation_bytes(m, gpipe, pp_rank=0) == 33280
    assert M.activation_bytes(m, gpipe) == 86528
    # 1F1B: rank 0 holds p - 0 = 2: 16640; rank 1 one: 8320 + 9216 + 16384 = 33920
    f1b = gpipe.replace(schedule="1f1b")
    assert M.activation_bytes(m, f1b, pp_rank=0) == 16640
    assert M.activation_bytes(m, f1b) == 33920


def test_interleaved_in_flight_capped_by_the_micro_batches():
    # p 4, v 2, m 4: chunk-micro-batches min(m v, 2 (p - r - 1) + (v - 1) p + 1) / v:
    # r 0: min(8, 6 + 4 + 1) / 2 = 4; r 1: min(8, 4 + 5) / 2 = 4; r 2: min(8, 7) / 2 = 3.5;
    # r 3: min(8, 5) / 2 = 2.5
    plan = ParallelPlan(pp=4, vpp=2, schedule="interleaved-1f1b", global_batch=4, seq_len=16)
    assert [M.in_flight(plan, r) for r in range(4)] == [4.0, 4.0, 3.5, 2.5]
    # zero-bubble's V (two chunks a rank): min(m, p) = 4 on every rank
    zb = plan.replace(schedule="zero-bubble", vpp=1)
    assert [M.in_flight(zb, r) for r in range(4)] == [4.0] * 4
    # no pipeline: one
    assert M.in_flight(ParallelPlan(global_batch=4, seq_len=16, schedule="gpipe"), 0) == 1.0


def test_autocast_and_composite_norms_on_a_small_llama():
    # tiny_llama in bf16 (a_b 2), flash, no dropout, s 16, b 1: sbh 128, q 8, kv 4, F 16.
    m = tiny_llama()
    per = lambda **kw: M.activation_bytes_per_layer(m, 16, 1, act_bytes=2, **kw)  # noqa: E731
    # plain: norms 2 x 2 x 128 = 512, inputs 2 x 2 x 128 = 512, Q K V 2 x 16 x 16 = 512,
    # attention-out 2 x 16 x 8 = 256, SwiGLU 4 x 2 x 16 x 16 = 2048, lse 4 x 2 x 16 = 128: 3968
    assert per() == 3968
    # autocast: the norms fp32, 2 x 4 x 128 = 1024; a cast input per linear layer, q k v and
    # gate up: 5 x 2 x 128 = 1280; the rest as above: 1024 + 1280 + 512 + 256 + 2048 + 128
    assert per(autocast=True) == 5248
    # composite RMSNorm keeps x * rstd of both norms, fp32 under autocast: + 2 x 4 x 128
    assert per(autocast=True, fused_norm=False) == 6272
    # ... and in bf16 without autocast too: the composite runs in fp32 and keeps the fp32
    # upcast of each norm's input in place of the bf16 input (+ 2 x (4 - 2) x 128) and
    # x * rstd in fp32 (+ 2 x 4 x 128): 3968 + 512 + 1024
    assert per(fused_norm=False) == 5504
    # K and V at query width: Q K V 2 x 16 x 24 = 768, 256 more
    assert per(gqa_expanded=True) == 4224
    # in fp32 autocast changes nothing (no cast): 4 x 128 norms ... = the fp32 block:
    # norms 1024, inputs 1024, QKV 1024, out 512, SwiGLU 4096, lse 128 = 7808
    assert M.activation_bytes_per_layer(m, 16, 1, act_bytes=4, autocast=True) == 7808
    # full recompute keeps the block's input, fp32 under autocast: 4 x 128
    assert per(recompute="full", autocast=True) == 512
    # the output: a composite RMSNorm keeps two fp32 norm tensors plus the bf16 output-layer
    # input, (2 x 4 + 2) x 128 = 1280, and 4 x 16 x 128 = 8192 log-probs
    assert M.output_activation_bytes(m, 16, 1, act_bytes=2, fused_norm=False,
                                     autocast=True) == 9472


def test_moe_activations_by_hand():
    # tiny_moe, bf16: per assignment (3 h + 4 F + 1) a_b + 3 x 8 + 4 = (24 + 64 + 1) x 2 + 28
    # = 206; per token 2 x 206 + 8 E + 4 = 412 + 32 + 4 = 448
    m = tiny_moe()
    assert M.moe_bytes_per_token(m, 2) == 448
    # GELU experts: (24 + 32 + 1) x 2 + 28 = 142 an assignment, 2 x 142 + 36 = 320
    assert M.moe_bytes_per_token(tiny_moe(mlp="gelu", norm="layernorm"), 2) == 320
    # the block, s 16, b 1, sbh 128: norms 512, inputs 512, Q K V 2 x 16 x 24 = 768, out 256,
    # no shared experts (F x 0), lse 128; the MoE layer 16 x 448 + 4 x 4 x (1 + 3) = 7232
    assert M.activation_bytes_per_layer(m, 16, 1) == 9408
    # one shared expert adds a SwiGLU MLP: 4 x 2 x 16 x 16 = 2048; its per-token bytes stay
    assert M.activation_bytes_per_layer(tiny_moe(n_shared_experts=1), 16, 1) == 11456


def test_embedding_dropout_mask_under_sequence_parallelism():
    # With dropout the first stage keeps the embedding's mask a_b s b h: a sequence shard
    # under sp, but whole with learned positions (kept whole over tp until block 0). Two
    # models that differ only in the position table differ by a_b s b h / t under sp
    # (fp32, s 16, b 1, h 8, t 2: 4 x 128 / 2 = 256) and by nothing without sp.
    learned = tiny_gpt(dropout=0.1)
    rope = tiny_gpt(dropout=0.1, position="rope")
    sp = ParallelPlan(tp=2, sp=True, global_batch=1, seq_len=16)
    assert M.activation_bytes(learned, sp) - M.activation_bytes(rope, sp) == 256
    no_sp = sp.replace(sp=False)
    assert M.activation_bytes(learned, no_sp) == M.activation_bytes(rope, no_sp)
    # and pp 1, tp 1: 2 blocks of 8320 + 2 x 128 masks = 8576, output 9216 + 16384, the
    # embedding's mask 4 x 128 = 512: 17152 + 25600 + 512 = 43264
    assert M.activation_bytes(learned, ParallelPlan(global_batch=1, seq_len=16)) == 43264


# ------------------------------------------------------------------ buffers
def test_buffers_by_stage_and_convention_on_a_small_gpt():
    m = tiny_gpt()  # Psi 3936, a block 872; the tiny blocks make one FSDP unit of everything
    plan = ParallelPlan(dp=2, global_batch=2, seq_len=16, dtype="bf16")
    # DDP in bf16: the compute copies 2 x 3936; none under "zero" (they are the parameters);
    # none in fp32
    assert M.buffer_bytes(m, plan) == 7872
    assert M.buffer_bytes(m, plan, convention="zero") == 0
    assert M.buffer_bytes(m, plan.replace(dtype="fp32")) == 0
    # ZeRO-3: two gathered bf16 blocks and one block's fp32 gradient, 872 x (2 x 2 + 4) = 6976
    assert M.buffer_bytes(m, plan.replace(zero=3)) == 6976
    # a pipeline adds a send and a receive buffer per neighbour: 4 x 2 x 16 x 1 x 8 = 1024
    # (and under sp a sequence shard: 4 x 2 x 16 x 8 / 2 = 512)
    pp = ParallelPlan(pp=2, global_batch=2, seq_len=16, dtype="fp32")
    assert M.buffer_bytes(m, pp) == 4 * 4 * 16 * 8  # fp32: 2048, nothing else
    assert M.buffer_bytes(m, pp.replace(dtype="bf16", tp=2, sp=True, zero=3)) == (
        # a block at tp 2: norms w+b 32 whole, wq wk wv 3 x 32 and biases 3 x 4 split,
        # wo 32 split, its bias 8 whole, w1 w2 2 x 128 split, w1's bias 16 split, w2's 8
        # whole: 32 + 96 + 12 + 32 + 8 + 256 + 16 + 8 = 460; x (4 + 4) = 3680; + 512
        460 * 8 + 512)


def _wide_gpt() -> ModelSpec:
    """h 1024, 8 heads, F 4096, V 128, 16 positions, 2 GELU layers with biases. A block:
    4 h^2 + 4 h = 4198400 attention, 2 h F + F + h = 8393728 MLP, 4 h = 4096 norms:
    12596224, 50.4 MB of fp32, past the 25 MiB that closes an FSDP unit, so a unit a block.
    Embedding and output 131072 each, positions 16384, final norm 2048: the root's unit
    280576. Psi = 2 x 12596224 + 280576 = 25473024."""
    return tiny_gpt(hidden=1024, n_heads=8, n_kv_heads=8, ffn_hidden=4096)


def test_zero12_buffers_gather_everything_and_reduce_by_unit():
    m = _wide_gpt()
    psi, block = 25_473_024, 12_596_224
    plan = ParallelPlan(dp=2, zero=2, global_batch=2, seq_len=16, dtype="bf16")
    assert M.zero12_largest_unit(m, plan) == block  # max(a block, the root's 280576)
    # ptd: every parameter gathered in bf16, one unit's fp32 gradient before reduce-scatter
    assert M.buffer_bytes(m, plan) == 2 * psi + 4 * block
    # "zero": the gathered parameters are the model states' already; the unit's gradient stays
    assert M.buffer_bytes(m, plan, convention="zero") == 4 * block
    # ZeRO-1 with 2 micro-batches defers the reduction: every fp32 gradient unsharded
    acc = plan.replace(zero=1, global_batch=4)
    assert M.zero12_full_grads(acc) and not M.zero12_full_grads(plan)
    assert not M.zero12_full_grads(plan.replace(zero=1))  # one micro-batch: no deferral
    assert M.zero12_full_grads(plan.replace(pp=2))        # a pipeline defers it at any stage
    assert M.buffer_bytes(m, acc) == 2 * psi + 4 * psi
    # ... which "zero" files under ZeRO-1's full gradients: no buffer at all
    assert M.buffer_bytes(m, acc, convention="zero") == 0
    # with the blocks too small for a unit each, the root (everything) is the largest unit
    assert M.zero12_largest_unit(tiny_gpt(), plan) == 3936


def test_zero12_largest_unit_counts_the_experts_apart_under_ep():
    # tiny_moe under ep 2: a block's dense part 304 (a unit of blocks: both fit in one
    # 25 MiB unit, k > 2 blocks, so the blocks' unit is empty and they join the root), each
    # layer's experts 1536 / 2 = 768 a unit of their own. The rank: 2 x (304 + 768) + the
    # embedding 1024 + final norm 8 + output 1024 = 4200; the root 4200 - 2 x 768 = 2664.
    m = tiny_moe()
    plan = ParallelPlan(dp=2, ep=2, zero=2, global_batch=2, seq_len=16)
    assert M.zero12_largest_unit(m, plan) == 2664
    # without ep the experts stay in their blocks: everything is the root, 2 x 1840 + 2056
    assert M.zero12_largest_unit(m, plan.replace(ep=1)) == 5736
    # 16 experts of F 64 make the experts' unit the largest: a layer's 16 x 3 x 8 x 64 =
    # 24576 over ep 2 = 12288; the root: 2 x (8 + 256 + 8 + 16 x 8) + 2056 = 2856
    big = tiny_moe(n_experts=16, ffn_hidden=64)
    assert M.zero12_largest_unit(big, plan) == 12288


def test_memory_offload_and_capacity():
    m = tiny_gpt()
    plan = ParallelPlan(dp=2, zero=3, global_batch=2, seq_len=16, dtype="bf16")
    on = M.memory(m, plan, capacity=1e9)
    assert (on.params, on.grads, on.optimizer) == (7872, 7872, 15744)  # ptd, stage 3
    assert on.buffers == 6976 and on.capacity == 1e9 and on.fits
    # bf16 blocks, s 16, b 1 (2 samples over dp 2), sbh 128: norms 2 x 2 x 128 = 512, inputs
    # 512, Q K V 2 x 16 x 24 = 768, out 256, GELU 2 x 2 x 16 x 32 = 2048, lse 128: 4224 each;
    # output (2 + 2) x 128 + 4 x 16 x 128 = 8704, loss 16384: 2 x 4224 + 8704 + 16384 = 33536
    assert on.activations == 33536
    off = M.memory(m, plan.replace(offload=True))
    # CPU offload: no model states on the device; buffers and activations as before
    assert (off.params, off.grads, off.optimizer) == (0, 0, 0)
    assert off.buffers == 6976 and off.activations == on.activations
    assert not M.memory(m, plan, capacity=7872).fits


def test_autocast_weight_copies_by_hand():
    from ptd.cost.memory import autocast_weight_copies
    from ptd.summary.compare import predicted_rank_memory
    from ptd.cost.memory import activation_bytes
    plan = ParallelPlan(dtype="bf16", global_batch=8, seq_len=64, micro_batch=8)
    # tiny (h 64, 8 heads of 8, 4 kv heads, F 128, SwiGLU, vocabulary 256, untied): per block
    # wq 64x64, wk and wv 64x32, wo 64x64, w1 w3 64x128, w2 128x64 = 36864; four blocks and
    # the output layer 256x64; not the token embedding (a lookup) nor the norms (vectors)
    assert autocast_weight_copies(get_preset("tiny"), plan, 0) == 4 * 36864 + 256 * 64
    # tiny-moe with ep 2: per block 12288 of attention, the router 8x64, and half of the
    # 8 experts' three 64x64 matrices
    moe = ParallelPlan(dtype="bf16", dp=2, ep=2, global_batch=8, seq_len=64, micro_batch=4)
    assert autocast_weight_copies(get_preset("tiny-moe"), moe, 0) == \
        4 * (12288 + 512 + 3 * 4 * 64 * 64) + 256 * 64
    # tiny-gpt (tied, learned positions, GELU 64x256 with biases): the output product reads
    # the token embedding on one stage; over two stages the last holds its own copy of it
    gpt = get_preset("tiny-gpt")
    assert autocast_weight_copies(gpt, plan, 0) == 4 * (4 * 64 * 64 + 2 * 64 * 256) + 256 * 64
    pp = ParallelPlan(dtype="bf16", pp=2, global_batch=8, seq_len=64, micro_batch=4)
    assert autocast_weight_copies(gpt, pp, 0) == 2 * (4 * 64 * 64 + 2 * 64 * 256)
    assert autocast_weight_copies(gpt, pp, 1) == 2 * (4 * 64 * 64 + 2 * 64 * 256) + 256 * 64
    # the run's comparison adds them (2 bytes each) under autocast only: not in fp32, not
    # under ZeRO (FSDP casts in its gather)
    tiny = get_preset("tiny")
    act = activation_bytes(tiny, plan, pp_rank=0, fused_norm=True, autocast=True)
    got = predicted_rank_memory(tiny, plan, 0, 0)["activations"]
    assert got == act + 2 * (4 * 36864 + 256 * 64)
    fp32 = plan.replace(dtype="fp32")
    assert predicted_rank_memory(tiny, fp32, 0, 0)["activations"] == activation_bytes(
        tiny, fp32, pp_rank=0, fused_norm=True, autocast=True)
    # under ZeRO no autocast runs at all: the 16-bit stream's count (cost.eager.for_plan)
    zero = plan.replace(dp=2, zero=1, micro_batch=4)
    assert predicted_rank_memory(tiny, zero, 0, 0)["activations"] == activation_bytes(
        tiny, zero, pp_rank=0, fused_norm=True, autocast=False)


def test_pipeline_send_buffers_grow_with_the_micro_batch():
    # pp 2: four activation-sized p2p buffers, s x b x h elements each (sp 1/tp of them):
    # 4 x 2 bytes x 64 x 4 x 64 = 131072 bytes at micro-batch 4, a quarter at 1 (a survivor
    # of the twenty-first session's sample: s // b for s x b held at micro-batch 1)
    dense = ModelSpec(name="d", n_layers=4, hidden=64, n_heads=4, n_kv_heads=4, ffn_hidden=128,
                      vocab_size=256, max_seq_len=256)
    plan = ParallelPlan(dp=1, pp=2, micro_batch=4, global_batch=8, seq_len=64, dtype="bf16")
    one = plan.replace(micro_batch=1, global_batch=2)

    def sends(p):  # what pp adds to the buffers (zero 0, 16-bit states: nothing else differs)
        return (M.buffer_bytes(dense, p, convention="zero")
                - M.buffer_bytes(dense, p.replace(pp=1), convention="zero"))
    d4, d1 = sends(plan), sends(one)
    assert (d4, d1) == (4 * 2 * 64 * 4 * 64, 4 * 2 * 64 * 1 * 64)

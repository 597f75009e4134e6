"""cost/context.py: the K/V bytes, the cp and gradient groups' node spans and the zero terms
without cp, worked by hand (written from the survivors of a mutation run, docs/testing.md).
Torch-free. Placement is (pp, dp, cp, tp) row-major: rank = ((pp dp_n + d) cp_n + c) tp_n + t."""

import dataclasses

import pytest

from ptd.cost import context as CX
from ptd.specs import ClusterSpec, ParallelPlan, load_hardware, load_model

M405 = load_model("llama3.1-405b")  # kv_dim 1024 (8 kv heads of 128)


def test_kv_exchange_bytes_by_hand_with_an_uneven_tp_split():
    p = ParallelPlan(dp=1, tp=3, cp=2, micro_batch=2, seq_len=7, global_batch=2, dtype="fp32")
    # K and V (2) x 4 bytes (fp32) x 2 sequences x 7 tokens x 1024 kv columns / tp 3:
    # 114688 / 3, not a whole number (a floor division would give 38229)
    expected = 2 * 4 * 2 * 7 * 1024 / 3
    assert CX.kv_exchange_bytes(M405, p) == pytest.approx(expected, rel=1e-15, abs=0)
    assert CX.kv_exchange_bytes(M405, p) == pytest.approx(38229.333333333336, rel=1e-15, abs=0)
    # the gathered buffer is that same tensor while cp > 1
    assert CX.kv_buffer_bytes(M405, p) == pytest.approx(expected, rel=1e-15, abs=0)


def test_kv_buffer_is_exactly_zero_without_cp():
    p = ParallelPlan(dp=1, tp=1, cp=1, micro_batch=2, seq_len=8, global_batch=2, dtype="bf16")
    assert CX.kv_buffer_bytes(M405, p) == 0.0


def test_no_cp_terms_without_cp_every_field_zero():
    t = CX.CPTerms()
    assert (t.attn_forward, t.attn_backward, t.comm_total, t.comm_exposed) == (0.0, 0.0, 0.0, 0.0)
    p = ParallelPlan(dp=8, tp=1, cp=1, micro_batch=1, seq_len=8192, global_batch=8, dtype="bf16")
    c = CX.cp_terms(M405, p, ClusterSpec(load_hardware("h100-sxm"), 8, 0), layers=4)
    assert (c.attn_forward, c.attn_backward, c.comm_total, c.comm_exposed) == (0.0, 0.0, 0.0, 0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.comm_total = 1.0  # type: ignore[misc]


def test_cp_group_is_rank_zeros():
    # dp 1, cp 2, tp 2: rank 0's cp group is {0, 2} (cp peers tp = 2 apart); rank 1's would
    # be {1, 3}. On nodes of 3 devices {0, 2} is on node 0 only: (1 node, 2 on it); {1, 3}
    # would span nodes 0 and 1 (2, 1).
    p = ParallelPlan(dp=1, tp=2, cp=2, micro_batch=1, seq_len=8, global_batch=1)
    assert CX.cp_group_split(p, 3) == (1, 2)
    assert CX.cp_group_split(p, 1) == (2, 1)


def test_grad_group_is_rank_zeros_pipeline_and_tensor_index():
    # pp 2, dp 2, cp 2, tp 2 (16 ranks): pipeline stage 0, tensor index 0, all d and c:
    # ((0*2 + d)*2 + c)*2 = 0, 2, 4, 6. On nodes of 7 devices all four are on node 0:
    # (n 4, 1 node, 4 on it). Stage 1's would be 8..14 (nodes 1, 1, 1, 2), tensor index -1's
    # -1, 1, 3, 5 (nodes -1, 0, 0, 0): both would span 2 nodes.
    p = ParallelPlan(dp=2, pp=2, tp=2, cp=2, micro_batch=1, seq_len=8, global_batch=2)
    assert CX.grad_group(p, 7) == (4, 1, 4)
    # nodes of 2: 0, 2, 4, 6 are one per node
    assert CX.grad_group(p, 2) == (4, 4, 1)


H100 = load_hardware("h100-sxm")
BIG = ClusterSpec(H100, 8192, 0)


def test_local_seq_is_a_whole_token_count():
    p = ParallelPlan(dp=1, tp=1, cp=16, micro_batch=1, seq_len=8192, global_batch=1)
    assert CX.local_seq(p) == 512 and type(CX.local_seq(p)) is int   # 8192 / 16 tokens


def test_attention_core_time_by_hand_with_uneven_heads_and_cp():
    # 128 heads over tp 3 (42.67 per rank, a count the formula keeps fractional), sequence
    # 8 over cp 3: 0.5 * 4 * 8^2 * 128 = 16384, * (128/3) = 699050.67, / 3 = 233016.89 FLOPs,
    # at the GEMM rate
    # times the attention efficiency (H100 preset: no measured attention shapes)
    p = ParallelPlan(dp=1, tp=3, cp=3, micro_batch=1, seq_len=8, global_batch=1, dtype="bf16")
    flops = 0.5 * 4 * 8**2 * 128 * (128 / 3) / 3
    assert flops == pytest.approx(233016.88888888888, rel=1e-15, abs=0)
    want = flops / (BIG.gemm_rate("bf16") * H100.attention_efficiency)
    assert CX.attention_core_time(M405, p, BIG) == pytest.approx(want, rel=1e-12, abs=0)


def test_cp_two_is_priced():
    # cp 2 (the smallest ring), tp 8 on nodes of 8: the two peers are 8 apart, on two nodes:
    # one inter-node step each way. seq 8192, bf16, 8 kv heads of 128 over tp 8:
    # K and V bytes 2 * 2 * 8192 * 1024 / 8 = 4 MiB; all-gather over 2 nodes: 1 alpha plus
    # 1/2 of the bytes at the effective bandwidth; the reduce-scatter the same.
    p = ParallelPlan(dp=4, tp=8, pp=16, cp=2, sp=True, seq_len=8192, global_batch=128,
                     dtype="bf16", uneven_stages=True)
    inter = H100.inter_node
    m_bytes = 2 * 2 * 8192 * 1024 / 8
    ag = inter.latency + 0.5 * m_bytes / inter.effective_bandwidth
    flops = 0.5 * 4 * 8192**2 * 128 * (128 / 8) / 2   # half the causal attention per rank
    t_attn = flops / (BIG.gemm_rate("bf16") * H100.attention_efficiency)
    t = CX.cp_terms(M405, p, BIG, layers=8)
    assert t.comm_total == pytest.approx(8 * 2 * ag, rel=1e-12, abs=0)
    assert t.attn_forward == pytest.approx(8 * t_attn * (1 - 1 / 2), rel=1e-12, abs=0)
    assert t.attn_backward == pytest.approx(8 * 2.5 * t_attn * 0.5, rel=1e-12, abs=0)
    exposed = max(0.0, ag - t_attn / 2) + max(0.0, ag - 2.5 * t_attn / 2)   # (cp-1) = 1
    assert t.comm_exposed == pytest.approx(8 * exposed, rel=1e-12, abs=1e-15)

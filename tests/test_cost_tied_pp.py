"""The cost model prices the all-reduce that keeps a tied embedding's two copies equal over
pipeline stages (runtime/parallel/pp.py, TiedEmbeddingGrads): one all-reduce of the output
matrix's local fp32 gradient between the first and the last pipeline rank, once a step.

Expected values are the alpha-beta formula written out here with the preset's link figures
(H100 SXM: NVLink 450 GB/s at 0.8 efficiency and 5 us per hop, NIC 50 GB/s at 0.8 and
10 us): an all-reduce of M bytes over 2 ranks costs 2 alpha + 2 (2-1)/2 M / B.
"""

import pytest

from ptd.cost.step import step_time
from ptd.specs.hardware import ClusterSpec, get_hardware_preset
from ptd.specs.model import get_preset
from ptd.specs.plan import ParallelPlan

H100 = get_hardware_preset("h100-sxm")
GPT2 = get_preset("gpt2")  # vocabulary 50257 -> 50304 rows (a multiple of 128), hidden 768
ROWS, HIDDEN = 50304, 768


def extra(plan, gpus, per_node=8):
    """Exposed data-parallel communication (where the runner's gradient synchronisation is
    priced and measured) of the tied model minus that of the same model untied; the
    transfers between stages and the total do not differ otherwise."""
    c = ClusterSpec(H100, gpus, per_node)
    tied = step_time(GPT2, plan, c)
    untied = step_time(GPT2.replace(tied_embeddings=False), plan, c)
    assert tied.pp_comm == untied.pp_comm
    assert tied.total - untied.total == pytest.approx(tied.dp_comm_exposed - untied.dp_comm_exposed)
    assert tied.dp_comm_total - untied.dp_comm_total == pytest.approx(
        tied.dp_comm_exposed - untied.dp_comm_exposed)
    return tied.dp_comm_exposed - untied.dp_comm_exposed


def pair_all_reduce(nbytes, alpha, bandwidth):
    return 2 * alpha + nbytes / bandwidth


NVLINK = (5e-6, 450e9 * 0.8)
NIC = (10e-6, 50e9 * 0.8)


def test_two_stages_in_a_node():
    plan = ParallelPlan(pp=2, global_batch=8, micro_batch=1, seq_len=1024, schedule="1f1b")
    assert extra(plan, 2) == pytest.approx(pair_all_reduce(4 * ROWS * HIDDEN, *NVLINK), rel=1e-9)


def test_tp_and_zero_shrink_the_copy():
    # tp 2: the vocabulary padded to a multiple of 128 x 2, 197 x 256 = 50432 rows, 25216 per
    # tp rank; ZeRO-1 over dp 2 halves that again
    plan = ParallelPlan(pp=2, tp=2, global_batch=8, micro_batch=1, seq_len=1024, schedule="1f1b")
    assert extra(plan, 4) == pytest.approx(pair_all_reduce(4 * 25216 * HIDDEN, *NVLINK), rel=1e-9)
    plan = ParallelPlan(pp=2, tp=2, dp=2, zero=1, global_batch=8, micro_batch=1, seq_len=1024,
                        schedule="1f1b")
    assert extra(plan, 8) == pytest.approx(pair_all_reduce(4 * 12608 * HIDDEN, *NVLINK), rel=1e-9)


def test_stages_on_two_nodes_cross_the_network():
    # pp is the outermost axis: pp rank 0 on node 0, pp rank 1 on node 1 (8 GPUs each)
    plan = ParallelPlan(pp=2, dp=8, global_batch=16, micro_batch=1, seq_len=1024, schedule="1f1b")
    assert extra(plan, 16) == pytest.approx(pair_all_reduce(4 * ROWS * HIDDEN, *NIC), rel=1e-9)


def test_nothing_to_sync_without_a_pipeline_or_on_the_v():
    # (the tied and untied models differ here by the output matrix itself, so the sync term
    # is asked for directly)
    from ptd.cost.step import tied_embedding_sync
    c = ClusterSpec(H100, 2, 8)
    assert tied_embedding_sync(GPT2, ParallelPlan(dp=2, global_batch=8, micro_batch=1,
                                                  seq_len=1024), c) == 0
    # ZB-V: stage 0 and the last stage on rank 0, one shared tensor
    v = ParallelPlan(pp=2, global_batch=8, micro_batch=1, seq_len=1024, schedule="zero-bubble")
    assert tied_embedding_sync(GPT2, v, c) == 0
    p = ParallelPlan(pp=2, global_batch=8, micro_batch=1, seq_len=1024, schedule="1f1b")
    assert tied_embedding_sync(GPT2.replace(tied_embeddings=False), p, c) == 0
    # interleaved: the last stage is on rank pp - 1, not on rank 0
    il = ParallelPlan(pp=2, vpp=2, global_batch=8, micro_batch=1, seq_len=1024,
                      schedule="interleaved-1f1b")
    assert extra(il, 2) == pytest.approx(pair_all_reduce(4 * ROWS * HIDDEN, *NVLINK), rel=1e-9)


def test_sequence_parallel_keeps_a_learned_position_embedding_whole():
    # Under sp the runtime keeps a learned-position model's embedding whole over tp (positions
    # are added to the whole sequence; block 0 takes its shard), so the embedding's dropout
    # mask is s b h bytes-per-element on every tp rank, not 1/tp of it as with RoPE. Only that
    # term depends on both dropout and the position kind; per block dropout masks are alike.
    # gpt2 h = 768, s = 256, b = 2, bf16 (2 bytes), tp 2, pp 1 (one micro-batch in flight):
    # extra = 2 * 256 * 2 * 768 * (1 - 1/2) = 393,216 bytes.
    from ptd.cost.memory import activation_bytes
    plan = ParallelPlan(tp=2, sp=True, global_batch=2, micro_batch=2, seq_len=256, dtype="bf16")

    def dropout_share(position):
        m = GPT2.replace(position=position, tied_embeddings=False)
        return (activation_bytes(m.replace(dropout=0.1), plan)
                - activation_bytes(m.replace(dropout=0.0), plan))
    assert dropout_share("learned") - dropout_share("rope") == 393_216
    no_sp = plan.replace(sp=False)  # without sp both keep the whole mask
    learned = GPT2.replace(tied_embeddings=False)
    assert (activation_bytes(learned.replace(dropout=0.1), no_sp)
            - activation_bytes(learned.replace(dropout=0.0), no_sp)
            - dropout_share("learned")) > 0  # (the blocks' masks are whole too without sp)

"""What a tensor- and sequence-parallel block of ptd's runtime keeps for backward, on two
gloo ranks, against the cost model's count (``sp_gathered``): PyTorch's DTensor plan
gathers the sequence before the column-parallel layers, and those layers keep the gathered,
whole-sequence input -- not the shard Megatron-LM keeps (``ptd.cost.memory``)."""

from __future__ import annotations

import pytest

from ptd.cost.memory import activation_bytes_per_layer, output_activation_bytes
from ptd.specs import get_preset

from helpers import run_ranks, small_tp_block_model

S, B, TP = 64, 3, 2  # 192 tokens, 96 a rank's sequence shard


def _saved_bytes(rank: int, store_path: str, autocast: bool, q) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    model = small_tp_block_model(rank, store_path, TP, True)
    try:
        spec = model.spec
        # under sp the residual stream between blocks is the rank's local sequence shard
        x = torch.randn(B, S // TP, spec.hidden, requires_grad=True)
        local = [p.to_local() if isinstance(p, DTensor) else p for p in model.parameters()]
        shapes = {tuple(p.shape) for p in local} | {tuple(p.shape)[::-1] for p in local}
        seen: dict[int, int] = {}

        def pack(t):
            t_l = t.to_local() if isinstance(t, DTensor) else t
            ptr = t_l.untyped_storage().data_ptr()
            # the block's input (counted as the previous block's output), the weights and
            # their casts, the norms' per-token statistics, the rotary tables
            if (ptr == x.untyped_storage().data_ptr() or tuple(t_l.shape) in shapes
                    or t_l.shape[-1] == 1 or t_l.shape[0] == 1):
                return t
            seen[ptr] = t_l.untyped_storage().nbytes()
            return t
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                y = model.layers["0"](x, (model.rope_cos, model.rope_sin))
        block = sum(seen.values())
        # the final norm and the output layer on the last block's output (a shard)
        seen.clear()
        x = y.detach().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                model.output(model.norm(x))
        q.put((rank, (block, sum(seen.values()))))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("autocast", [False, True])
def test_sequence_parallel_block_keeps_the_gathered_inputs(autocast, tmp_path):
    results = run_ranks(_saved_bytes, TP, str(tmp_path / "store"), autocast)
    assert results[0] == results[1]
    got = {r: v[0] for r, v in results.items()}
    head = results[0][1]
    spec = get_preset("small")  # h 256, 8 query heads of 32 (4 a rank), 4 kv heads, F 704
    full, shard = S * B, S * B // TP  # tokens of the gathered sequence and of a shard
    if autocast:  # by hand, bytes a rank keeps
        want = (4 * 256 * shard             # the second norm's fp32 input (a shard)
                + 2 * 4 * 256 * shard       # the composite RMSNorms' normalised inputs
                + 5 * 2 * 256 * full        # wq, wk, wv, w1, w3: each its bf16 cast of the
                                            # gathered sequence
                + 2 * (128 + 2 * 64) * full + 2 * 128 * full  # q, k, v; attention output
                + 4 * 2 * 352 * full        # SwiGLU: w1 and w3 outputs, SiLU, product
                + 4 * 4 * full)             # fp32 log-sum-exp, 4 heads
        assert want == 1_477_632
    else:  # fp32: wq, wk, wv share one gathered input, w1 and w3 another
        want = (4 * 256 * shard + 2 * 4 * 256 * shard
                + 2 * 4 * 256 * full
                + 4 * (128 + 2 * 64) * full + 4 * 128 * full
                + 4 * 4 * 352 * full
                + 4 * 4 * full)
        assert want == 2_067_456
    assert got[0] == want
    ab = 2 if autocast else 4
    block_input = 4 * 256 * shard
    count = activation_bytes_per_layer(spec, S, B, tp=TP, sp=True, act_bytes=ab,
                                       fused_norm=False, autocast=autocast, sp_gathered=True)
    assert count - block_input == want
    # Megatron-LM's count keeps the shard: (tp - 1) / tp of those inputs fewer
    n_in = 5 if autocast else 2
    shard_count = activation_bytes_per_layer(spec, S, B, tp=TP, sp=True, act_bytes=ab,
                                             fused_norm=False, autocast=autocast)
    assert count - shard_count == n_in * ab * 256 * (full - shard)
    # the final norm (composite RMSNorm: its normalised input, fp32 under autocast, a shard)
    # and the output layer's input, the gathered sequence (its bf16 cast under autocast)
    want_head = 4 * 256 * shard + ab * 256 * full
    assert head == want_head
    logprobs = 4 * S * B * spec.padded_vocab(TP) / TP  # the loss's, not run here
    norm_input = 4 * 256 * shard
    assert output_activation_bytes(spec, S, B, TP, True, ab, fused_norm=False, autocast=autocast,
                                   sp_gathered=True) - logprobs - norm_input == want_head


def test_each_stack_counts_its_sequence_parallel_inputs_through_estimate():
    # one stage of 2 blocks, tp 4 with sp, bf16, micro-batch 2 x 128 tokens, h 256: the
    # estimate's activations with the gathered inputs less those with the shards, by hand:
    # (1 - 1/4) of every such input -- per block 5 (ptd: each linear its bf16 cast) or 2
    # (torchtitan: one for wq/wk/wv, one for w1/w3), and the output layer's one
    from ptd.cost.estimate import CostOptions, estimate
    from ptd.cost.stacks import stack_options
    from ptd.specs import ClusterSpec, ModelSpec, load_hardware
    from ptd.specs.plan import ParallelPlan
    import dataclasses
    model = ModelSpec(name="m", n_layers=2, hidden=256, n_heads=8, n_kv_heads=4, ffn_hidden=512,
                      vocab_size=512, max_seq_len=128)
    cl = ClusterSpec(load_hardware("h100-sxm"), 4, 8)
    plan = ParallelPlan(dp=1, tp=4, sp=True, micro_batch=2, global_batch=2, seq_len=128,
                        dtype="bf16")
    sbh = 128 * 2 * 256
    for opts, n_in in ((CostOptions(), 5), (stack_options("torchtitan"), 2)):
        assert opts.sp_gathered
        whole = estimate(model, cl, plan, options=opts).memory.activations
        shard = estimate(model, cl, plan, options=dataclasses.replace(opts, sp_gathered=False)
                         ).memory.activations
        assert whole - shard == (2 * n_in + 1) * 2 * sbh * 3 / 4
    for name in ("megatron-core", "megatron-2021", "deepspeed"):
        assert not stack_options(name).sp_gathered
    assert stack_options("ptd").sp_gathered


def test_a_runs_predicted_memory_counts_the_gathered_inputs():
    # what `ptd train` prints beside the measured peak (its runtime: DTensor's sp): in fp32,
    # per block the two gathered inputs and the output layer's, (1 - 1/2) of each beyond
    # Megatron's shard count; small: 4 blocks, micro-batch 4 x 128 tokens, h 256
    from ptd.cost.memory import activation_bytes
    from ptd.specs.plan import ParallelPlan
    from ptd.summary.compare import predicted_rank_memory
    spec = get_preset("small")
    plan = ParallelPlan(tp=2, sp=True, micro_batch=4, global_batch=16, seq_len=128)
    got = predicted_rank_memory(spec, plan, 0, 0)["activations"]
    shard = activation_bytes(spec, plan, pp_rank=0, fused_norm=True, autocast=True)
    sbh = 128 * 4 * 256
    assert got - shard == (4 * 2 + 1) * 4 * sbh / 2


def test_the_estimates_activation_line_counts_what_the_estimate_counts():
    # `ptd estimate`'s "with selective recompute + sp it gives ..." figure is the estimate's
    # own activation count of that plan (ptd's stack: the gathered inputs)
    from ptd.commands.estimate import activation_figures
    from ptd.cost.estimate import CostOptions, estimate
    from ptd.specs import ClusterSpec, load_hardware
    from ptd.specs.plan import ParallelPlan
    spec = get_preset("small")
    hw = load_hardware("h100-sxm")
    plan = ParallelPlan(dp=1, tp=2, micro_batch=4, global_batch=4, seq_len=128, dtype="bf16")
    got = activation_figures(spec, plan, CostOptions(), hw)["ptd_selective_bytes"]
    sel = plan.replace(recompute="selective", sp=True)
    assert got == estimate(spec, ClusterSpec(hw, 2, 8), sel, options=CostOptions()).memory.activations

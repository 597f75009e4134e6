"""What a block of ptd's runtime keeps for backward under ZeRO (FSDP's mixed precision, no
autocast), on two gloo ranks, against the cost model's count: the forward runs on 16-bit
parameters, so the linears reading one input share it (two gathered copies a block, not
autocast's five casts), and the CPU's composite RMSNorm keeps fp32 upcasts of its input
(``ptd.cost.eager.for_plan``, ``ptd.cost.memory.activation_bytes_per_layer``)."""

from __future__ import annotations

import pytest

from ptd.cost.memory import activation_bytes_per_layer, output_activation_bytes
from ptd.specs import get_preset

from helpers import run_ranks

S, B, TP = 64, 3, 2  # 192 tokens, 96 a rank's sequence shard


def _saved_bytes(rank: int, store_path: str, q) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from ptd.runtime.model.init import materialize
    from ptd.runtime.model.transformer import build_model
    from ptd.runtime.parallel.fsdp import apply_fsdp
    from ptd.runtime.parallel.tp import apply_tp
    from ptd.specs.plan import ParallelPlan
    dist.init_process_group("gloo", store=dist.FileStore(store_path, TP), rank=rank,
                            world_size=TP)
    try:
        plan = ParallelPlan(dp=1, tp=TP, sp=True, zero=1, dtype="bf16", micro_batch=B,
                            global_batch=B, seq_len=S)
        mesh = init_device_mesh("cpu", (1, TP), mesh_dim_names=("dp", "tp"))
        model = build_model(get_preset("small"), "meta")
        apply_tp(model, mesh["tp"], plan)
        apply_fsdp(model, mesh["dp"], plan, torch.device("cpu"))
        materialize(model, torch.device("cpu"), seed=0)
        block = model.layers["0"]
        params = [p.to_local() if isinstance(p, DTensor) else p for p in block.parameters()]
        shapes = {tuple(p.shape) for p in params} | {tuple(p.shape)[::-1] for p in params}
        state = {"on": False, "x": None, "dtypes": set()}
        seen: dict[int, int] = {}

        def local(t):
            return t.to_local() if isinstance(t, DTensor) else t

        def enter(_mod, args):
            # (the input may still be a collective's pending result: compared by identity)
            state["on"], state["x"], state["into"] = True, args[0], seen
            state["dtypes"].add(args[0].dtype)

        def leave(_mod, _args, _out):
            state["on"] = False
        block.register_forward_pre_hook(enter)
        block.register_forward_hook(leave)

        def pack(t):
            t_l = local(t)
            if not state["on"] or isinstance(t, torch.nn.Parameter):
                return t
            try:
                ptr = t_l.untyped_storage().data_ptr()
            except RuntimeError:  # FSDP's unsharded parameters (storage freed by resizing)
                return t
            # the block's input, the (gathered, 16-bit) weights, the norms' per-token
            # statistics and the rotary tables are not the block's activations
            if (t is state["x"] or tuple(t_l.shape) in shapes or t_l.shape[-1] == 1
                    or t_l.shape[0] == 1):
                return t
            state["into"][ptr] = t_l.untyped_storage().nbytes()
            return t
        head: dict[int, int] = {}

        def head_on(_mod, args):  # the final norm and the output layer
            state["on"], state["x"], state["into"] = True, args[0], head
        model.norm.register_forward_pre_hook(head_on)
        model.output.register_forward_hook(leave)
        ids = torch.randint(0, 256, (B, S))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(ids)
        q.put((rank, (sum(seen.values()), sorted(str(d) for d in state["dtypes"]),
                      sum(head.values()))))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_a_zero_block_in_bf16_shares_its_gathered_inputs(tmp_path):
    results = run_ranks(_saved_bytes, TP, str(tmp_path / "store"))
    assert results[0] == results[1]
    got, dtypes, head = results[0]
    assert dtypes == ["torch.bfloat16"]  # the residual stream is 16-bit: no autocast
    full, shard = S * B, S * B // TP
    # by hand, bytes a rank keeps (small: h 256, 4 query heads of 32 a rank, 2 kv heads, F/2 352)
    want = (2 * (4 + 4) * 256 * shard       # each norm: the fp32 upcast of its input, x * rstd
            + 2 * 2 * 256 * full            # the gathered sequence, once for wq/wk/wv, once
                                            # for w1/w3 (autocast would keep 5 casts)
            + 2 * (128 + 2 * 64) * full + 2 * 128 * full  # q, k, v; attention output
            + 4 * 2 * 352 * full            # SwiGLU: w1 and w3 outputs, SiLU, product
            + 4 * 4 * full)                 # fp32 log-sum-exp, 4 heads
    assert want == 1_281_024
    assert got == want
    count = activation_bytes_per_layer(get_preset("small"), S, B, tp=TP, sp=True, act_bytes=2,
                                       fused_norm=False, autocast=False, sp_gathered=True)
    assert count == want
    # the final norm (composite: the fp32 upcast of its input and x * rstd, a shard) and the
    # output layer's input (the gathered sequence, bf16)
    want_head = 2 * 4 * 256 * shard + 2 * 256 * full
    assert head == want_head
    logprobs = 4 * S * B * get_preset("small").padded_vocab(TP) / TP  # the loss's, not run here
    assert output_activation_bytes(get_preset("small"), S, B, TP, True, 2, fused_norm=False,
                                   autocast=False, sp_gathered=True) - logprobs == want_head


def test_composite_rms_norm_keeps_fp32_whatever_its_input():
    # torch's rms_norm on a CPU: from a bf16 input it keeps the fp32 upcast (not the input)
    # and x * rstd in fp32; the cost model counts both at 4 bytes (fused_norm=False)
    import torch
    import torch.nn.functional as F
    x = torch.randn(4, 8, 32, dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(32, dtype=torch.bfloat16, requires_grad=True)
    kept: dict[int, tuple] = {}

    def pack(t):
        if t.dim() == 3 and t.shape[-1] == 32:
            kept[t.untyped_storage().data_ptr()] = (t.dtype, t.untyped_storage().nbytes())
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.rms_norm(x, (32,), w, 1e-5)
    assert x.untyped_storage().data_ptr() not in kept
    assert sorted(kept.values()) == [(torch.float32, 4 * 4 * 8 * 32)] * 2


def test_the_estimate_prices_zero_without_autocast():
    # ptd's stack on an H100 (fused norms), tp 1, bf16, micro-batch 2 x 128, h 256, one block
    # per stage: ZeRO-0's autocast keeps per block the two fp32 norm inputs (4 bytes) and a
    # cast input per linear (q, k, v, gate, up: 5 x 2), ZeRO-1 the bf16 norm inputs (2 x 2) and
    # one input per group (2 x 2): 10 bytes a token and hidden unit fewer a block; the output
    # layer: its fp32 norm input against bf16, 2 fewer. And its tp collectives and eager
    # passes are those of the bf16 stream.
    from ptd.cost import eager as E
    from ptd.cost.estimate import estimate
    from ptd.specs import ClusterSpec, ModelSpec, load_hardware
    from ptd.specs.plan import ParallelPlan
    model = ModelSpec(name="m", n_layers=2, hidden=256, n_heads=8, n_kv_heads=4, ffn_hidden=512,
                      vocab_size=512, max_seq_len=128)
    cl = ClusterSpec(load_hardware("h100-sxm"), 2, 8)
    z0 = ParallelPlan(dp=2, micro_batch=2, global_batch=4, seq_len=128, dtype="bf16")
    z1 = z0.replace(zero=1)
    a0 = estimate(model, cl, z0).memory.activations
    a1 = estimate(model, cl, z1).memory.activations
    sbh = 128 * 2 * 256
    assert a0 - a1 == (2 * 10 + 2) * sbh
    assert E.for_plan("autocast", 0) == "autocast" and E.for_plan("autocast", 1) == "eager"
    assert E.for_plan("llama-ref", 3) == "llama-ref" and E.for_plan("fused", 2) == "fused"
    # the step: priced as the eager kind under ZeRO (same plan, the kind forced)
    from ptd.cost.step import step_time
    st = estimate(model, cl, z1).step
    assert st.compute == step_time(model, z1, cl, elementwise="eager").compute
    assert estimate(model, cl, z0).step.compute == \
        step_time(model, z0, cl, elementwise="autocast").compute
    # (the eager kind moves fewer bytes than autocast's, which ZeRO-0 keeps: Llama 3 8B)
    big = get_preset("llama3-8b")
    p0 = ParallelPlan(dp=2, micro_batch=1, global_batch=2, seq_len=4096, dtype="bf16")
    assert step_time(big, p0, cl, elementwise="eager").compute < \
        step_time(big, p0, cl, elementwise="autocast").compute
    # ... and step_time itself prices a ZeRO plan's autocast as eager (what the planner calls)
    p1 = p0.replace(zero=1)
    assert step_time(big, p1, cl, elementwise="autocast") == \
        step_time(big, p1, cl, elementwise="eager")
    assert estimate(big, cl, p1).step == step_time(big, p1, cl, elementwise="eager")


def test_the_reports_activation_figures_follow_the_zero_stage():
    # `ptd estimate`'s line "with selective recompute + sp it gives X": ptd's count of the
    # same plan, autocast's under ZeRO-0 only
    from ptd.commands.estimate import activation_figures
    from ptd.cost.memory import activation_bytes
    from ptd.specs.plan import ParallelPlan
    m = get_preset("small")
    for zero, cast in ((0, True), (1, False)):
        p = ParallelPlan(dp=2, tp=2, zero=zero, micro_batch=4, global_batch=8, seq_len=128,
                         dtype="bf16")
        sel = p.replace(recompute="selective", sp=True)
        want = activation_bytes(m, sel, fused_norm=True, autocast=cast, sp_gathered=True)
        assert activation_figures(m, p)["ptd_selective_bytes"] == want
    # (the two differ: autocast's fp32 norm inputs and per-linear casts)
    assert activation_bytes(m, sel, fused_norm=True, autocast=True, sp_gathered=True) > want

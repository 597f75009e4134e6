"""What "selective" recompute repeats, by stack (ptd.cost.compute.SELECTIVE): the attention
core (Korthikanti et al. 2022; Megatron-LM, ptd), or torchtitan's ``op`` and ``layer``
policies (torchtitan/parallelisms/parallelize_llama.py and config_manager.py at 041336434916).

Expected values are worked out by hand from the policies as torchtitan's code states them:
``op`` keeps the outputs of ``aten.mm`` and of the fused attention except every second mm of
a block in forward order (wq, wk, wv, wo, w1, w3, w2 for a Llama block: wk, wo and w3 run
again), and runs every other operator again; ``layer`` ("2") checkpoints every second block
in full and lets the others keep everything."""

from __future__ import annotations

import dataclasses

import pytest

from ptd.cost import compute as C
from ptd.cost import flops as F
from ptd.cost import memory as M
from ptd.cost.estimate import CostOptions, estimate
from ptd.cost.stacks import stack_options
from ptd.cost.validate import _selective_policy, load_cases, price
from ptd.specs import ClusterSpec, ParallelPlan, get_preset
from ptd.specs.hardware import HardwareSpec, LinkSpec, get_hardware_preset
from ptd.specs.model import ModelSpec

LLAMA = ModelSpec(name="t", n_layers=2, hidden=4, n_heads=2, n_kv_heads=2, ffn_hidden=8,
                  vocab_size=128, max_seq_len=16, mlp="swiglu", norm="rmsnorm", position="rope",
                  tied_embeddings=False, bias=False)


def _hw() -> HardwareSpec:
    link = LinkSpec(bandwidth=1e9, latency=1e-6)
    # no shape model (sm_count 0): a product takes flops / rate, its bytes at 1e30 B/s nothing
    return HardwareSpec(name="h", peak_flops={"fp32": 1e12}, memory_bytes=1e9,
                        memory_bandwidth=1e30, intra_node=link, inter_node=link)


def _blocks(model: ModelSpec, tokens: int = 10):
    kw = dict(bw=1e30, overhead=1e-3)
    return {p: C.block_time(model, _hw(), tokens, 1, 1, False, "fp32", 1e6, selective=p, **kw)
            for p in C.SELECTIVE}


def test_op_policy_repeats_every_second_product_and_the_operators():
    b = _blocks(LLAMA)
    # 10 tokens, hidden 4, q = kv = 4 (2 heads of 2), ffn 8, at 1e6 FLOP/s:
    # wq, wk, wv, wo 2*10*4*4 = 320 FLOPs each; w1, w3, w2 2*10*8*4 = 640 each
    t_lin = (4 * 320 + 3 * 640) / 1e6
    again = (320 + 320 + 640) / 1e6  # wk, wo, w3
    a = b["attention"]
    rest = a.forward - a.attention_forward - t_lin  # operators, norms, rotary, activation
    assert rest > 0
    assert b["op"].recompute("selective") == pytest.approx(rest + again)
    # the other policies as before; full recompute unchanged by the policy
    assert a.recompute("selective") == a.attention_forward
    assert b["layer"].recompute("selective") == pytest.approx(0.5 * a.recompute("full"))
    assert b["layer"].recompute("selective", early_stop=False) == pytest.approx(0.5 * a.forward)
    for p in C.SELECTIVE:
        assert b[p].recompute("full") == a.recompute("full")
        assert b[p].recompute("none") == 0.0


def test_op_policy_repeats_every_biased_product():
    gpt = dataclasses.replace(LLAMA, mlp="gelu", norm="layernorm", position="learned", bias=True)
    b = _blocks(gpt)
    # biased linears dispatch to addmm, which the policy does not keep: all six run again
    t_lin = (4 * 320 + 2 * 640) / 1e6
    a = b["attention"]
    assert b["op"].recompute("selective") == pytest.approx(a.forward - a.attention_forward)
    assert b["op"].recompute("selective") > t_lin


def test_recompute_flops_by_policy_llama3_8b():
    m = get_preset("llama3-8b")  # hidden 4096, kv 1024, ffn 14336, 32 layers, no biases
    # op: wk 4096*1024 + wo 4096*4096 + w3 4096*14336 = 79,691,776 weights, 2 FLOPs each
    assert F.op_policy_params(m) == 4096 * 1024 + 4096 * 4096 + 4096 * 14336 == 79_691_776
    assert F.recompute_flops_per_token(m, 8192, "selective", selective="op") == \
        2 * 32 * 79_691_776
    full = F.recompute_flops_per_token(m, 8192, "full")
    assert F.recompute_flops_per_token(m, 8192, "selective", selective="layer") == 0.5 * full
    # attention core: 4 s (H d) per layer
    assert F.recompute_flops_per_token(m, 8192, "selective") == 32 * 4 * 8192 * 4096
    fl = F.flops_per_token(m, 8192, "selective", selective="op")
    assert fl.hardware - fl.model == 2 * 32 * 79_691_776


def test_activation_bytes_by_policy():
    s, b, ab = 16, 2, 2  # tokens 32, bf16, tp 1
    # op: block input 4 + kept products wq 4, wv 4, w1 8, w2 4 + attention output 4, in
    # bf16 (2 B): 28 * 2 * 32 = 1792; the fp32 log-sum-exp 4 * 2 heads * 32 = 256
    assert M.activation_bytes_per_layer(LLAMA, s, b, recompute="selective", act_bytes=ab,
                                        selective="op") == 1792 + 256
    # tp 2 with sequence parallelism: the input a shard (2), wq/wv/w1 halves (2, 2, 4), the
    # down projection's partial sum whole (4), attention output half (2): 16 * 2 * 32 = 1024;
    # log-sum-exp 4 * 1 head * 32 = 128
    assert M.activation_bytes_per_layer(LLAMA, s, b, tp=2, sp=True, recompute="selective",
                                        act_bytes=ab, selective="op") == 1024 + 128
    none = M.activation_bytes_per_layer(LLAMA, s, b, recompute="none", act_bytes=ab)
    full = M.activation_bytes_per_layer(LLAMA, s, b, recompute="full", act_bytes=ab)
    assert M.activation_bytes_per_layer(LLAMA, s, b, recompute="selective", act_bytes=ab,
                                        selective="layer") == 0.5 * (none + full)
    # the policy only matters for selective recompute
    for rc in ("none", "full"):
        assert M.activation_bytes_per_layer(LLAMA, s, b, recompute=rc, act_bytes=ab,
                                            selective="op") == \
            M.activation_bytes_per_layer(LLAMA, s, b, recompute=rc, act_bytes=ab)


def test_stacks_and_cases_name_the_policy():
    # torchtitan 0.3.0's SelectiveAC (what the export writes for) is the op policy
    assert stack_options("torchtitan").selective == "op"
    for s in ("ptd", "megatron-2021", "megatron-core", "deepspeed"):
        assert stack_options(s).selective == "attention"
    assert _selective_policy("selective (op)") == "op"
    assert _selective_policy("Selective (Layer)") == "layer"
    assert _selective_policy("selective") is None and _selective_policy(None) is None
    # the two shipped torchtitan rows differ only in the policy the case names
    rows = {r.id: r for r in map(price, load_cases()) if r.id.startswith("torchtitan")}
    layer, op = (rows[f"torchtitan_a100_llama3_8b_sel_{k}"] for k in ("layer", "op"))
    assert layer.plan == op.plan and layer.predicted != op.predicted


def test_estimate_threads_the_policy_through_time_memory_and_flops():
    m, cl = get_preset("llama3-8b"), ClusterSpec(get_hardware_preset("a100-80g"), 8)
    plan = ParallelPlan(dp=8, zero=3, micro_batch=1, global_batch=8, seq_len=8192,
                        recompute="selective", dtype="bf16")
    e = {p: estimate(m, cl, plan, options=CostOptions(selective=p)) for p in C.SELECTIVE}
    assert len({x.step.recompute for x in e.values()}) == 3
    assert len({x.memory.activations for x in e.values()}) == 3
    assert e["op"].flops.recompute == 2 * 32 * 79_691_776
    # every policy repeats more than the attention core alone, and keeps less
    assert e["op"].step.recompute > e["attention"].step.recompute
    assert e["layer"].memory.activations < e["attention"].memory.activations
    assert e["op"].memory.activations < e["attention"].memory.activations


def test_biased_blocks_keep_no_product_output_under_the_op_policy():
    gpt = dataclasses.replace(LLAMA, mlp="gelu", norm="layernorm", position="learned", bias=True)
    # input 4 + attention output 4 elements a token, bf16, 32 tokens: 512; log-sum-exp 256
    assert M.activation_bytes_per_layer(gpt, 16, 2, recompute="selective", act_bytes=2,
                                        selective="op") == 512 + 256


def test_the_planner_prices_the_policy_as_estimate_does():
    from ptd.planner.search import _Pricer
    m, cl = get_preset("llama3-8b"), ClusterSpec(get_hardware_preset("a100-80g"), 8)
    plan = ParallelPlan(dp=8, zero=3, micro_batch=1, global_batch=8, seq_len=8192,
                        recompute="selective", dtype="bf16")
    o = stack_options("torchtitan")
    pr = _Pricer(m, cl, o, None, 8192)
    mem = pr.memory(plan)
    e, ref = pr.estimate(plan, mem), estimate(m, cl, plan, options=o)
    assert mem.activations == ref.memory.activations
    assert e.step.total == ref.step.total and e.flops == ref.flops
    assert ref.flops.recompute == 2 * 32 * 79_691_776

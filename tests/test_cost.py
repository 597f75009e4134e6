"""The cost model against the papers it implements, and its own invariants."""

import json

import pytest

from ptd.cost import comm, memory as M
from ptd.cost import params as P
from ptd.cost.estimate import CostOptions, choose, estimate
from ptd.cost.flops import flops_per_token, megatron_flops_per_iteration
from helpers import gpt
from ptd.specs import ClusterSpec, ParallelPlan, get_preset, load_hardware
from ptd.specs.stages import stage_split

GiB = 2**30


# ---------------------------------------------------------------- ZeRO paper
@pytest.mark.parametrize("stage,gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_figure_1(stage, gb):
    # Rajbhandari et al. 2020, Fig. 1: Psi = 7.5B, Nd = 64, K = 12. The figure prints one
    # decimal: stage 3 is 16 * 7.5 / 64 = 1.875 GB, printed 1.9, so compare within 1% or
    # within the figure's rounding (0.05 GB), whichever is larger.
    got = M.zero_paper_model_states(7.5e9, 64, stage, k=12) / 1e9
    assert abs(got - gb) <= max(0.01 * gb, 0.05)
    assert round(got, 1) == gb


@pytest.mark.parametrize("stage", [0, 3])
def test_exact_per_rank_states_match_zero_formula(stage):
    # The exact per-rank enumeration with the paper's byte convention (2+2+12) agrees with
    # the closed form for a real 7.3B model at Nd = 64 (FSDP's dim-0 chunks are even to 1%).
    m = gpt(40, 3840, 32, V=50304)
    plan = ParallelPlan(dp=64, zero=stage, global_batch=64, dtype="fp16")
    got = sum(M.model_state_bytes(m, plan, "zero"))
    assert got == pytest.approx(M.zero_paper_model_states(m.param_count(), 64, stage), rel=0.01)


# The ZeRO paper's Figure 1 model through `ptd estimate --convention zero`: a GPT of
# 32 x 4352 (F = 4h, vocabulary 50,304, 2,048 positions) holds 7,502,578,176 parameters,
# Psi = 7.5B to 0.03%. The paper's closed forms, per device at Nd = 64, K = 12:
#   stage 0: (2 + 2 + K) Psi            stage 1 (P_os): 2 Psi + 2 Psi + K Psi / Nd
#   stage 2 (P_os+g): 2 Psi + (2 + K) Psi / Nd     stage 3: (2 + 2 + K) Psi / Nd
FIG1_TOML = """[model]
preset = "gpt2"
name = "zero-fig1-7.5b"
n_layers = 32
hidden = 4352
n_heads = 32
n_kv_heads = 32
ffn_hidden = 17408
vocab_size = 50304
max_seq_len = 2048
"""
FIG1_PSI = 7_502_578_176


@pytest.mark.parametrize("stage,gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_figure_1_through_ptd_estimate(ptd_cli, tmp_path, stage, gb):
    psi, nd, k = FIG1_PSI, 64, 12
    paper = {0: (2 + 2 + k) * psi, 1: 2 * psi + 2 * psi + k * psi / nd,
             2: 2 * psi + (2 + k) * psi / nd, 3: (2 + 2 + k) * psi / nd}[stage]
    path = tmp_path / "fig1.toml"
    path.write_text(FIG1_TOML)
    rc, out, err = ptd_cli("estimate", "--model", str(path), "--hardware", "a100-80g",
                           "--gpus", "64", "--dp", "64", "--zero", str(stage), "--convention",
                           "zero", "--dtype", "fp16", "--global-batch", "64", "--seq-len", "1024",
                           "--micro-batch", "1", "--recompute", "full", "--json")
    assert rc == 0, err
    from ptd.specs.model import load_model
    assert load_model(str(path)).param_count() == psi
    mem = json.loads(out)["memory_per_device_bytes"]
    worst = mem["params"] + mem["grads"] + mem["optimizer"]  # the most loaded rank
    # FSDP's dim-0 chunks of every tensor: 4,352 = 64 x 68 rows, 17,408 = 64 x 272,
    # 50,304 = 64 x 786, 2,048 = 64 x 32 -- no remainder, so every rank holds Psi / 64
    assert worst == pytest.approx(paper, rel=1e-12)
    assert abs(worst / 1e9 - gb) <= 0.015 * gb  # the figure's numbers, to 1.5%


def test_zero12_model_states_are_even_shards_under_the_ptd_convention():
    # ptd's runtime keeps fp32 shards of parameters, gradients and moments from step to
    # step under every stage: 16 bytes per parameter over dp, split FSDP's way (dim 0 in
    # torch.chunk rows). The tiny model at dp 3: every tensor's rows 64, 128, 256 or 32
    # split 22/22/20, 43/43/42, 86/86/84, 11/11/10, so rank 0 holds the most.
    m = get_preset("tiny")
    for stage in (1, 2, 3):
        plan = ParallelPlan(dp=3, zero=stage, global_batch=3)
        per_rank = [M.model_state_elements(m, plan, 0, d) for d in range(3)]
        assert sum(e.params for e in per_rank) == m.param_count()
        assert per_rank[0].params == per_rank[0].grads == per_rank[0].optimizer
        shapes = [t.local_shape(1) for t in P.rank_params(m, plan, 0)]
        assert [e.params for e in per_rank] == [P.fsdp_numel(shapes, 3, d) for d in range(3)]
        assert M.model_state_bytes(m, plan) == (4 * per_rank[0].params, 4 * per_rank[0].params,
                                                8 * per_rank[0].params)


def test_fp32_and_ptd_conventions():
    assert M.state_bytes_per_param("fp32", "zero") == (4, 4, 8)
    assert M.state_bytes_per_param("bf16", "ptd") == (4, 4, 8)
    assert M.state_bytes_per_param("bf16", "zero") == (2, 2, 12)


# ------------------------------------------------------------- Megatron eq. 3
@pytest.mark.parametrize("L,h,a,B,s", [(24, 2304, 24, 512, 2048), (96, 12288, 96, 1536, 2048),
                                       (40, 6144, 48, 1024, 2048)])
def test_megatron_eq3_full_recompute(L, h, a, B, s):
    m = gpt(L, h, a)
    # eq. 3 describes Megatron's full recompute, which re-runs the whole forward
    ours = flops_per_token(m, s, "full", early_stop=False).hardware * B * s
    # the same products counted the same way: equal to rounding (biases are not products)
    assert ours == pytest.approx(megatron_flops_per_iteration(m, B, s, recompute=True), rel=1e-12)
    # PyTorch's early-stopping checkpoint (ptd's runtime) skips each block's MLP down
    # projection: 2 * 4h^2 per token per layer less, a third of a GPT block's products
    early = flops_per_token(m, s, "full").hardware * B * s
    assert ours - early == pytest.approx(2 * 4 * h * h * L * B * s)
    model = flops_per_token(m, s, "none").model * B * s
    assert model == pytest.approx(megatron_flops_per_iteration(m, B, s, recompute=False), rel=1e-12)


def test_palm_convention_and_mfu_hfu():
    m = get_preset("llama2-7b")
    f = flops_per_token(m, 4096, "selective")
    n = m.matmul_params()
    assert f.model == pytest.approx(6 * n + 12 * m.n_layers * 4096 * m.q_dim)
    assert f.hardware - f.model == pytest.approx(4 * m.n_layers * 4096 * m.q_dim)
    full = flops_per_token(m, 4096, "full", early_stop=False)
    # one more forward of every block (the output layer is not recomputed)
    blocks_fwd = 2 * m.n_layers * m.matmul_params_per_layer() + 4 * m.n_layers * 4096 * m.q_dim
    assert full.hardware - full.model == pytest.approx(blocks_fwd)
    # GQA does not change the attention term; MoE counts active experts only
    assert flops_per_token(get_preset("mixtral-8x7b"), 4096).model < 6 * 15e9 + 12 * 32 * 4096 * 4096 * 1.01


# ---------------------------------------------------------- Korthikanti 2022
S, B, H, A = 2048, 4, 6144, 48


def korthikanti(t=1, sp=False, recompute="none"):
    m = gpt(40, H, A, dropout=0.1)
    return M.activation_bytes_per_layer(m, S, B, tp=t, sp=sp, recompute=recompute,
                                        act_bytes=2, attention="scores")


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_korthikanti_activation_formulas(t):
    sbh = S * B * H
    if t == 1:
        assert korthikanti() == pytest.approx(sbh * (34 + 5 * A * S / H))
    assert korthikanti(t) == pytest.approx(sbh * (10 + 24 / t + 5 * A * S / (H * t)))
    assert korthikanti(t, sp=True) == pytest.approx(sbh / t * (34 + 5 * A * S / H))
    assert korthikanti(t, sp=True, recompute="selective") == pytest.approx(34 * sbh / t)
    assert korthikanti(t, sp=True, recompute="full") == pytest.approx(2 * sbh / t)


def test_flash_attention_stores_no_scores():
    m = gpt(4, 1024, 16)
    flash = M.activation_bytes_per_layer(m, 4096, 1, attention="flash")
    scores = M.activation_bytes_per_layer(m, 4096, 1, attention="scores")
    assert scores - flash > 16 * 4096 * 4096  # the s*s term
    assert flash < 20 * 4096 * 1024 * 2


def test_in_flight_micro_batches_per_schedule():
    base = ParallelPlan(pp=4, global_batch=16, seq_len=64)
    assert M.in_flight(base.replace(schedule="gpipe"), 0) == 16
    assert [M.in_flight(base, r) for r in range(4)] == [4, 3, 2, 1]
    inter = base.replace(schedule="interleaved-1f1b", vpp=2)
    # Korthikanti: the first stage holds L (1 + (p-1)/(p v)) layers' worth = p + (p-1)/v micro-batches
    assert M.in_flight(inter, 0) == pytest.approx(4 * (1 + 3 / (4 * 2)))
    assert M.in_flight(base.replace(schedule="zero-bubble"), 3) == 4


# -------------------------------------------------------------- communication
def test_alpha_beta_collectives():
    hw = load_hardware("h100-sxm")
    bw, lat = hw.intra_node.effective_bandwidth, hw.intra_node.latency
    M_ = 1e9
    ring = 2 * 7 / 8 * M_ / bw
    assert comm.collective_time("all_reduce", M_, 8, hw) == pytest.approx(ring + 6 * lat)  # tree latency
    assert comm.collective_time("all_gather", M_, 8, hw) == pytest.approx(7 * lat + 7 / 8 * M_ / bw)
    assert comm.collective_time("send_recv", M_, 2, hw) == pytest.approx(lat + M_ / bw)
    # crossing nodes costs more, and hierarchical beats one member per node
    inter = comm.collective_time("all_reduce", M_, 16, hw, nodes=2, per_node=8)
    flat = comm.collective_time("all_reduce", M_, 16, hw, nodes=16, per_node=1)
    assert ring < inter < flat
    assert comm.collective_time("all_reduce", M_, 1, hw) == 0


# ------------------------------------------------------------------ pipeline
def test_bubble_fraction_narayanan():
    m = get_preset("llama2-7b")
    c = ClusterSpec(load_hardware("a100-80g"), 8)
    for v, sched in [(1, "1f1b"), (1, "gpipe"), (2, "interleaved-1f1b"), (4, "interleaved-1f1b")]:
        plan = ParallelPlan(pp=8, vpp=v, schedule=sched, global_batch=32, seq_len=2048,
                            dtype="bf16")
        st = estimate(m, c, plan).step
        busy = st.compute + st.tp_comm
        assert st.bubble / busy == pytest.approx(7 / (v * 32), rel=1e-6)
    zb = estimate(m, c, ParallelPlan(pp=8, schedule="zero-bubble", global_batch=32, seq_len=2048,
                                     dtype="bf16")).step
    assert zb.bubble == 0


def test_stage_split_balances_output_layer():
    # a large vocabulary makes the last stage heavy: with uneven stages allowed, layers move
    # off it; without, layers that divide evenly are split evenly (as Megatron-LM and
    # torchtitan do: Llama-3-70B on pp 4 is 20/20/20/20, Llama-3-8B on pp 2 is 16/16)
    m = get_preset("llama3-8b").replace(n_layers=8, vocab_size=512000)
    split = stage_split(m, 4, 4096, True)
    assert sum(split) == 8 and split[-1] < 2
    assert stage_split(m, 4, 4096) == (2, 2, 2, 2)
    assert stage_split(get_preset("llama2-7b"), 4, 4096) == (8, 8, 8, 8)
    assert stage_split(get_preset("llama3-70b"), 4, 8192) == (20, 20, 20, 20)
    assert stage_split(get_preset("llama3-8b"), 2, 8192) == (16, 16)
    # 126 layers on 16 stages do not divide: balanced by cost, ends one layer short
    assert stage_split(get_preset("llama3.1-405b"), 16, 8192) == (7,) + (8,) * 14 + (7,)


def test_memory_parts_shrink_with_sharding():
    # Llama-2-7B: Psi = 6,738,415,616; a block holds 4 x 4096^2 + 3 x 4096 x 11008 + 2 x 4096
    # = 202,383,360. Every dim 0 (4096, 11008, 32000) divides by dp 8.
    m = get_preset("llama2-7b")
    psi, block = 6_738_415_616, 202_383_360
    c = ClusterSpec(load_hardware("a100-80g"), 8)

    def mem(z: int, gb: int = 8):  # noqa: ANN202
        return estimate(m, c, ParallelPlan(dp=8, zero=z, global_batch=gb, seq_len=4096,
                                           dtype="bf16")).memory
    mems = [mem(z) for z in range(4)]
    # ptd's convention: fp32 parameters and gradients, 8 bytes of moments; DDP keeps them all,
    # FSDP's ZeRO-1/2/3 the even 1/8 shards from one step to the next
    assert (mems[0].params, mems[0].grads, mems[0].optimizer) == (4 * psi, 4 * psi, 8 * psi)
    for z in (1, 2, 3):
        assert (mems[z].params, mems[z].grads, mems[z].optimizer) == (psi / 2, psi / 2, psi)
    # what the stages hold during the step: DDP its bf16 compute copies; ZeRO-1/2 every
    # parameter gathered in bf16 and the largest FSDP unit's fp32 gradient before its
    # reduce-scatter -- a block is 772 MiB of fp32, past the 25 MiB that closes a unit, so
    # every block is a unit and the largest is the root's: embeddings and output layer
    # 2 x 32000 x 4096 plus the final norm, 262,148,096 > 202,383,360; ZeRO-3 two gathered
    # bf16 blocks and one block's fp32 gradient
    root = 2 * 32000 * 4096 + 4096
    assert P.zero12_unit_blocks(m, 1) == 1
    assert mems[0].buffers == 2 * psi
    assert mems[1].buffers == mems[2].buffers == 2 * psi + 4 * root
    assert mems[3].buffers == 2 * 2 * block + 4 * block
    assert mems[0].total > mems[1].total == mems[2].total > mems[3].total
    # with 2 micro-batches ZeRO-1 defers the reduction: every fp32 gradient unsharded until
    # the last one; ZeRO-2 still reduces block by block
    assert mem(1, 16).buffers == 2 * psi + 4 * psi
    assert mem(2, 16).buffers == 2 * psi + 4 * root
    tp = estimate(m, c, ParallelPlan(tp=8, global_batch=8, seq_len=4096, dtype="bf16")).memory
    assert tp.params == pytest.approx(mems[0].params / 8, rel=0.01)


# ------------------------------------------------------ Megatron-LM Table 1
# Narayanan et al. 2021, Table 1 (A100 80GB, fp16, full recompute, seq 2048, vocab 51200),
# TFLOP/s per GPU counted with eq. 3. The workload is described as that system ran it --
# unfused attention that stores the s*s scores, dropout 0.1, gradient all-reduce after the
# backward pass (NVIDIA/Megatron-LM#391), full recompute of the whole forward -- and the
# micro-batch is chosen by the cost model.
MEGATRON_ROWS = [  # (layers, hidden, heads, global batch, gpus, tp, published TFLOP/s)
    (24, 2304, 24, 512, 32, 1, 137),
    (40, 6144, 48, 1024, 256, 8, 135),
]


@pytest.mark.parametrize("L,h,a,gb,n,tp,published", MEGATRON_ROWS)
def test_megatron_table1_rows_within_15_percent(L, h, a, gb, n, tp, published):
    m = gpt(L, h, a, dropout=0.1)
    c = ClusterSpec(load_hardware("a100-80g"), n)
    base = ParallelPlan(dp=n // tp, tp=tp, global_batch=gb, seq_len=2048, dtype="fp16",
                        recompute="full")
    e = choose(m, c, base, ["micro_batch"], options=CostOptions(
        attention="scores", dp_overlap=False, recompute_early_stop=False,
        tp_grad_per_linear=False, elementwise="fused"))
    assert e.memory.fits
    tflops = megatron_flops_per_iteration(m, gb, 2048) / e.step.total / n / 1e12
    assert abs(tflops / published - 1) < 0.15, tflops


# ----------------------------------------------------------------- estimate
KEYS = {
    "flops_per_token": {"model", "hardware"},
    "memory_per_device_bytes": {"params", "grads", "optimizer", "activations", "buffers", "total"},
    "step_time_s": {"total", "compute", "tp_comm", "pp_comm", "dp_comm_exposed", "bubble", "optimizer"},
    "tflops_per_device": {"model", "hardware"},
}


def test_estimate_json_keys_and_sums(ptd_cli):
    rc, out, _ = ptd_cli("estimate", "--model", "llama3-70b", "--hardware", "h100-sxm", "--gpus", "64",
                         "--tp", "8", "--pp", "2", "--json")
    assert rc == 0
    d = json.loads(out)
    for k, sub in KEYS.items():
        assert sub <= set(d[k]), k
    for k in ("fits", "tokens_per_s", "tokens_per_s_per_device", "mfu", "hfu", "time_to_train_s"):
        assert k in d
    st = d["step_time_s"]
    parts = sum(st[k] for k in ("compute", "tp_comm", "pp_comm", "dp_comm_exposed", "bubble", "optimizer",
                                "overlap"))
    assert st["overlap"] > 0  # the gradient reduction hidden behind the backward takes SMs
    assert parts == pytest.approx(st["total"])
    mem = d["memory_per_device_bytes"]
    assert sum(mem[k] for k in ("params", "grads", "optimizer", "activations", "buffers")) == pytest.approx(mem["total"])
    assert d["plan"]["dp"] == 4 and set(d["chosen"]) >= {"micro_batch", "zero", "recompute"}
    assert 0 < d["mfu"] <= d["hfu"] < 1
    assert d["tokens_per_s_per_device"] == pytest.approx(d["tokens_per_s"] / 64)


def test_estimate_table_and_fixed_knobs(ptd_cli):
    rc, out, _ = ptd_cli("estimate", "--model", "llama2-7b", "--hardware", "a100-80g", "--gpus", "8",
                         "--zero", "3", "--micro-batch", "1", "--recompute", "full", "--seq-len", "4096")
    assert rc == 0
    for section in ("memory per device", "step time", "throughput", "MFU", "time to train"):
        assert section in out
    plan_line = next(l for l in out.splitlines() if l.startswith("plan:"))
    assert "zero3" in plan_line and "mb1" in plan_line and "rc-full" in plan_line
    chosen = next((l for l in out.splitlines() if l.startswith("chosen:")), "")
    assert "zero=" not in chosen and "micro_batch=" not in chosen and "recompute=" not in chosen


# (the speed of choose() is measured by benchmarks/speed.py, not asserted here: an absolute
# time limit fails on a loaded machine and passes a slow regression on a fast one)


@pytest.mark.parametrize("argv", [
    ["estimate", "--model", "nope"],
    ["estimate", "--hardware", "tpu9"],
    ["estimate", "--tp", "3"],
    ["estimate", "--gpus", "-8"],
    ["estimate", "--model", "/no/such/config.json"],
    ["estimate", "--model", "llama3-8b", "--gpus", "8", "--dp", "4"],
    ["estimate", "--model", "tiny", "--gpus", "4", "--tp", "4", "--seq-len", "100000"],
])
def test_estimate_bad_input(ptd_cli, argv):
    rc, out, err = ptd_cli(*argv)
    assert rc == 2 and err.count("\n") == 1 and err.startswith(f"ptd {argv[0]}: error:"), err


def test_blocking_wait_is_paid_once_per_tensor_parallel_collective():
    """A calibrated blocking wait adds exactly (tp collectives per step) x wait to tp_comm:
    per micro-batch 2 per block forward, 5 per block backward (wq, wk, wv, w1, w3 input
    gradients: SwiGLU, no sp), the embedding's, loss_parallel's 3 and the output layer's
    input gradient."""
    from ptd.cost.step import step_time
    model = get_preset("tiny")
    cpu = load_hardware("cpu").replace(blocking_wait_measured={})
    plan = ParallelPlan(dp=1, tp=2, micro_batch=2, global_batch=4, seq_len=64, dtype="fp32")
    base = step_time(model, plan, ClusterSpec(cpu, 2))
    flat = cpu.replace(blocking_wait_measured={2: ((0.0, 1e-3),), 4: ((0.0, 5e-3),)})
    waited = step_time(model, plan, ClusterSpec(flat, 2))
    per_mb = model.n_layers * (2 + 5) + 1 + 3 + 1
    assert waited.tp_comm - base.tp_comm == pytest.approx(plan.n_microbatches * per_mb * 1e-3)
    assert waited.compute == base.compute and waited.dp_comm_exposed == base.dp_comm_exposed
    # at 4 workers per node, the 4-worker curve
    four = step_time(model, plan.replace(dp=2, global_batch=8), ClusterSpec(flat, 4))
    four_base = step_time(model, plan.replace(dp=2, global_batch=8), ClusterSpec(cpu, 4))
    assert four.tp_comm - four_base.tp_comm == pytest.approx(plan.n_microbatches * per_mb * 5e-3)
    # no tensor parallelism: nothing waits
    dp = ParallelPlan(dp=2, micro_batch=2, global_batch=4, seq_len=64, dtype="fp32")
    assert step_time(model, dp, ClusterSpec(flat, 2)).total == \
        step_time(model, dp, ClusterSpec(cpu, 2)).total


def test_dtensor_reduce_is_paid_once_per_tensor_parallel_collective():
    """A calibrated DTensor reduction cost adds exactly (tp collectives) x its value to
    tp_comm -- the same 2 + 5 per block, embedding, 3 loss and output-gradient count as the
    blocking wait -- and, with sequence parallelism, twice per block collective (a reduce-
    scatter and an all-gather in its place: 2 forward, 2 backward per block) and for the
    output layer's gather. Compute does not move; without tp nothing is added."""
    from ptd.cost.step import step_time
    model = get_preset("tiny")
    cpu = load_hardware("cpu").replace(blocking_wait_measured={})
    flat = cpu.replace(dtensor_reduce_measured={2: ((1e6, 1e-3),)})
    plan = ParallelPlan(dp=1, tp=2, micro_batch=2, global_batch=4, seq_len=64, dtype="fp32")
    base, got = (step_time(model, plan, ClusterSpec(hw, 2)) for hw in (cpu, flat))
    per_mb = model.n_layers * (2 + 5) + 1 + 3 + 1
    assert got.tp_comm - base.tp_comm == pytest.approx(plan.n_microbatches * per_mb * 1e-3)
    assert got.compute == base.compute
    sp = plan.replace(sp=True)
    base, got = (step_time(model, sp, ClusterSpec(hw, 2)) for hw in (cpu, flat))
    # per block 2 forward + 2 backward collectives, each 2 calls; the embedding's and the
    # output layer's gradient (2 calls each), the output's gather (2) and 3 loss all-reduces
    per_mb_sp = model.n_layers * 4 * 2 + 2 + 2 + 2 + 3
    assert got.tp_comm - base.tp_comm == pytest.approx(plan.n_microbatches * per_mb_sp * 1e-3)
    dp = ParallelPlan(dp=2, micro_batch=2, global_batch=4, seq_len=64, dtype="fp32")
    assert step_time(model, dp, ClusterSpec(flat, 2)).total == \
        step_time(model, dp, ClusterSpec(cpu, 2)).total


def test_a_larger_groups_collectives_pay_that_groups_wait():
    """tp 4 pays the group-of-4 curve on each of its collectives (same count as pairs);
    tp 2 beside dp 2 on the same 4 workers does not; ZeRO-3's late-peer waits over dp 4
    read it too -- a flat group curve 5x the pairs' flat curve adds 5x as much."""
    from ptd.cost.step import step_time
    model = get_preset("tiny")
    cpu = load_hardware("cpu").replace(blocking_wait_measured={})
    group = cpu.replace(blocking_wait_group_measured={4: ((0.0, 5e-3),)})
    pairs = cpu.replace(blocking_wait_measured={4: ((0.0, 1e-3),)})
    tp4 = ParallelPlan(tp=4, micro_batch=2, global_batch=4, seq_len=64, dtype="fp32")
    base, got = (step_time(model, tp4, ClusterSpec(hw, 4)) for hw in (cpu, group))
    per_mb = model.n_layers * (2 + 5) + 1 + 3 + 1
    assert got.tp_comm - base.tp_comm == pytest.approx(tp4.n_microbatches * per_mb * 5e-3)
    tp2 = tp4.replace(tp=2, dp=2, global_batch=8)
    assert step_time(model, tp2, ClusterSpec(group, 4)).total == \
        step_time(model, tp2, ClusterSpec(cpu, 4)).total
    z3 = ParallelPlan(dp=4, zero=3, micro_batch=2, global_batch=16, seq_len=64, dtype="fp32")
    b0, b_pairs, b_group = (step_time(model, z3, ClusterSpec(hw, 4)).total
                            for hw in (cpu, pairs, group))
    assert b_pairs > b0
    assert b_group - b0 == pytest.approx(5 * (b_pairs - b0))


def test_blocking_wait_is_paid_per_pipeline_receive_as_bubble():
    """On a pipeline each receive follows a chunk of computation: per micro-batch and chunk
    a rank receives an activation and a gradient, less the direction its first or last
    stage lacks (m (2v - 1) waits), counted in the bubble as the measurement counts it."""
    from ptd.cost.step import step_time
    model = get_preset("tiny")
    cpu = load_hardware("cpu").replace(blocking_wait_measured={})
    flat = cpu.replace(blocking_wait_measured={2: ((0.0, 1e-3),)})
    for v, schedule in ((1, "1f1b"), (2, "interleaved-1f1b")):
        plan = ParallelPlan(pp=2, vpp=v, schedule=schedule, micro_batch=1, global_batch=4,
                            seq_len=64, dtype="fp32")
        base, got = (step_time(model, plan, ClusterSpec(hw, 2)) for hw in (cpu, flat))
        assert got.bubble - base.bubble == pytest.approx(4 * (2 * v - 1) * 1e-3)
        assert (got.compute, got.tp_comm, got.pp_comm) == (base.compute, base.tp_comm,
                                                           base.pp_comm)


def test_blocking_wait_follows_the_compute_chunk_before_each_collective():
    """The wait is read off the calibrated curve at the rank's compute per micro-batch
    shared among its tp collectives: a curve rising with the chunk charges more where the
    chunks are longer (a longer sequence), and exactly the interpolated value."""
    from ptd.cost.step import step_time
    model = get_preset("tiny")
    cpu = load_hardware("cpu").replace(blocking_wait_measured={})
    curve = cpu.replace(blocking_wait_measured={2: ((0.0, 0.0), (1.0, 1.0))})  # wait = chunk
    for seq in (32, 64):
        plan = ParallelPlan(dp=1, tp=2, micro_batch=2, global_batch=2, seq_len=seq,
                            dtype="fp32")
        base = step_time(model, plan, ClusterSpec(cpu, 2))
        got = step_time(model, plan, ClusterSpec(curve, 2))
        # one micro-batch: per_mb waits of (its compute / per_mb) each = its compute
        assert got.tp_comm - base.tp_comm == pytest.approx(base.compute)


def test_zero12_reduction_hides_behind_backward_only_without_pp():
    """FSDP reduce-scatters each block's gradients while the next block's backward runs:
    only what does not fit behind it is exposed. Under a pipeline schedule torch defers the
    reduce-scatters to the end, where none of it hides."""
    from ptd.cost.step import step_time
    model = get_preset("gpt2").replace(tied_embeddings=False)
    a100 = ClusterSpec(load_hardware("a100-80g"), 16)
    for zero in (1, 2):
        plain = ParallelPlan(dp=16, zero=zero, micro_batch=4, global_batch=64, seq_len=1024)
        st = step_time(model, plain, a100)
        assert 0 < st.dp_comm_exposed < st.dp_comm_total
        assert step_time(model, plain, a100, dp_overlap=False).dp_comm_exposed == \
            pytest.approx(st.dp_comm_total)


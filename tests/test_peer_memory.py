"""ptd's memory figures held against the peers' own formulas, each written out here (not
ptd's code): Hugging Face parameter counts, the ZeRO paper's model states, Megatron-LM's
``theoretical_memory_usage`` (core_r0.19.0, megatron/training/theoretical_memory_usage.py).
Korthikanti et al.'s activation table is pinned in tests/test_cost.py."""

import pytest

from ptd.cost import memory as M
from ptd.cost import params as P
from ptd.specs import ParallelPlan, get_preset

GiB = 2**30

# Parameter counts of the Hugging Face checkpoints (safetensors index total_size / bytes per
# parameter; gpt2: 124,439,808 as transformers reports for GPT2LMHeadModel).
HF_PARAMS = {
    "gpt2": 124_439_808, "gpt2-355m": 354_823_168, "gpt2-774m": 774_030_080,
    "gpt2-1.5b": 1_557_611_200, "llama2-7b": 6_738_415_616, "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192, "llama3-8b": 8_030_261_248, "llama3-70b": 70_553_706_496,
    "llama3.1-405b": 405_853_388_800, "mixtral-8x7b": 46_702_792_704,
}


@pytest.mark.parametrize("name", sorted(HF_PARAMS))
def test_preset_parameter_counts_equal_hugging_face(name):
    assert get_preset(name).param_count() == HF_PARAMS[name]


def megatron_params(L, h, a, g, F, V, swiglu=True, rms=True, untied=True):
    """Megatron-LM's compute_weight_and_optimizer_memory, dense model, one shard:
    per layer 2 h^2 (1 + g/a) (attention) + 2 h F (3/2 if gated) (MLP) + 2 h n (norms,
    n = 1 for RMSNorm, 2 with LayerNorm bias); + final norm n h; + embeddings h V (twice when
    untied)."""
    n = 1 if rms else 2
    layer = 2 * h * h * (1 + g / a) + 2 * h * F * (1.5 if swiglu else 1) + 2 * h * n
    return L * layer + n * h + (2 if untied else 1) * h * V


@pytest.mark.parametrize("name,shape", [
    ("llama2-7b", (32, 4096, 32, 32, 11008, 32000)),
    ("llama3-8b", (32, 4096, 32, 8, 14336, 128256)),
])
def test_zero0_model_states_equal_megatron_theoretical_memory(name, shape):
    # Megatron without the distributed optimizer: 18 bytes per parameter (bf16 weight, fp32
    # gradient, fp32 master weight, two fp32 Adam moments). ptd's own convention holds the
    # same: fp32 weight + fp32 gradient + 8 bytes of moments, and the bf16 compute copy
    # counted in buffers.
    m = get_preset(name)
    n = megatron_params(*shape)
    assert n == HF_PARAMS[name]
    mem = M.memory(m, ParallelPlan(global_batch=1, seq_len=4096, dtype="bf16"))
    assert mem.params + mem.grads + mem.optimizer + mem.buffers == 18 * n


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_zero_convention_counts_the_16_bit_weights_once(zero):
    # ZeRO paper (Rajbhandari et al. 2020, sec. 3.1): mixed-precision Adam holds 2 + 2 + K
    # (K = 12) bytes per parameter and nothing else per parameter; at dp 1 every stage is
    # the baseline (2 + 2 + 12) Psi. Counting autocast's bf16 weight copy again in buffers
    # added 2 Psi: 12.55 GiB for Llama-2-7B.
    m = get_preset("llama2-7b")
    psi = HF_PARAMS["llama2-7b"]
    mem = M.memory(m, ParallelPlan(zero=zero, global_batch=1, seq_len=4096, dtype="bf16"),
                   convention="zero")
    assert mem.params + mem.grads + mem.optimizer == (2 + 2 + 12) * psi
    # no other per-parameter buffer at dp 1, pp 1, ZeRO 0-1; ZeRO-2 (FSDP) reduce-scatters
    # one unit's fp32 gradient at a time, the largest the root's: embeddings and output
    # layer 2 x 32000 x 4096 and the final norm's 4096 (a block, 202,383,360, is smaller)
    root = 2 * 32000 * 4096 + 4096
    assert mem.buffers == (4 * root if zero == 2 else 0)
    ptd = M.memory(m, ParallelPlan(zero=zero, global_batch=1, seq_len=4096, dtype="bf16"))
    # ptd's convention: the 16-bit copies (autocast's under DDP, the gathered parameters
    # under FSDP) are buffers, and FSDP's one-unit gradient beside them
    assert ptd.buffers == 2 * psi + (4 * root if zero else 0)
    assert 2 * psi / GiB == pytest.approx(12.55, abs=0.01)


@pytest.mark.parametrize("zero,dp,cp,per_param", [
    (0, 4, 2, 18),             # no distributed optimizer: 2 + 4 + 12
    (1, 4, 1, 6 + 12 / 4),     # 6 + 12/d, d = dp
    (1, 4, 2, 6 + 12 / 8),     # d = dp x cp: the optimizer's group includes cp
])
def test_megatron_convention_is_megatrons_distributed_optimizer_table(zero, dp, cp, per_param):
    # Megatron-LM docs/source/distrib_optimizer.md, "bf16 param, fp32 grads": 18 bytes a
    # parameter without the distributed optimizer, 6 + 12/d with it; written out here from
    # the table, with Llama 3 8B's Hugging Face count (n / 8 is a whole number: no padding)
    m = get_preset("llama3-8b")
    n = HF_PARAMS["llama3-8b"]
    plan = ParallelPlan(dp=dp, cp=cp, zero=zero, global_batch=dp, seq_len=4096, dtype="bf16")
    mem = M.memory(m, plan, convention="megatron")
    assert (mem.params, mem.grads) == (2 * n, 4 * n)  # bf16 weights, fp32 main_grad
    assert mem.params + mem.grads + mem.optimizer == per_param * n
    # nothing per parameter besides (pp 1: no send/receive buffers); with cp 2 the ring's
    # K/V exchange: two buffers (one sent, one received) of K and V for 4096 / 2 tokens at
    # 8 heads x 128 wide, bf16
    assert mem.buffers == (2 * 2 * (4096 // cp) * 8 * 128 * 2 if cp > 1 else 0)


def test_fused_swiglu_keeps_one_f_wide_tensor_less_a_token():
    # eager SwiGLU keeps gate and up (2F), SiLU(gate) (F) and the product (F); Megatron-Core's
    # bias_swiglu_impl keeps its input (2F) and recomputes SiLU, the product (F) kept as the
    # second matmul's input: 3F. bf16, s 4096, b 2, tp 4: 2 x 4096 x 2 x 14336 / 4 bytes less
    m = get_preset("llama3-8b")
    eager = M.activation_bytes_per_layer(m, 4096, 2, tp=4, sp=True)
    fused = M.activation_bytes_per_layer(m, 4096, 2, tp=4, sp=True, fused_swiglu=True)
    assert eager - fused == 2 * 4096 * 2 * 14336 / 4
    gpt = get_preset("gpt2")  # a GELU block has no SwiGLU to fuse
    assert M.activation_bytes_per_layer(gpt, 1024, 1, fused_swiglu=True) == \
        M.activation_bytes_per_layer(gpt, 1024, 1)


def test_megatron_core_stack_prices_megatrons_memory_and_convention_overrides_it(ptd_cli):
    import json
    flags = ["estimate", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "8",
             "--dp", "4", "--cp", "2", "--zero", "1", "--micro-batch", "1", "--seq-len", "8192",
             "--global-batch", "32", "--recompute", "none", "--json"]
    n = HF_PARAMS["llama3-8b"]

    def states(*extra):
        rc, out, err = ptd_cli(*flags, *extra)
        assert rc == 0, err
        mem = json.loads(out)["memory_per_device_bytes"]
        return mem["params"] + mem["grads"] + mem["optimizer"], mem["buffers"]
    ring = 2 * 2 * (8192 // 2) * 8 * 128 * 2  # cp's K/V send and receive buffers (as above)
    assert states("--stack", "megatron-core") == (7.5 * n, ring)
    # ptd's runtime (FSDP2 over dp 4): 16 bytes a parameter sharded over dp, and the bf16
    # gathered weights and unsharded fp32 gradients (accumulation: 8 micro-batches) beside
    assert states("--stack", "megatron-core", "--convention", "ptd") == states() == \
        (4 * n, 6 * n + ring)


@pytest.mark.parametrize("name,pp,split", [
    ("llama3-70b", 4, (20, 20, 20, 20)),   # Megatron-LM and torchtitan: L / pp each
    ("llama3-8b", 2, (16, 16)),
    ("llama2-7b", 8, (4,) * 8),
])
def test_layers_split_evenly_when_they_divide(name, pp, split):
    m = get_preset(name)
    plan = ParallelPlan(pp=pp, global_batch=4 * pp, seq_len=4096, dtype="bf16")
    assert P.layers_per_rank(m, plan) == split
    # the cost-balanced split only when asked for: Llama 3's 128k-vocabulary output layer
    # moves a layer off the last stage then (Llama 2's 32k one does not)
    uneven = P.layers_per_rank(m, plan.replace(uneven_stages=True))
    assert sum(uneven) == m.n_layers
    assert (uneven[-1] < split[-1]) == name.startswith("llama3")


def test_megatron_activation_formula_is_korthikanti_for_a_gpt_block():
    # Korthikanti et al. 2022, Table 2: sequence parallel + selective recompute keeps
    # 34 s b h / t bytes per layer; Megatron writes it 18 + 4 F / h with F = 4h. Plus its
    # embedding dropout mask (8 s b p) and output (s b h p), and without a pipeline the
    # output layer's 4 s b h (1 + V / h); all over t.
    from ptd.cost.megatron_memory import megatron_activation_bytes
    s, b, h, L, V, t = 2048, 4, 6144, 40, 51200, 8
    m = get_preset("gpt2").replace(n_layers=L, hidden=h, n_heads=48, n_kv_heads=48,
                                   ffn_hidden=4 * h, vocab_size=V, max_seq_len=s)
    plan = ParallelPlan(tp=t, sp=True, recompute="selective", micro_batch=b, global_batch=b,
                        seq_len=s, dtype="bf16")
    want = (34 * s * b * h * L + 8 * s * b + s * b * h + 4 * s * b * h * (1 + V / h)) / t
    assert megatron_activation_bytes(m, plan) == pytest.approx(want, rel=1e-12)


def test_estimate_names_its_convention_and_splits_405b_on_pp16(ptd_cli):
    rc, out, err = ptd_cli("estimate", "--model", "llama3.1-405b", "--hardware", "h100-sxm",
                           "--gpus", "2048", "--tp", "8", "--pp", "16", "--global-batch", "2048",
                           "--seq-len", "8192", "--schedule", "1f1b", "--vpp", "1")
    assert rc == 0, err
    chosen = next(l for l in out.splitlines() if l.startswith("chosen:"))
    # 126 layers on 16 stages: split by cost as ptd plan does, stated (not refused)
    assert "uneven_stages=True" in chosen and "layers per pipeline rank=7/" + "8/" * 14 + "7" in chosen
    assert "ptd's count, tensor by tensor (swiglu MLP unfused)" in out
    assert "Megatron-LM's formula" in out


# ------------------------------------------------ DeepSpeed's ZeRO-3 model-state estimate
def deepspeed_zero3(total, largest, gpus_per_node, nodes, offload_optimizer, offload_params,
                    zero_init=True, buffer_factor=1.5):
    """DeepSpeed 0.19.8's estimate_zero3_model_states_mem_needs (deepspeed/runtime/zero/
    stage3.py; the byte counts are docs/code-docs/source/memory.rst's), written out:
    (bytes per CPU, i.e. per node; bytes per GPU; the largest layer's bytes).

    Per GPU: the largest layer (the largest module's own parameters) gathered in 16 bits with
    its 16-bit gradient, 4 bytes per parameter; plus each GPU's 1/N share of the model
    states, 18 bytes per parameter -- 2 (16-bit parameter) + 4 (fp32 gradient) + 4 (fp32
    master) + 8 (Adam moments) -- when nothing is offloaded, only the 2-byte 16-bit share with
    the optimizer offloaded, nothing with parameters offloaded too. Per node: the offloaded
    states (18 or 16 bytes per parameter over the nodes), or without offload the largest
    layer per GPU when models are built partitioned (zero_init), times 1.5 headroom."""
    gpus = gpus_per_node * nodes
    layer = 4 * largest
    if offload_optimizer:
        host = 18 if offload_params else 16
        gpu = layer if offload_params else layer + int(2 * total / gpus)
        per_param = host / nodes if zero_init else max(4 * gpus_per_node, host / nodes)
        cpu = total * per_param * buffer_factor
    else:
        gpu = layer + int(18 * total / gpus)
        cpu = (largest if zero_init else total) * 4 * gpus_per_node * buffer_factor
    return int(cpu), int(gpu), layer


# (preset, its largest module: the V x h embedding / output matrix, larger than any h x F
# matrix of these models -- Hugging Face's module tree, DeepSpeed's model_to_params)
ZERO3_CASES = [("llama2-7b", 32000 * 4096), ("llama3-8b", 128256 * 4096),
               ("llama3-70b", 128256 * 8192), ("llama2-70b", 32000 * 8192)]
ZERO3_LAYOUTS = [(8, 1), (8, 2), (8, 8)]  # (GPUs per node, nodes)


def _ptd_zero3_states(ptd_cli, name, gpus, per_node, *extra):
    rc, out, err = ptd_cli("estimate", "--model", name, "--hardware", "h100-sxm", "--gpus",
                           str(gpus), "--gpus-per-node", str(per_node), "--zero", "3",
                           "--global-batch", str(gpus), "--seq-len", "4096", "--json", *extra)
    assert rc == 0, err
    mem = __import__("json").loads(out)["memory_per_device_bytes"]
    return mem["params"] + mem["grads"] + mem["optimizer"]


@pytest.mark.parametrize("name,largest", ZERO3_CASES)
def test_zero3_model_states_against_deepspeeds_estimate(ptd_cli, name, largest):
    psi = HF_PARAMS[name]
    for per_node, nodes in ZERO3_LAYOUTS:
        n = per_node * nodes
        _, gpu, layer = deepspeed_zero3(psi, largest, per_node, nodes, False, False)
        partition = gpu - layer  # DeepSpeed's per-GPU share of the model states
        assert partition == 18 * psi // n
        # ptd under the ZeRO paper's convention, (2 + 2 + 12) / N bytes per parameter: the
        # one difference is the gradient share, which DeepSpeed counts at fp32 (4 bytes)
        # where the paper (and ptd) count it in 16 bits (2 bytes)
        zero = _ptd_zero3_states(ptd_cli, name, n, per_node, "--convention", "zero")
        assert zero + 2 * psi // n == partition, (name, n, zero, partition)
        # ptd's own convention ((4 + 4 + 8) / N, what its FSDP runtime holds: the fp32 shard
        # is also the master copy) holds the same 16 bytes per parameter
        assert _ptd_zero3_states(ptd_cli, name, n, per_node) == zero
        # everything offloaded (ptd's --offload moves parameters and optimizer states):
        # no model-state share on the GPU, as in DeepSpeed's offload_param + offload_optimizer
        _, gpu_off, _ = deepspeed_zero3(psi, largest, per_node, nodes, True, True)
        assert gpu_off - layer == 0 == _ptd_zero3_states(ptd_cli, name, n, per_node, "--offload")


def test_deepspeed_runs_the_zero3_formula_written_here(tmp_path):
    """DeepSpeed's own estimator (in .venv-interop, built by scripts/setup) gives what
    ``deepspeed_zero3`` above writes out, for every offload variant and layout."""
    import json
    import subprocess
    from pathlib import Path
    py = Path(__file__).resolve().parents[1] / ".venv-interop" / "bin" / "python"
    assert py.exists(), "run scripts/setup (it builds .venv-interop)"
    cases = [(HF_PARAMS[name], largest, g, nodes, off, par, init)
             for name, largest in ZERO3_CASES for g, nodes in ZERO3_LAYOUTS
             for off, par in ((False, False), (True, False), (True, True))
             for init in (True, False)]
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    code = ("import json, sys\n"
            "from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs as f\n"
            "cases = json.load(open(sys.argv[1]))\n"
            "print(json.dumps([f(total_params=t, largest_layer_params=l, num_gpus_per_node=g,"
            " num_nodes=n, cpu_offload=o, cpu_offload_params=p, zero_init=i)"
            " for t, l, g, n, o, p, i in cases]))")
    r = subprocess.run([str(py), "-c", code, str(tmp_path / "cases.json")], capture_output=True,
                       text=True, timeout=240, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                                                    "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    theirs = json.loads(r.stdout.strip().splitlines()[-1])
    assert [list(deepspeed_zero3(*c)) for c in cases] == theirs


def test_estimate_json_names_the_activation_convention_and_gives_megatrons(ptd_cli):
    # GPT-3 175B with selective recompute at t = 1 (Megatron's formula assumes sp when t > 1): Megatron-LM's figure, written out as in
    # test_megatron_activation_formula_is_korthikanti_for_a_gpt_block; V is the vocabulary
    # as Megatron pads it, 50257 up to a multiple of 128: 393 x 128 = 50304
    import json
    s, b, h, L, V, t = 2048, 2, 12288, 96, 50304, 1
    rc, out, err = ptd_cli("estimate", "--model", "gpt3-175b", "--hardware", "h100-sxm",
                           "--gpus", "8", "--global-batch", "16", "--seq-len", str(s),
                           "--micro-batch", str(b), "--recompute", "selective", "--zero", "3",
                           "--json")
    assert rc == 0, err
    d = json.loads(out)
    act = d["activation_convention"]
    assert act["used"] == "ptd" and act["selective_sp"] is False
    want = (34 * s * b * h * L + 8 * s * b + s * b * h + 4 * s * b * h * (1 + V / h)) / t
    assert act["megatron_selective_bytes"] == pytest.approx(want, rel=1e-12)
    # the plan itself is the selective one: the figure used is the one the memory total holds
    assert act["ptd_selective_bytes"] == d["memory_per_device_bytes"]["activations"]

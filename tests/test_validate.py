"""ptd validate, the matmul shape model and the stacks: the rules that read a published case,
checked on hand-built cases whose expected values are worked out here."""

import csv
import json
import math
import statistics
from pathlib import Path

import pytest

from ptd.cost.compute import Gemm, gemm_time, shape_efficiency
from ptd.cost.validate import (case_model, case_plan, case_stack, load_cases,
                               network_per_gpu, price, summarize)
from ptd.errors import PtdError
from ptd.specs.hardware import get_hardware_preset

DATA = Path(__file__).parent / "data"


# ------------------------------------------------------------------ the shape model
def test_shape_efficiency_by_hand():
    # 4096^3 on 132 SMs. 256x128 tiles: 16 x 32 = 512 tiles, ceil(512/132) = 4 waves,
    # 512 / (4 * 132) = 0.9697; 128x128: 1024 tiles in 8 waves, same 0.9697 but x 0.93;
    # 128x64: 2048 in 16 waves, x 0.80. Best 0.9697, times k/(k+128) = 4096/4224.
    assert shape_efficiency(4096, 4096, 4096, 132) == pytest.approx(512 / 528 * 4096 / 4224)
    # 256 x 256 x 4096 fills one wave partly: 256x128 tiles use 2 of 132 SMs (2/132 of the
    # wave's capacity); 128x64 tiles use 8 of 132 at 0.8 of the rate (8/132 * 0.8): better.
    small = 256 * 256 / (132 * 256 * 128)
    tiny_tiles = 0.8 * 256 * 256 / (132 * 128 * 64)
    assert shape_efficiency(256, 256, 4096, 132) == pytest.approx(max(small, tiny_tiles) * 4096 / 4224)
    # a partial tile at the edge: m = 257 needs a second row of 256-tiles
    assert shape_efficiency(257, 128 * 132, 1 << 20, 132) < shape_efficiency(256, 128 * 132, 1 << 20, 132)


def test_gemm_time_uses_the_shape_model_only_where_the_device_has_one():
    h100, cpu = get_hardware_preset("h100-sxm"), get_hardware_preset("cpu")
    g = Gemm(4096, 4096, 4096)
    rate, bw = 800e12, 3e12
    assert gemm_time(g, rate, bw, 2) == pytest.approx(g.flops / rate)  # no device: roofline
    assert gemm_time(g, rate, bw, 2, cpu) == pytest.approx(g.flops / rate)  # CPU: no SMs
    eff = 512 / 528 * 4096 / 4224
    assert gemm_time(g, rate, bw, 2, h100) == pytest.approx(g.flops / (rate * eff) + 10.5e-6)


def test_shape_model_reproduces_the_h100_layer_products_it_was_calibrated_on():
    # The tile set, K_FILL and the launch cost were chosen on this measurement (calibration
    # on a microbenchmark; the large-matmul efficiency 0.80 is Bekman's published maximum,
    # not fitted). This guards the model against drifting from it: median 6.4% and p90
    # 20.6% when written.
    hw = get_hardware_preset("h100-sxm")
    rows = [r for r in csv.DictReader(l for l in (DATA / "h100_layer_gemms.csv").open()
                                       if not l.startswith("#"))]
    assert len(rows) == 1008
    errs = []
    for r in rows:
        m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
        t = gemm_time(Gemm(m, n, k), hw.peak("bf16") * hw.gemm_efficiency,
                      hw.effective_memory_bandwidth, 2, hw)
        errs.append(abs(2 * m * n * k / t / float(r["flops_per_s"]) - 1))
    errs.sort()
    assert statistics.median(errs) < 0.08
    assert errs[int(0.9 * len(errs))] < 0.25


# ------------------------------------------------------------------ reading a case
def _case(**over):
    c = {"id": "x", "source": "Someone et al. 2023, a paper",
         "model": {"layers": 32, "hidden": 4096, "heads": 32, "ffn_hidden": 14336,
                   "vocab": 128256, "seq_len": 8192, "params_b": 8.03},
         "hardware": {"gpu": "H100 80GB", "peak_tflops": 989, "gpus_per_node": 8, "gpus_total": 64},
         "plan": {"tp": 1, "pp": 1, "dp": 64, "cp": 1, "vpp": None, "zero": 3, "micro_batch": 1,
                  "global_batch": 64, "recompute": "selective (op)", "sequence_parallel": False},
         "measured": {"mfu": 0.5}, "notes": ""}
    for k, v in over.items():
        c[k] = {**c[k], **v} if isinstance(v, dict) else v
    return c


def test_architecture_is_the_one_whose_parameter_count_matches():
    # Llama 3 8B: SwiGLU with 8 KV heads has 32*(2*4096^2 + 2*4096*1024 + 3*4096*14336)
    # + 2*128256*4096 = 8.03e9 parameters; multi-head SwiGLU would have 8.83e9.
    m = case_model(_case())
    assert (m.mlp, m.n_kv_heads, m.norm, m.position) == ("swiglu", 8, "rmsnorm", "rope")
    # GPT-3 175B: 12 l h^2 + V h = 174.6e9 with a GELU MLP and multi-head attention
    gpt = case_model(_case(model={"layers": 96, "hidden": 12288, "heads": 96, "ffn_hidden": 49152,
                                  "vocab": 51200, "seq_len": 2048, "params_b": 174.6}))
    assert (gpt.mlp, gpt.n_kv_heads, gpt.position) == ("gelu", 96, "learned")
    assert case_model(_case(model={"mlp": "gelu", "kv_heads": 32})).mlp == "gelu"


@pytest.mark.parametrize("text,per_gpu", [
    ("A100 (8x200Gb/s HDR IB per node)", 8 * 200e9 / 8 / 8),
    ("H100 80GB; 800Gbps inter-node", 800e9 / 8 / 8),
    ("H100 (700 W), 400 Gb/s RoCE per GPU", 400e9 / 8),
    ("Ampere; 8x200G NICs per server", 8 * 200e9 / 8 / 8),
    ("H100 (DGX-class; interconnect not stated)", None),
])
def test_network_rate_from_the_hardware_text(text, per_gpu):
    assert network_per_gpu(text, 8) == per_gpu


def test_plan_rules():
    model = case_model(_case())
    plan, free = case_plan(_case(plan={"zero": "distributed optimizer likely (not stated)",
                                       "recompute": "not stated", "micro_batch": None,
                                       "sequence_parallel": None}), model)
    assert plan.zero == 1  # Megatron's distributed optimizer shards optimizer states
    assert {"micro_batch", "recompute", "sp"} <= set(free)
    assert case_plan(_case(plan={"zero": "2 (MegaScale Fig.1)"}), model)[0].zero == 2
    assert case_plan(_case(), model)[0].recompute == "selective"
    assert case_plan(_case(notes="Mixed precision fp16; end-to-end"), model)[0].dtype == "fp16"
    assert case_plan(_case(plan={"cp": None}), model)[0].cp == 1
    # context parallelism takes its share of the GPUs: dp 32 x cp 2 on 64
    cp2 = case_plan(_case(plan={"dp": 32, "cp": 2}), model)[0]
    assert (cp2.dp, cp2.cp, cp2.world_size) == (32, 2, 64)
    with pytest.raises(PtdError, match=r"tp x pp x dp x cp = 128 is not the 64 GPUs"):
        case_plan(_case(plan={"cp": 2}), model)
    with pytest.raises(PtdError, match=r"tp x pp x dp = 32 is not the 64 GPUs"):
        case_plan(_case(plan={"dp": 32}), model)
    with pytest.raises(PtdError, match="plan.cp must be a positive whole number"):
        case_plan(_case(plan={"cp": 0}), model)


def test_stack_rule():
    assert case_stack(_case(source="Narayanan et al. 2021, Megatron-LM, SC21")) == "megatron-2021"
    assert case_stack(_case(source="NVIDIA/Megatron-LM README 2024; Megatron-Core r0.8.0")) == \
        "megatron-core"
    # a Megatron-LM run of 2023-24 that names none of the options Megatron-Core's stack
    # prices ran Megatron-LM's defaults then: local attention, no gradient-reduction overlap
    assert case_stack(_case(source="Jiang et al. 2024, MegaScale",
                            notes="Megatron-LM baseline (commit x)")) == "megatron-2021"
    assert case_stack(_case(source="pytorch/torchtitan docs")) == "torchtitan"
    assert case_stack(_case(source="PyTorch blog, FSDP")) == "ptd"
    assert case_stack(_case(stack="deepspeed")) == "deepspeed"
    # DeepSpeed's era: 2021 or earlier -> deepspeed-2021 (per-tensor ZeRO-3 gathers)
    assert case_stack(_case(source="Smith et al. 2022, Megatron-DeepSpeed")) == "deepspeed"
    assert case_stack(_case(source="Rajbhandari et al. 2021, DeepSpeed ZeRO-Infinity")) == \
        "deepspeed-2021"
    # Megatron-LM of 2021 had no ZeRO: a ZeRO plan in a paper of that era ran on the engine
    # the notes name; without ZeRO, or with notes naming none, the source decides
    sc21 = dict(source="Narayanan et al. 2021, Megatron-LM, SC21", notes="ZeRO-3 via DeepSpeed")
    assert case_stack(_case(plan={"zero": 3}, **sc21)) == "deepspeed-2021"
    assert case_stack(_case(plan={"zero": "2 (stated)"}, **sc21)) == "deepspeed-2021"
    assert case_stack(_case(plan={"zero": 0}, **sc21)) == "megatron-2021"
    assert case_stack(_case(plan={"zero": 3}, source=sc21["source"], notes="")) == "megatron-2021"


def test_unpriceable_cases_are_error_rows_with_the_reason():
    rows = [price(_case(hardware={"gpu": "TPU v4"})), price(_case(plan={"dp": 32})), price(_case())]
    assert "no hardware preset" in rows[0].error and rows[0].rel_error is None
    assert "is not the 64 GPUs" in rows[1].error
    assert rows[2].error == "" and rows[2].metric == "mfu" and rows[2].predicted > 0
    s = summarize(rows)
    assert s["overall"]["cases"] == 1 and s["overall"]["errors"] == 2


@pytest.mark.parametrize("over,message", [
    ({"hardware": {"peak_tflops": "abc"}}, "hardware.peak_tflops must be a positive number"),
    ({"hardware": {"peak_tflops": 0}}, "hardware.peak_tflops must be a positive number"),
    ({"hardware": {"peak_tflops": float("inf")}}, "hardware.peak_tflops must be a positive number"),
    ({"hardware": {"gpus_total": float("inf")}}, "hardware.gpus_total must be a positive whole"),
    ({"model": {"layers": float("inf")}}, "model.layers must be a positive whole"),
    ({"plan": {"micro_batch": float("nan")}}, "plan.micro_batch must be a positive whole"),
])
def test_bad_numbers_in_a_case_are_its_error_row(over, message):
    r = price(_case(**over))
    assert message in r.error and r.rel_error is None


def test_mfu_is_compared_over_the_cases_own_peak():
    # MFU = model FLOP/s / peak: the same run over half the peak reads twice the MFU. The
    # case's peak is the published figure's denominator, whatever ptd's preset says.
    full, half = price(_case()), price(_case(hardware={"peak_tflops": 989 / 2}))
    assert full.error == half.error == "" and full.metric == half.metric == "mfu"
    assert half.predicted == pytest.approx(2 * full.predicted, rel=1e-12)
    none = price(_case(hardware={"peak_tflops": None}))  # no peak given: the preset's
    from ptd.specs import load_hardware
    assert none.predicted == pytest.approx(full.predicted * 989e12 / load_hardware("h100-sxm").peak("bf16"),
                                           rel=1e-12)


def test_context_parallel_cases_are_priced_with_cp():
    # Llama 3 405B's long-context row is the kind of case this is for: cp takes GPUs from dp
    r = price(_case(model={"seq_len": 32768}, plan={"dp": 16, "cp": 4, "global_batch": 16}))
    assert r.error == "" and "cp4" in r.plan and 0 < r.predicted < 1
    # the same 32k-token sequences whole on each GPU do not fit: selective recompute keeps
    # ~34 bytes per token and hidden unit a layer (Korthikanti et al. 2022),
    # 32768 x 4096 x 34 B x 32 layers ~ 146 GB against 80
    r1 = price(_case(model={"seq_len": 32768}, plan={"dp": 64, "cp": 1, "global_batch": 64}))
    assert r1.error.startswith("does not fit")


def test_mixture_of_experts_cases_name_their_experts_and_ep():
    # Mixtral 8x7B's shape: 8 experts, 2 a token; its 46.7e9 parameters are 32 x (attention
    # 2 x 4096^2 + 2 x 4096 x 1024, router 8 x 4096, 8 experts x 3 x 4096 x 14336) + norms and
    # 2 x 32000 x 4096 embeddings -- nearest to params_b with SwiGLU and 8 key/value heads
    moe = {"layers": 32, "hidden": 4096, "heads": 32, "ffn_hidden": 14336, "vocab": 32000,
           "seq_len": 4096, "params_b": 46.7, "experts": 8, "top_k": 2}
    m = case_model(_case(model=moe))
    assert (m.n_experts, m.top_k, m.mlp, m.n_kv_heads) == (8, 2, "swiglu", 8)
    assert m.param_count() == pytest.approx(46.70e9, rel=1e-3)
    plan, _ = case_plan(_case(model=moe, plan={"dp": 64, "ep": 8, "zero": 1}), m)
    assert plan.ep == 8
    assert case_plan(_case(), case_model(_case()))[0].ep == 1  # no ep: 1
    r = price(_case(model=moe, plan={"dp": 64, "ep": 8, "zero": 1, "recompute": "full"}))
    assert r.error == "" and "ep8" in r.plan
    for over, message in [({"model": {**moe, "top_k": 9}}, "model.top_k 9 is more than model.experts 8"),
                          ({"model": {**moe, "top_k": None}}, "model.top_k must be a positive whole"),
                          ({"model": {**moe, "experts": 0}}, "model.experts must be a positive whole"),
                          ({"model": moe, "plan": {"ep": 1.5}}, "plan.ep must be a positive whole")]:
        assert message in price(_case(**over)).error


def test_summary_quantiles_by_hand():
    from ptd.cost.validate import CaseResult
    rows = [CaseResult(id=str(i), source="s", metric="mfu", published=1.0, predicted=1.0 + e)
            for i, e in enumerate([0.1, -0.2, 0.3, -0.4, 0.5])]
    s = summarize(rows)["s"]
    # |errors| 0.1 0.2 0.3 0.4 0.5: median 0.3; p90 at position 3.6 -> 0.4 + 0.6 * 0.1
    assert s["median"] == pytest.approx(0.3) and s["p90"] == pytest.approx(0.46)
    assert s["max"] == pytest.approx(0.5)


# ------------------------------------------------------------------ the command
def test_validate_prices_every_shipped_case(ptd_cli):
    rc, out, _ = ptd_cli("validate", "--json")
    data = json.loads(out)
    assert rc == 0 and len(data["cases"]) == len(load_cases()) == 27
    assert all(c["error"] is None and math.isfinite(c["rel_error"]) for c in data["cases"])
    assert data["summary"]["overall"]["cases"] == 27
    rc, out, _ = ptd_cli("validate")
    assert rc == 0 and "median |error|" in out and "narayanan2021_t1_1.7b" in out


def test_validate_holds_the_issue_tolerances():
    # Issue 14's tolerances, as the issue states them: every case priced, median |error| <=
    # 10% and p90 <= 20% (on 2026-11-28: 3.2% and 11.7%, docs/validation.md).
    rows = [price(c) for c in load_cases()]
    s = summarize(rows)["overall"]
    assert s["errors"] == 0 and s["cases"] == 27
    assert s["median"] <= 0.10
    assert s["p90"] <= 0.20


def test_dropout_is_priced_only_where_a_case_states_it():
    c = next(c for c in load_cases() if c["id"] == "megatron_h100_2024_16b")
    assert case_model(c).dropout == 0.0
    c = {**c, "model": {**c["model"], "dropout": 0.1}}
    assert case_model(c).dropout == 0.1
    # dropout's masks and passes make the same plan slower
    assert price(c).predicted < price({**c, "model": {**c["model"], "dropout": 0}}).predicted
    for bad in (1, -0.1, "0.1", True):
        with pytest.raises(PtdError, match=r"^model.dropout must be a probability in \[0, 1\), got "):
            case_model({**c, "model": {**c["model"], "dropout": bad}})


def test_held_out_cases_load_and_are_all_priced():
    # docs/data/heldout/cases.yaml (validation.md quotes its tables): the file stays valid
    # for the loader, and every case prices but the four rows validation.md quotes as not
    # fitting: two DGX Cloud rows (at the smallest dp of their recipes) and Llama 3 405B's
    # two 8K-token runs, which the paper says ran without activation checkpointing -- any
    # other error row would be a miss the docs do not state. The Grok-1 MoE rows fit once
    # Megatron-Core's experts are split over tp (with them whole on every tp rank they
    # needed ~200 GiB a device)
    path = Path(__file__).resolve().parents[1] / "docs/data/heldout/cases.yaml"
    rows = [price(c) for c in load_cases(path)]
    assert len(rows) == 43
    assert {r.id: r.error.split(":")[0] for r in rows if r.error} == {
        "dgxc_llama31_8b_8": "does not fit", "dgxc_nemotron4_340b_128": "does not fit",
        "llama3_405b_8k_gpus": "does not fit", "llama3_405b_16k_gpus": "does not fit"}
    assert len({r.id for r in rows}) == 43
    grok = [r for r in rows if r.id.startswith("dgxc_grok1")]
    assert len(grok) == 9 and all(r.metric == "iter_time_s" for r in grok)


@pytest.mark.parametrize("content,message", [
    ("cases: [", "not valid YAML"),
    ("meta: {}", "no 'cases' list"),
    ("cases:\n- id: a\n  model: {layers: 2}\n", "'model.hidden' is missing"),
    ("cases:\n- id: a\n  stack: nemo\n  model: {layers: 1, hidden: 1, heads: 1, ffn_hidden: 1, vocab: 1, "
     "seq_len: 1}\n  hardware: {gpu: H100, gpus_total: 1}\n  plan: {tp: 1, pp: 1, dp: 1, global_batch: 1}\n"
     "  measured: {mfu: 0.5}\n", "unknown stack 'nemo'"),
])
def test_malformed_cases_file_is_one_line_exit_2(tmp_path, content, message):
    import subprocess
    import sys
    f = tmp_path / "c.yaml"
    f.write_text(content)
    r = subprocess.run([sys.executable, "-m", "ptd", "validate", "--cases", str(f)],
                       capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
    assert lines[0].startswith("ptd validate: error:")


# ------------------------------------------------------------------ the planner follows
def test_sc21_ptd_p_ranks_above_zero3_on_1536_a100():
    # Narayanan et al. 2021, Table 2: GPT-3 175B on 1536 A100s, batch 1536, fp16: PTD-P
    # (tp 8, pp 12) 141 TFLOP/s per GPU, ZeRO-3 with dp 1536 44 TFLOP/s. The issue's own
    # command, `ptd plan --model gpt3-175b --hardware a100-80g --gpus 1536 --global-batch
    # 1536 --seq-len 2048 --dtype fp16`: the preset as it is (tied embeddings, which ptd
    # trains over pipeline stages; fp16 loss scaling in the pipeline schedules), every knob
    # searched.
    from ptd.planner.search import search
    from ptd.specs.hardware import ClusterSpec
    from ptd.specs.model import get_preset
    m = get_preset("gpt3-175b")
    assert m.tied_embeddings
    r = search(m, ClusterSpec(get_hardware_preset("a100-80g"), 1536), 1536, 2048, dtype="fp16")
    rank = {id(e): i for i, e in enumerate(r.ranked)}
    ptdp = next(e for e in r.ranked if e.plan.tp == 8 and e.plan.pp >= 8)
    zero3 = next(e for e in r.ranked if e.plan.dp == 1536 and e.plan.zero == 3)
    assert rank[id(ptdp)] < rank[id(zero3)]
    assert ptdp.step.total < zero3.step.total
    # and the top plan is a pipelined (PTD-P) layout, not ZeRO-3 without model parallelism
    top = r.ranked[0].plan
    assert top.pp > 1 and top.tp > 1 and top.zero < 3, top.describe()


def test_small_kernels_are_bound_by_their_issue_time_on_a_gpu():
    # A block of the tiny model does microseconds of work per operator; on an H100 its
    # forward then takes (operators) x 10.5 us, the measured back-to-back launch cost.
    from ptd.cost.compute import block_ops, block_time
    from ptd.specs.model import get_preset
    hw, m = get_hardware_preset("h100-sxm"), get_preset("tiny")
    t = block_time(m, hw, 256, 8, 1, False, "bf16", hw.peak("bf16") * hw.gemm_efficiency)
    f, b = block_ops(m)
    assert t.forward == pytest.approx(f * 10.5e-6) and t.backward == pytest.approx(b * 10.5e-6)
    # a Llama 3 8B block on 2 x 4096 tokens is bound by its kernels: the floor (80 operators,
    # 0.84 ms) is not what sets its forward (6.5 ms: 218 M parameters x 2 x 8192 tokens at
    # ~0.55-0.6 of the peak)
    big_model = get_preset("llama3-8b")
    big = block_time(big_model, hw, 4096, 2, 1, False, "bf16", hw.peak("bf16") * hw.gemm_efficiency)
    assert big.forward > 5 * block_ops(big_model)[0] * 10.5e-6


"""cost/validate.py by hand: written from the survivors of a sampled mutation run (issue 21).

The rules that read a published case (the module docstring states them), the table's
summary and its error rows, each expected value worked out beside it. Nothing here calls the
code under test for an expected value."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from ptd.cost import validate as V
from ptd.errors import PtdError


def case(**over):
    """A small case: 32 layers on 64 H100s, every knob stated."""
    c = {"id": "c1", "source": "Someone et al. 2023, a paper",
         "model": {"layers": 32, "hidden": 4096, "heads": 32, "ffn_hidden": 14336,
                   "vocab": 128256, "seq_len": 8192, "params_b": 8.03},
         "hardware": {"gpu": "H100 80GB", "gpus_per_node": 8, "gpus_total": 64},
         "plan": {"tp": 1, "pp": 1, "dp": 64, "vpp": 1, "zero": 0, "micro_batch": 1,
                  "global_batch": 64, "recompute": "none", "sequence_parallel": False},
         "measured": {"mfu": 0.5}, "notes": ""}
    for k, v in over.items():
        c[k] = {**c[k], **v} if isinstance(v, dict) else v
    return c


# ------------------------------------------------------------------- the model
# 1 layer, h 12, 3 heads of 4, F 48, V 128, 16 positions. GPT (GELU, LayerNorm, learned
# positions, biases): attention 4 h^2 + 4 h = 576 + 48 = 624, MLP 2 h F + F + h = 1152 + 60
# = 1212, norms 4 h = 48: a block 1884; embedding 1536, positions 192, final norm 24, output
# 1536: 5172. With one key/value head (kv 4): attention 144 + 2 x 48 + 144 + (12 + 8 + 12)
# = 416, 208 fewer: 4964. SwiGLU (no biases, RMSNorm, RoPE): attention 576, MLP 3 h F = 1728,
# norms 24: 2328 + 1536 + 12 + 1536 = 5412; with one kv head 384 attention: 5220.
ODD = {"layers": 1, "hidden": 12, "heads": 3, "ffn_hidden": 48, "vocab": 128, "seq_len": 16}


def test_odd_head_count_keeps_the_multi_head_candidate():
    # 3 heads: kv candidates 1 and 3. params_b 5172e-9 is the multi-head GPT exactly (the
    # nearest single-kv candidate, SwiGLU's 5220, is 48 away)
    m = V.case_model(case(model={**ODD, "params_b": 5172e-9}))
    assert (m.mlp, m.n_kv_heads, m.norm, m.position, m.bias) == ("gelu", 3, "layernorm",
                                                                 "learned", True)
    # 5220e-9 is SwiGLU with one kv head
    m = V.case_model(case(model={**ODD, "params_b": 5220e-9}))
    assert (m.mlp, m.n_kv_heads, m.norm, m.position, m.bias) == ("swiglu", 1, "rmsnorm",
                                                                 "rope", False)
    assert (m.n_layers, m.hidden, m.n_heads, m.ffn_hidden, m.vocab_size, m.max_seq_len) == \
        (1, 12, 3, 48, 128, 16)
    # the overrides: mlp and kv_heads stated
    m = V.case_model(case(model={**ODD, "params_b": 5172e-9, "mlp": "swiglu", "kv_heads": 1}))
    assert (m.mlp, m.n_kv_heads) == ("swiglu", 1)


def test_without_a_parameter_count_the_model_is_a_multi_head_gpt():
    # "no count to match: the first candidate (GPT, multi-head)" -- every query head with its
    # own key/value head (before the fix, one key/value head: multi-query attention)
    m = V.case_model(case(model={**ODD, "params_b": None}))
    assert (m.mlp, m.n_kv_heads, m.position) == ("gelu", 3, "learned")
    m = V.case_model(case(model={**ODD, "heads": 4, "hidden": 16, "params_b": None}))
    assert (m.mlp, m.n_kv_heads) == ("gelu", 4)
    # a stated kv count or block kind still holds
    m = V.case_model(case(model={**ODD, "params_b": None, "kv_heads": 1, "mlp": "swiglu"}))
    assert (m.mlp, m.n_kv_heads) == ("swiglu", 1)


def test_whole_numbers_are_checked():
    assert V._int(4.0, "x") == 4
    for bad in (True, 0, -2, 2.5, "4", None):
        with pytest.raises(PtdError, match=r"^plan\.tp must be a positive whole number"):
            V._int(bad, "plan.tp")


# -------------------------------------------------------------------- the plan
def test_plan_knobs_stated_and_left_free():
    model = V.case_model(case())
    plan, free = V.case_plan(case(), model)
    # every knob stated: only the schedule is free; vpp 1 is plain 1F1B
    assert free == ["schedule"]
    assert (plan.tp, plan.pp, plan.dp, plan.global_batch, plan.micro_batch, plan.vpp) == \
        (1, 1, 64, 64, 1, 1)
    assert (plan.schedule, plan.recompute, plan.sp, plan.zero, plan.seq_len, plan.dtype) == \
        ("1f1b", "none", False, 0, 8192, "bf16")
    # left null: chosen, in FREE_KNOBS order (micro_batch, zero, recompute, vpp, schedule, sp)
    plan, free = V.case_plan(case(plan={"vpp": None, "micro_batch": None, "recompute": None,
                                        "sequence_parallel": None}), model)
    assert free == ["micro_batch", "recompute", "vpp", "schedule", "sp"]
    assert plan.schedule == "1f1b"
    # vpp 2: interleaved 1F1B, the schedule no longer free
    plan, free = V.case_plan(case(plan={"pp": 4, "dp": 16, "vpp": 2}), model)
    assert (plan.schedule, plan.vpp) == ("interleaved-1f1b", 2) and free == []
    # 32 layers: even over pp 4, uneven over pp 3 (tp 1 x pp 3 x dp 21 = 63 GPUs)
    assert not plan.uneven_stages
    plan, _ = V.case_plan(case(plan={"pp": 3, "dp": 21}, hardware={"gpus_total": 63}), model)
    assert plan.uneven_stages
    # sequence parallelism stated true only counts with tp > 1
    assert not V.case_plan(case(plan={"sequence_parallel": True}), model)[0].sp
    assert V.case_plan(case(plan={"tp": 2, "dp": 32, "sequence_parallel": True}), model)[0].sp
    # fp16 when the notes say so
    assert V.case_plan(case(notes="trained in float16"), model)[0].dtype == "fp16"
    assert V.case_plan(case(notes="bf16 mixed precision"), model)[0].dtype == "bf16"


def test_plan_refusals_name_the_numbers():
    model = V.case_model(case())
    with pytest.raises(PtdError) as e:  # 2 x 2 x 3 = 12 GPUs, not 8
        V.case_plan(case(plan={"tp": 2, "pp": 2, "dp": 3}, hardware={"gpus_total": 8}), model)
    assert str(e.value) == "tp x pp x dp = 12 is not the 8 GPUs of the case"
    with pytest.raises(PtdError) as e:  # cp takes GPUs too: 1 x 1 x 64 x 4
        V.case_plan(case(plan={"cp": 4}), model)
    assert str(e.value) == "tp x pp x dp x cp = 256 is not the 64 GPUs of the case"
    assert V.case_plan(case(plan={"cp": 1}), model)[0].dp == 64  # cp 1 is no cp
    assert V.case_plan(case(plan={"cp": 4, "dp": 16}), model)[0].cp == 4


def test_zero_and_recompute_texts():
    assert [V._zero(v) for v in (3, 0, "1 (stated)", " 2", "distributed optimizer",
                                 "Distributed Optimizer likely", "none", None, "")] == \
        [3, 0, 1, 2, 1, 1, 0, 0, 0]
    assert [V._recompute(v) for v in ("full", " Selective (attention)", "NONE", "not stated",
                                      None, "partial full")] == \
        ["full", "selective", "none", None, None, None]


# ------------------------------------------------------------ hardware, stack
def test_cluster_from_the_hardware_text():
    c = V.case_cluster(case(hardware={"gpu": "A100 SXM 40GB", "gpus_total": 16}))
    assert (c.hardware.name, c.n_devices, c.devices_per_node) == ("a100-40g", 16, 8)
    c = V.case_cluster(case(hardware={"gpu": "A100-SXM4-80GB", "gpus_total": 4,
                                      "gpus_per_node": None}))
    assert (c.hardware.name, c.n_devices, c.devices_per_node) == ("a100-80g", 4, 4)  # min(8, 4)
    # 4 x 100 Gb/s per node of 4 GPUs: 4 x 12.5e9 B/s / 4 = 12.5e9 per GPU
    c = V.case_cluster(case(hardware={"gpu": "H100, 4x100Gb/s per node", "gpus_total": 8,
                                      "gpus_per_node": 4}))
    assert c.hardware.name == "h100-sxm" and c.hardware.inter_node.bandwidth == 12.5e9
    with pytest.raises(PtdError) as e:
        V.case_cluster(case(hardware={"gpu": "TPU v4"}))
    assert str(e.value) == "no hardware preset for 'TPU v4' (known: A100, H100)"


def test_network_rate_per_node_or_per_gpu():
    # 2 x 100 Gbps per node of 4: 2 x 12.5e9 / 4; 200 Gb per device: 25e9; 3.2 Gb/s alone, 8
    # to a node: 0.4e9 / 8
    assert V.network_per_gpu("2 x 100 Gbps per node", 4) == 2 * 12.5e9 / 4
    assert V.network_per_gpu("200 Gb per device", 8) == 25e9
    assert V.network_per_gpu("3.2 Gb/s", 8) == 0.4e9 / 8
    assert V.network_per_gpu("NVLink only", 8) is None


def test_stack_from_the_source_and_its_years():
    s = lambda **kw: V.case_stack(case(**kw))  # noqa: E731
    assert s(stack="torchtitan") == "torchtitan"
    assert s(source="Megatron-LM 2022 paper") == "megatron-2021"  # 2022 or earlier
    assert s(source="Megatron-LM docs") == "megatron-core"  # no year
    assert s(source="Megatron-LM 2025 release") == "megatron-core"
    assert s(source="Megatron-LM 2023, 2025 releases") == "megatron-core"  # the latest year
    # 2023-24: Megatron-LM's defaults (the 2021 kernels) unless the case names the options
    assert s(source="Megatron-LM 2023 release") == "megatron-2021"
    assert s(source="Megatron-LM 2022, 2024 releases") == "megatron-2021"  # min year rules first
    assert s(source="Megatron-LM 2024", notes="--overlap-grad-reduce") == "megatron-core"
    assert s(source="Megatron-LM 2024", notes="--tp-comm-overlap on") == "megatron-core"
    assert s(source="Megatron-LM 2024", notes="--overlap-param-gather") == "megatron-core"
    assert s(source="NVIDIA Megatron-Core 2024") == "megatron-core"
    assert s(source="Megatron-LM 2023 with Transformer Engine") == "megatron-core"
    assert s(source="Megatron-LM 2023", notes="FlashAttention-2") == "megatron-core"
    assert s(source="Megatron-LM 2023", notes="mcore GPT model") == "megatron-core"
    # the evidence may sit in the source when the notes name the project
    assert s(source="Someone 2024, flash attention", notes="Megatron-LM baseline") == "megatron-core"
    assert s(source="Someone 2024", notes="Megatron-LM baseline (commit x)") == "megatron-2021"
    assert s(source="DeepSpeed 2020, 2021 blog") == "deepspeed-2021"
    assert s(source="DeepSpeed 2021, 2022 blog") == "deepspeed"
    assert s(source="DeepSpeed docs") == "deepspeed"
    # a source naming no project: the notes decide (the source's years still count)
    assert s(source="Someone 2021", notes="ran on DeepSpeed") == "deepspeed-2021"
    assert s(source="Someone 2024", notes="torchtitan run") == "torchtitan"
    assert s(source="Someone 2024", notes="") == "ptd"
    # a ZeRO stage on 2021's Megatron-LM: the engine of the notes, unless they name none
    sc21 = "Narayanan et al. 2021, Megatron-LM"
    assert s(source=sc21, notes="via DeepSpeed", plan={"zero": "1 (stated)"}) == "deepspeed-2021"
    assert s(source=sc21, notes="via torchtitan", plan={"zero": 3}) == "torchtitan"
    assert s(source=sc21, notes="plain", plan={"zero": 3}) == "megatron-2021"
    assert s(source=sc21, notes="via DeepSpeed", plan={"zero": "0"}) == "megatron-2021"
    # a Megatron-LM run of 2023-24 had the distributed optimizer: its ZeRO stage stays there
    assert s(source="Megatron-LM 2023", notes="ZeRO-2 as in DeepSpeed",
             plan={"zero": 2}) == "megatron-2021"


# --------------------------------------------------------------- results rows
def test_relative_error_and_json_row():
    r = V.CaseResult(id="a", source="s", metric="mfu", published=0.5, predicted=0.45)
    assert r.rel_error == pytest.approx(-0.1)  # 0.45 / 0.5 - 1
    assert V.CaseResult(id="a", source="s", published=None, predicted=0.45).rel_error is None
    assert V.CaseResult(id="a", source="s", published=0.5, predicted=None).rel_error is None
    j = r.to_json()
    assert j == {"id": "a", "source": "s", "stack": "", "plan": "", "chosen": {},
                 "metric": "mfu", "published": 0.5, "predicted": 0.45,
                 "rel_error": pytest.approx(-0.1), "error": None}
    assert V.CaseResult(id="b", source="s", error="why").to_json()["error"] == "why"


def test_the_published_figure_compared():
    est = SimpleNamespace(mfu=0.4, hfu=0.5, peak=989e12)
    assert V._compare({"mfu": 0.45, "hfu": 0.6}, est) == ("mfu", 0.45, 0.4)
    # an mfu of 0 (or a flag, or a text) is no figure: the next one counts
    assert V._compare({"mfu": 0, "hfu": 0.6}, est) == ("hfu", 0.6, 0.5)
    assert V._compare({"mfu": True, "hfu": 1}, est) == ("hfu", 1.0, 0.5)
    # TFLOP/s per GPU: ptd's HFU times the peak, 0.5 x 989e12 / 1e12 = 494.5
    assert V._compare({"mfu": "n/a", "tflops_per_gpu": 150}, est) == \
        ("tflops_per_gpu", 150.0, 494.5)
    with pytest.raises(PtdError, match="no published figure"):
        V._compare({"mfu": -0.5}, est)


def test_a_measurement_is_compared_before_a_flop_rate():
    # 64 devices making 192,000 tokens/s in all: 3,000 a device; a 2.5 s step
    est = SimpleNamespace(mfu=0.4, hfu=0.5, peak=989e12, tokens_per_s=192000.0, n_devices=64,
                          step=SimpleNamespace(total=2.5))
    assert V._compare({"mfu": 0.45, "tokens_per_s": 2904, "iter_time_s": 3.0}, est) == \
        ("tokens_per_s", 2904.0, 3000.0)
    assert V._compare({"mfu": 0.45, "tokens_per_s": None, "iter_time_s": 3.0}, est) == \
        ("iter_time_s", 3.0, 2.5)
    assert V._compare({"mfu": 0.45, "tokens_per_s": 0, "iter_time_s": False}, est) == \
        ("mfu", 0.45, 0.4)
    # the sign: too fast a prediction is positive for a rate and for a time alike
    rate = V.CaseResult(id="a", source="s", metric="tokens_per_s", published=2904.0,
                        predicted=3000.0)
    time = V.CaseResult(id="a", source="s", metric="iter_time_s", published=3.0, predicted=2.5)
    assert rate.rel_error == pytest.approx(3000 / 2904 - 1)
    assert time.rel_error == pytest.approx(0.2)  # 3.0 / 2.5 - 1
    # a case with a measurement alone is a case
    assert V.FIGURES == ("tokens_per_s", "iter_time_s", "mfu", "hfu", "tflops_per_gpu")


def test_source_key():
    k = lambda src: V.source_key({"source": src})  # noqa: E731
    assert k("Narayanan et al. 2021, Megatron-LM, SC21") == "Narayanan et al. 2021"
    assert k("IBM blog: FSDP") == "IBM blog"
    assert k("'torchtitan (2024)'") == "torchtitan"
    assert k("  ") == "unknown" and V.source_key({}) == "unknown"
    assert k("x" * 50) == "x" * 40


def test_summary_of_two_sources_by_hand():
    rows = [V.CaseResult(id="a1", source="Alpha", published=0.50, predicted=0.55),  # +0.10
            V.CaseResult(id="a2", source="Alpha", published=0.40, predicted=0.30),  # -0.25
            V.CaseResult(id="b1", source="Beta", published=100.0, predicted=80.0),  # -0.20
            V.CaseResult(id="g1", source="Gamma", error="no hardware preset")]
    s = V.summarize(rows)
    # overall |errors| 0.10 0.20 0.25: median the middle one 0.20; p90 at (3 - 1) x 0.9 = 1.8:
    # 0.20 + 0.8 x 0.05 = 0.24; max 0.25; one error row
    assert s["overall"] == {"cases": 3, "median": pytest.approx(0.2), "p90": pytest.approx(0.24),
                            "max": pytest.approx(0.25), "errors": 1}
    # Alpha 0.10 0.25: median at 0.5, 0.175; p90 at 0.9, 0.10 + 0.9 x 0.15 = 0.235
    assert s["Alpha"] == {"cases": 2, "median": pytest.approx(0.175),
                          "p90": pytest.approx(0.235), "max": pytest.approx(0.25)}
    assert s["Beta"] == {"cases": 1, "median": pytest.approx(0.2), "p90": pytest.approx(0.2),
                         "max": pytest.approx(0.2)}
    assert "Gamma" not in s  # a source with no priced row has no line
    assert V.summarize([]) == {"overall": {"cases": 0, "median": None, "p90": None,
                                           "max": None, "errors": 0}}


# ---------------------------------------------------------------- cases files
TWO_CASES = """\
cases:
  - id: tpu
    source: "Invented 2026: a TPU run"
    model: {layers: 2, hidden: 64, heads: 4, ffn_hidden: 256, vocab: 128, seq_len: 32}
    hardware: {gpu: TPU v5, gpus_total: 8}
    plan: {tp: 1, pp: 1, dp: 8, global_batch: 8}
    measured: {mfu: 0.5}
  - id: cp
    source: Invented 2026, context parallel
    model: {layers: 2, hidden: 64, heads: 4, ffn_hidden: 256, vocab: 128, seq_len: 32}
    hardware: {gpu: H100 80GB, gpus_total: 8}
    plan: {tp: 1, pp: 1, dp: 4, cp: 2, global_batch: 8}
    measured: {tflops_per_gpu: 100}
"""


def test_an_invented_two_case_file_gives_an_error_row_and_a_cp_row(tmp_path):
    f = tmp_path / "cases.yaml"
    f.write_text(TWO_CASES)
    cases = V.load_cases(f)
    assert [c["id"] for c in cases] == ["tpu", "cp"]
    rows = [V.price(c) for c in cases]
    assert [(r.id, r.source) for r in rows] == [("tpu", "Invented 2026"), ("cp", "Invented 2026")]
    assert rows[0].error == "no hardware preset for 'TPU v5' (known: A100, H100)"
    assert rows[1].error == "" and "cp2" in rows[1].plan and rows[1].rel_error is not None
    assert rows[0].rel_error is None
    s = V.summarize(rows)
    assert s["overall"]["cases"] == 1 and s["overall"]["errors"] == 1


def test_cases_file_problems_are_one_message(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(PtdError) as e:
        V.load_cases(missing)
    assert str(e.value) == f"cases file {str(missing)!r}: No such file or directory"
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"cases: [\xff\xfe]")
    with pytest.raises(PtdError) as e:
        V.load_cases(bad)
    assert str(e.value) == f"cases file {str(bad)!r} is not UTF-8 text"
    f = tmp_path / "c.yaml"
    f.write_text(TWO_CASES.replace("    measured: {mfu: 0.5}", "    measured: {mfu: null}"))
    with pytest.raises(PtdError) as e:
        V.load_cases(f)
    assert str(e.value) == (f"cases file {str(f)!r}, case 1 (tpu): 'measured' needs one of "
                            f"tokens_per_s, iter_time_s, mfu, hfu, tflops_per_gpu")
    # a measured step time alone is a figure
    f.write_text(TWO_CASES.replace("    measured: {mfu: 0.5}", "    measured: {iter_time_s: 2.0}"))
    assert V.load_cases(f)[0]["measured"] == {"iter_time_s": 2.0}
    f.write_text(TWO_CASES.replace("    hardware: {gpu: H100 80GB, gpus_total: 8}",
                                   "    hardware: [H100]"))
    with pytest.raises(PtdError) as e:
        V.load_cases(f)
    assert str(e.value) == f"cases file {str(f)!r}, case 2 (cp): 'hardware' must be a mapping"
    f.write_text("cases:\n  - {id: 7}\n")
    with pytest.raises(PtdError) as e:
        V.load_cases(f)
    assert str(e.value) == f"cases file {str(f)!r}, case 1: each case needs an 'id' string"
    f.write_text("cases: []\n")
    with pytest.raises(PtdError, match=r"has no 'cases' list$"):
        V.load_cases(f)
    # the shipped file is the default
    assert V.load_cases() == V.load_cases(Path(V.SHIPPED))


# ------------------------------------------------------------------ pricing
def test_a_case_that_does_not_fit_says_how_much_it_needs():
    # GPT 8 x 8192, 64 heads (multi-head stated), F 32768, V 32768, 1024 positions, on one
    # H100, bf16, no ZeRO, full recompute, micro-batch 1. Parameters: a block 4 h^2 + 4 h
    # (268468224) + 2 h F + F + h (536911872) + 4 h (32768) = 805412864; embedding and output
    # 268435456 each, positions 8388608, final norm 16384: Psi = 6988578816.
    # ptd's convention: 4 + 4 + 8 bytes of model states, 2 of bf16 compute copies: 18 Psi =
    # 125794418688. Activations (autocast under the ptd stack: fp32 stream), s b h = 8388608:
    # 8 blocks keep their fp32 input, 8 x 4 x sbh = 268435456; the output keeps (4 + 2) sbh
    # + 4 s V = 50331648 + 134217728, its loss 2 x 4 s V = 268435456: 721420288 in all.
    # 126515838976 bytes / 2^30 = 117.83 GiB.
    c = case(model={"layers": 8, "hidden": 8192, "heads": 64, "ffn_hidden": 32768,
                    "vocab": 32768, "seq_len": 1024, "mlp": "gelu", "kv_heads": 64},
             hardware={"gpus_total": 1, "gpus_per_node": 1},
             plan={"dp": 1, "global_batch": 1, "recompute": "full"})
    r = V.price(c)
    assert r.error == "does not fit: 117.8 GiB per device needed with the least-memory choice"
    assert r.stack == "ptd" and r.rel_error is None and r.metric == ""
    assert V.price(c, stack="deepspeed").stack == "deepspeed"

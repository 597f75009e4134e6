"""cost/estimate.py: the default batch, the norm rule, the candidate plans counted by hand,
choose()'s bookkeeping and the Estimate's derived figures (written from the survivors of a
mutation run, docs/testing.md). Torch-free.

The figures derived from an Estimate are checked as arithmetic on its parts (step.total and
step.compute come from cost/step.py, not from the code under test)."""

import pytest

from ptd.cost.estimate import (FREE_KNOBS, CostOptions, candidates, divisors, choose,
                               default_global_batch, estimate, fused_norm)
from ptd.errors import PtdError
from ptd.specs import ClusterSpec, ParallelPlan, get_preset, load_hardware

TINY = get_preset("tiny")  # 4 layers, 8 heads, 4 kv heads, ffn 128: 180800 parameters
H100 = load_hardware("h100-sxm")


def test_default_global_batch_by_hand():
    # about 2^22 tokens per step: seqs = round(2^22 / seq), rounded up to a multiple of dp
    assert default_global_batch(4096, 1) == 1024          # 4194304 / 4096 = 1024
    assert default_global_batch(4096, 3) == 1026          # ceil(1024 / 3) = 342; 342 * 3
    assert default_global_batch(3000, 1) == 1398          # 1398.1 rounds to 1398
    assert default_global_batch(2700, 1) == 1553          # 1553.45 rounds to 1553
    assert default_global_batch(5000, 1) == 839           # 838.86 rounds up to 839
    assert default_global_batch(2**23, 2) == 2            # round(0.5) = 0 -> 1 -> dp 2
    assert default_global_batch(2**23, 1) == 1
    assert default_global_batch(100, 7, tokens=1000) == 14   # 10 seqs -> ceil(10/7) = 2 -> 14
    assert default_global_batch(300, 4, tokens=1000) == 4    # 3.33 -> 3 -> ceil(3/4) = 1 -> 4
    assert default_global_batch(128, 8, tokens=2**20) == 8192  # 8192 / 8 = 1024 exactly


def test_fused_norm_rule():
    cpu = load_hardware("cpu")
    assert fused_norm(CostOptions(), H100) is True           # None: a GPU fuses
    assert fused_norm(CostOptions(), cpu) is False           # the CPU's composite rms_norm
    assert fused_norm(CostOptions(fused_norm=False), H100) is False
    assert fused_norm(CostOptions(fused_norm=True), cpu) is True
    # a kind read at run time (a hardware file's text), not the interned literal
    cpu_kind = "".join(["c", "p", "u"])
    assert fused_norm(CostOptions(), H100.replace(kind=cpu_kind)) is False
    # any other kind counts as an accelerator with fused kernels ("accelerator" < "cpu")
    assert fused_norm(CostOptions(), H100.replace(kind="accelerator")) is True


def test_divisors():
    # (one function for ptd estimate's free knobs and ptd plan's search)
    assert divisors(1) == [1]
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    assert divisors(7) == [1, 7]
    assert divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]  # the root once
    # 99999999999 = 3^2 x 21649 x 513239 (both prime): (2+1)(1+1)(1+1) = 12 divisors, found
    # by trial division to sqrt(n) -- trying every integer up to n took minutes in ptd plan
    assert divisors(99_999_999_999) == [1, 3, 9, 21649, 64947, 194841, 513239, 1539717, 4619151,
                                        11_111_111_111, 33_333_333_333, 99_999_999_999]


def knobs(plans):
    return sorted((p.micro_batch, p.zero, p.recompute, p.sp, p.vpp, p.schedule) for p in plans)


def test_candidates_without_a_pipeline_counted_by_hand():
    base = ParallelPlan(dp=2, tp=2, global_batch=8, seq_len=64, dtype="bf16")
    # per replica 8/2 = 4: micro-batches 1, 2, 4; dp 2: ZeRO 0-3; 3 recomputes; tp 2: sp
    # off and on; no pipeline: vpp 1 and the base schedule. 3 * 4 * 3 * 2 = 72
    got = list(candidates(TINY, base, FREE_KNOBS))
    assert len(got) == 72
    assert {p.micro_batch for p in got} == {1, 2, 4}
    assert {p.zero for p in got} == {0, 1, 2, 3}
    assert {p.recompute for p in got} == {"none", "selective", "full"}
    assert {p.sp for p in got} == {False, True}
    assert {(p.vpp, p.schedule) for p in got} == {(1, "1f1b")}
    # nothing free: the base plan alone
    assert knobs(candidates(TINY, base, [])) == knobs([base])
    # only the micro-batch free
    assert [p.micro_batch for p in candidates(TINY, base, ["micro_batch"])] == [1, 2, 4]


def test_candidates_at_dp_one_and_tp_one():
    base = ParallelPlan(dp=1, tp=1, global_batch=4, seq_len=64, zero=2, sp=False)
    got = list(candidates(TINY, base, FREE_KNOBS))
    # micro-batches 1, 2, 4; at dp 1 only ZeRO 0; 3 recomputes; tp 1: no sp: 9
    assert len(got) == 9
    assert {p.zero for p in got} == {0} and {p.sp for p in got} == {False}
    # ZeRO not free: the base's stage 2 is kept
    assert {p.zero for p in candidates(TINY, base, ["recompute"])} == {2}
    # offload at dp 1: stage 3 only (offload needs it)
    off = ParallelPlan(dp=1, tp=1, global_batch=4, seq_len=64, zero=3, offload=True)
    assert {p.zero for p in candidates(TINY, off, ["zero"])} == {3}
    # offload at dp 2: every stage tried, only stage 3 is valid with offload
    off2 = ParallelPlan(dp=2, tp=1, global_batch=4, seq_len=64, zero=3, offload=True)
    assert {p.zero for p in candidates(TINY, off2, ["zero"])} == {3}
    # sp free at tp 1 keeps the base's sp (False); at tp 2 both
    assert {p.sp for p in candidates(TINY, base, ["sp"])} == {False}
    base2 = ParallelPlan(dp=1, tp=2, global_batch=4, seq_len=64, sp=True)
    assert {p.sp for p in candidates(TINY, base2, [])} == {True}
    assert {p.sp for p in candidates(TINY, base2, ["sp"])} == {False, True}


def test_candidates_with_a_pipeline_counted_by_hand():
    base = ParallelPlan(dp=1, pp=2, global_batch=8, seq_len=64)
    # 4 layers / pp 2 = 2 per rank: vpp 1 or 2; vpp 1 goes with 1f1b, zero-bubble, gpipe,
    # vpp 2 with interleaved-1f1b and zero-bubble (ZB-V): 5
    got = knobs(candidates(TINY, base, ["vpp", "schedule"]))
    assert [(v, s) for *_, v, s in got] == sorted([
        (1, "1f1b"), (1, "zero-bubble"), (1, "gpipe"),
        (2, "interleaved-1f1b"), (2, "zero-bubble")])
    # a restricted set of schedules
    got = knobs(candidates(TINY, base, ["vpp", "schedule"], schedules=("1f1b", "interleaved-1f1b")))
    assert [(v, s) for *_, v, s in got] == [(1, "1f1b"), (2, "interleaved-1f1b")]
    # schedule not free: the base's 1f1b; vpp free: only 1 goes with it
    assert [(p.vpp, p.schedule) for p in candidates(TINY, base, ["vpp"])] == [(1, "1f1b")]
    # vpp not free: the base's vpp 1; schedules that run vpp 1
    got = {p.schedule for p in candidates(TINY, base, ["schedule"])}
    assert got == {"1f1b", "zero-bubble", "gpipe"}
    # 5 layers over pp 2 (uneven): no whole number per rank, vpp stays the base's
    five = TINY.replace(n_layers=5)
    ub = base.replace(uneven_stages=True)
    assert {p.vpp for p in candidates(five, ub, ["vpp"])} == {1}
    # 8 layers over pp 2: 4 per rank: vpp 1, 2, 4 with interleaved-1f1b (1 with 1f1b)
    eight = TINY.replace(n_layers=8)
    got = {(p.vpp, p.schedule) for p in candidates(eight, base, ["vpp", "schedule"],
                                                      schedules=("1f1b", "interleaved-1f1b"))}
    assert got == {(1, "1f1b"), (2, "interleaved-1f1b"), (4, "interleaved-1f1b")}


def test_choose_records_the_free_knobs_in_their_order():
    c = ClusterSpec(H100, 2)
    base = ParallelPlan(dp=1, tp=2, global_batch=4, seq_len=64, dtype="bf16")
    e = choose(TINY, c, base, ["sp", "recompute", "micro_batch", "nonsense"])
    # FREE_KNOBS order, unknown names dropped
    assert list(e.chosen) == ["micro_batch", "recompute", "sp"]
    assert e.chosen == {"micro_batch": e.plan.micro_batch, "recompute": e.plan.recompute,
                        "sp": e.plan.sp}
    assert e.memory.fits


def test_choose_when_nothing_fits_takes_the_least_memory():
    # 1 MB of device memory: nothing fits; the plan needing least memory shards everything
    # (ZeRO 3 over dp 4) and recomputes the whole forward.
    tiny_mem = H100.replace(memory_bytes=1e6, memory_reserved=0.0)
    c = ClusterSpec(tiny_mem, 4)
    base = ParallelPlan(dp=4, global_batch=16, seq_len=64, micro_batch=1, dtype="bf16")
    e = choose(TINY, c, base, ["zero", "recompute"])
    assert e.memory.fits is False
    assert (e.plan.zero, e.plan.recompute) == (3, "full")
    assert e.chosen == {"zero": 3, "recompute": "full"}


def test_choose_refusals_and_errors():
    c = ClusterSpec(H100, 2)
    base = ParallelPlan(dp=2, global_batch=8, seq_len=64)
    with pytest.raises(PtdError, match="^ptd train refuses it: no$"):
        choose(TINY, c, base, ["micro_batch"], refuse=lambda p: "no")
    # the first reason is the one reported
    reasons = iter(["first", "second", "third"])
    with pytest.raises(PtdError, match="^ptd train refuses it: first$"):
        choose(TINY, c, base, ["micro_batch"], refuse=lambda p: next(reasons))
    # refusing only micro-batch 1: a plan is still chosen, and it is not micro-batch 1
    e = choose(TINY, c, base, ["micro_batch"], refuse=lambda p: "mb1" if p.micro_batch == 1 else None)
    assert e.plan.micro_batch in (2, 4)
    # an invalid base: its own reason
    bad = ParallelPlan(dp=2, global_batch=8, seq_len=64, tp=3)
    with pytest.raises(PtdError, match="8 attention heads are not divisible by tp 3"):
        choose(TINY, ClusterSpec(H100, 6), bad, ["micro_batch"])


def test_estimate_derived_figures():
    c = ClusterSpec(H100, 2)
    p = ParallelPlan(dp=2, global_batch=8, seq_len=64, dtype="bf16")
    e = estimate(TINY, c, p)
    # tokens default to Chinchilla's 20 per parameter: 20 * 180800 = 3616000
    assert e.tokens == 3616000.0
    assert estimate(TINY, c, p, tokens=1000).tokens == 1000.0
    total, compute = e.step.total, e.step.compute
    assert e.n_devices == 2
    assert e.tokens_per_s == pytest.approx(8 * 64 / total, rel=1e-12, abs=0)   # 512 tokens a step
    assert e.samples_per_s == pytest.approx(8 / total, rel=1e-12, abs=0)
    assert e.time_to_train_s == pytest.approx(3616000 * total / 512, rel=1e-12, abs=0)
    assert e.efficiency == pytest.approx(compute / total, rel=1e-12, abs=0)
    peak = H100.peak("bf16")
    assert e.peak == peak
    assert e.mfu == pytest.approx(e.flops.model * 512 / total / (peak * 2), rel=1e-12, abs=0)
    assert e.hfu == pytest.approx(e.flops.hardware * 512 / total / (peak * 2), rel=1e-12, abs=0)
    d = e.to_json()
    assert d["gpus"] == 2 and d["params"] == 180800 and d["model"] == "tiny"
    assert d["hardware"] == H100.name and d["chosen"] == {}
    assert d["tokens_per_s_per_device"] == pytest.approx(512 / total / 2, rel=1e-12, abs=0)
    assert d["tflops_per_device"]["model"] == pytest.approx(
        e.flops.model * 512 / total / 2 / 1e12, rel=1e-14, abs=0)
    assert d["tflops_per_device"]["hardware"] == pytest.approx(
        e.flops.hardware * 512 / total / 2 / 1e12, rel=1e-14, abs=0)
    assert d["peak_tflops_per_device"] == pytest.approx(peak / 1e12, rel=1e-15, abs=0)
    assert d["memory_capacity_bytes"] == H100.memory_bytes - H100.memory_reserved
    assert d["samples_per_s"] == pytest.approx(8 / total, rel=1e-12, abs=0)
    assert d["time_to_train_s"] == pytest.approx(3616000 * total / 512, rel=1e-12, abs=0)
    assert d["efficiency"] == pytest.approx(compute / total, rel=1e-12, abs=0)
    assert d["tokens"] == 3616000.0


def test_estimate_validates_unless_told_not_to():
    c = ClusterSpec(H100, 4)
    p = ParallelPlan(dp=2, global_batch=8, seq_len=64)   # 2 ranks on a 4-device cluster
    with pytest.raises(PtdError, match="dp\\*tp\\*pp = 2\\*1\\*1 = 2"):
        estimate(TINY, c, p)
    assert estimate(TINY, c, p, validate=False).n_devices == 2


def test_estimate_reads_its_options():
    c = ClusterSpec(H100, 2)
    p = ParallelPlan(dp=2, global_batch=8, seq_len=64, recompute="full")
    early = estimate(TINY, c, p, options=CostOptions(recompute_early_stop=True))
    whole = estimate(TINY, c, p, options=CostOptions(recompute_early_stop=False))
    # re-running the whole forward costs more hardware FLOPs than stopping early
    assert whole.flops.hardware > early.flops.hardware
    b = p.replace(dtype="bf16")
    # ZeRO 0 (nothing sharded), 180800 parameters: ptd's convention keeps fp32 parameters,
    # 4 * 180800 = 723200 bytes; ZeRO's (2+2+12) bf16 ones, 2 * 180800 = 361600
    assert estimate(TINY, c, b).memory.params == 723200
    assert estimate(TINY, c, b, options=CostOptions(convention="zero")).memory.params == 361600
    sc = estimate(TINY, c, p.replace(recompute="none"), options=CostOptions(attention="scores"))
    fl = estimate(TINY, c, p.replace(recompute="none"), options=CostOptions(attention="flash"))
    assert sc.memory.activations > fl.memory.activations   # the s x s scores are kept
    ov = estimate(TINY, c, p, options=CostOptions(dp_overlap=False))
    assert ov.step.dp_comm_exposed >= estimate(TINY, c, p).step.dp_comm_exposed


def test_cost_options_defaults_are_ptd_runtime():
    o = CostOptions()
    # as documented on each field: ptd's runtime (PyTorch SDPA, DDP/FSDP overlap,
    # non-reentrant checkpoint, DTensor per-linear reduction), K/V kept at kv width,
    # balanced experts, collectives rather than parameter servers
    assert o.convention == "ptd" and o.attention == "flash"
    assert o.gqa_expanded is False
    assert o.dp_overlap is True and o.recompute_early_stop is True
    assert o.fused_norm is None and o.tp_grad_per_linear is True
    assert o.schedules == ("1f1b", "interleaved-1f1b", "zero-bubble", "gpipe")
    assert o.moe_imbalance == 1.0 and o.ps_servers == 0


def test_candidate_vpps_divide_the_layers_per_rank():
    # 6 layers over pp 2: 3 per rank, vpp 1 or 3 (2 does not divide 3, though 2 * 2 = 4
    # stages would be allowed by uneven stages)
    six = TINY.replace(n_layers=6)
    base = ParallelPlan(dp=1, pp=2, global_batch=8, seq_len=64, uneven_stages=True,
                        schedule="interleaved-1f1b", vpp=3)
    assert {p.vpp for p in candidates(six, base, ["vpp", "schedule"])} == {1, 3}


def test_candidates_without_a_pipeline_keep_any_schedule():
    # at pp 1 the schedule names nothing that runs; the base's is kept as it is
    base = ParallelPlan(dp=1, pp=1, global_batch=4, seq_len=64, schedule="interleaved-1f1b")
    assert [(p.vpp, p.schedule) for p in candidates(TINY, base, ["schedule", "vpp"])] == \
        [(1, "interleaved-1f1b")]


def test_choose_never_picks_full_recompute_when_everything_fits():
    # an H100 holds the tiny model's every plan; full recomputation re-runs each block's
    # forward and saves no time, so the fastest plan recomputes less (the candidates come
    # in the order none, selective, full: the last is never the fastest)
    c = ClusterSpec(H100, 2)
    base = ParallelPlan(dp=2, global_batch=8, seq_len=64, dtype="bf16")
    e = choose(TINY, c, base, ["recompute"])
    assert e.memory.fits and e.plan.recompute in ("none", "selective")


def test_choose_when_nothing_fits_takes_the_smallest_micro_batch():
    # 1 MB of device memory: nothing fits. With only the micro-batch free (1, 2, 4 in that
    # order), the model states are the same in every candidate and the activations grow
    # with the micro-batch, so the least memory is micro-batch 1, the first candidate
    tiny_mem = H100.replace(memory_bytes=1e6, memory_reserved=0.0)
    c = ClusterSpec(tiny_mem, 2)
    base = ParallelPlan(dp=2, global_batch=8, seq_len=64, micro_batch=4, dtype="bf16")
    e = choose(TINY, c, base, ["micro_batch"])
    assert e.memory.fits is False
    assert e.plan.micro_batch == 1 and e.chosen == {"micro_batch": 1}


def test_options_and_estimates_are_frozen():
    import dataclasses
    with pytest.raises(dataclasses.FrozenInstanceError):
        CostOptions().dp_overlap = False  # type: ignore[misc]
    e = estimate(TINY, ClusterSpec(H100, 2), ParallelPlan(dp=2, global_batch=8, seq_len=64))
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.tokens = 1.0  # type: ignore[misc]


def test_candidate_micro_batches_divide_the_batch_per_replica():
    # global batch 6 over dp 2: 3 sequences per replica, micro-batches 1 and 3
    base = ParallelPlan(dp=2, global_batch=6, seq_len=64)
    assert [p.micro_batch for p in candidates(TINY, base, ["micro_batch"])] == [1, 3]


def test_uneven_layers_per_rank_keep_the_base_vpp():
    # 5 layers over pp 2 is no whole number per rank: vpp is not searched, the base's 2 is
    # kept, with the schedules that run 2 stages per rank (interleaved 1F1B, ZB-V)
    five = TINY.replace(n_layers=5)
    base = ParallelPlan(dp=1, pp=2, vpp=2, global_batch=8, seq_len=64, uneven_stages=True,
                        schedule="interleaved-1f1b")
    got = {(p.vpp, p.schedule) for p in candidates(five, base, ["vpp", "schedule"])}
    assert got == {(2, "interleaved-1f1b"), (2, "zero-bubble")}

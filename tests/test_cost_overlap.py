"""Overlap is not free: a collective hidden behind compute takes multiprocessors from it.

Expected values are worked out by hand from the tile and wave rules (NVIDIA's "Matrix
Multiplication Background User's Guide") and from the step's own parts, never read back
from the function under test.
"""

from __future__ import annotations

import dataclasses

import pytest

from ptd.cost.compute import Gemm, busy_rate
from ptd.cost.step import step_time
from ptd.errors import PtdError
from ptd.specs.hardware import get_hardware_preset
from ptd.specs.plan import ParallelPlan

from helpers import cluster, gpt


def test_busy_rate_by_hand() -> None:
    # A 3072 x 1408 output: with 256x128 tiles 12 x 11 = 132 tiles, one full wave on 132
    # SMs (efficiency 1). With 24 SMs taken, 108 remain:
    #   256x128: 132 tiles -> 2 waves: 132 / (2*108) * 1.00 = 0.6111
    #   128x128: 264 tiles -> 3 waves: 264 / (3*108) * 0.93 = 0.7578
    #   128x64 : 528 tiles -> 5 waves: 528 / (5*108) * 0.80 = 0.7822  (the best)
    # and 108 of 132 SMs do the work: 108/132 * 0.7822 = 0.6400. k = 4096: k/(k+128).
    g = Gemm(3072, 1408, 4096)
    kf = 4096 / (4096 + 128)
    assert busy_rate(g, 132, 0) == pytest.approx(1.0 * kf, rel=1e-9)
    assert busy_rate(g, 132, 24) == pytest.approx(108 / 132 * 528 / 540 * 0.8 * kf, rel=1e-9)


def _fsdp_step(hw_name: str, comm_sms: int | None = None, dp_overlap: bool = True):  # type: ignore[no-untyped-def]
    cl = cluster(hw_name, 64)
    if comm_sms is not None:
        cl = dataclasses.replace(cl, hardware=dataclasses.replace(cl.hardware, comm_sms=comm_sms))
    plan = ParallelPlan(dp=64, zero=3, micro_batch=1, global_batch=64, dtype="bf16")
    return step_time(gpt(32, 4096, 32, S=4096), plan, cl, dp_overlap=dp_overlap)


def test_hidden_communication_costs_compute() -> None:
    free = _fsdp_step("h100-sxm", comm_sms=0)
    busy = _fsdp_step("h100-sxm")
    hidden = busy.dp_comm_total - busy.dp_comm_exposed
    assert free.overlap == 0.0 and hidden > 0
    # the same plan, the same parts; only the overlap term differs, and it is a fraction of
    # the hidden communication time (a second of overlap cannot cost more than a second)
    assert busy.compute == free.compute and busy.dp_comm_exposed == free.dp_comm_exposed
    assert 0 < busy.overlap < hidden
    assert busy.total == pytest.approx(free.total + busy.overlap, rel=1e-12)
    parts = (busy.compute + busy.tp_comm + busy.pp_comm + busy.dp_comm_exposed + busy.bubble
             + busy.optimizer + busy.ep_comm + busy.cp_comm + busy.overlap)
    assert busy.total == pytest.approx(parts, rel=1e-12)


def test_more_sms_taken_costs_more() -> None:
    a, b = _fsdp_step("h100-sxm", comm_sms=8), _fsdp_step("h100-sxm", comm_sms=48)
    assert 0 < a.overlap < b.overlap


def test_no_overlap_no_cost() -> None:
    # a stack that reduces after the backward hides nothing, so loses nothing
    assert _fsdp_step("h100-sxm", dp_overlap=False).overlap == 0.0
    # a CPU has no shape model: communication threads are priced by calibration instead
    assert get_hardware_preset("cpu").comm_sms == 0


def test_presets_cite_their_figure() -> None:
    for name in ("a100-80g", "h100-sxm", "h200"):
        hw = get_hardware_preset(name)
        assert 0 < hw.comm_sms < hw.sm_count
        assert "24" in hw.sources["comm_sms"]


@pytest.mark.parametrize("bad", [-1, 132, 500])
def test_comm_sms_out_of_range(bad: int) -> None:
    # the spec refuses it when built (HardwareSpec.__post_init__ runs check_hardware)
    with pytest.raises(PtdError, match="comm_sms must be >= 0 and below sm_count"):
        dataclasses.replace(get_hardware_preset("h100-sxm"), comm_sms=bad)
    with pytest.raises(PtdError, match="comm_sms must be"):  # no shape model, no comm_sms
        dataclasses.replace(get_hardware_preset("cpu"), comm_sms=2)


def test_the_estimate_says_when_communication_bounds_the_step(ptd_cli) -> None:
    # Llama 3 70B, ZeRO-3 over 1024 H100s, one 1024-token sequence each. By hand: the gathers
    # (bf16, forward and again backward) and the fp32 reduce-scatter move 2*2 + 4 = 8 bytes
    # per parameter, 70.6e9 * 8 = 565 GB per step, at best over a node's 8 NICs of 50 GB/s at
    # 80% (320 GB/s): >= 1.7 s; the compute is ~6 * 70.6e9 * 1024 FLOPs at 80% of 989
    # TFLOP/s: ~0.55 s. Communication cannot hide behind it.
    rc, out, err = ptd_cli("estimate", "--model", "llama3-70b", "--hardware", "h100-sxm",
                           "--gpus", "1024", "--global-batch", "1024", "--seq-len", "1024",
                           "--zero", "3", "--tp", "1", "--pp", "1", "--micro-batch", "1", "--json")
    assert rc == 0, err
    import json
    d = json.loads(out)
    assert d["bound"] == "dp_comm_exposed"
    assert d["bound_text"].startswith("communication-bound")
    assert d["step_time_s"]["dp_comm_total"] >= 1.7
    # and 8 GPUs of the 8B model are compute-bound
    rc, out, _ = ptd_cli("estimate", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "8")
    assert rc == 0 and "compute-bound: the largest part is computation" in out


def _cpu(table: dict[int, float]):  # noqa: ANN202
    return dataclasses.replace(get_hardware_preset("cpu"), gemm_flops_measured={"fp32": table})


@pytest.mark.parametrize("table,workers,loss", [
    # 2 cores: 80 GFLOP/s per worker alone or with 2, 40 with 4 -> aggregate C = 160.
    # One worker leaves (160 - 80)/80 = 1 core spare: its communication is free.
    ({1: 80e9, 2: 80e9, 4: 40e9}, 1, 0.0),
    # two or four workers fill the cores (2 * 80 = 4 * 40 = 160): a second of hidden
    # communication is a second of computation lost
    ({1: 80e9, 2: 80e9, 4: 40e9}, 2, 1.0),
    ({1: 80e9, 2: 80e9, 4: 40e9}, 4, 1.0),
    # partly shared: C = max(80, 2*70, 4*50) = 200; 2 workers use 140, spare 60/80 = 0.75
    ({1: 80e9, 2: 70e9, 4: 50e9}, 2, 0.25),
    # one measured count says nothing about sharing
    ({1: 80e9}, 2, 0.0),
])
def test_cpu_overlap_loss_by_hand(table, workers, loss) -> None:
    from ptd.cost.step import cpu_overlap_loss
    from ptd.specs.hardware import ClusterSpec
    cl = ClusterSpec(_cpu(table), workers, workers)
    assert cpu_overlap_loss(cl, "fp32") == pytest.approx(loss)


def test_on_a_full_cpu_hidden_communication_costs_its_own_time() -> None:
    # DDP's bucketed all-reduces run on gloo's threads beside the backward (GPT-2's 124M
    # fp32 gradients fill several 25 MiB buckets, so some of them hide); FSDP's do not
    # hide on a CPU at all (tests/test_cost_dp.py)
    from ptd.specs.hardware import ClusterSpec
    from ptd.specs import get_preset
    plan = ParallelPlan(dp=2, zero=0, micro_batch=2, global_batch=8, seq_len=64, dtype="fp32")
    st = step_time(get_preset("gpt2"), plan, ClusterSpec(_cpu({1: 80e9, 2: 80e9}), 2, 2))
    hidden = st.dp_comm_total - st.dp_comm_exposed
    assert hidden > 0 and st.overlap == pytest.approx(hidden, rel=1e-12)
    roomy = step_time(get_preset("gpt2"), plan,
                      ClusterSpec(_cpu({1: 80e9, 2: 80e9, 4: 80e9}), 2, 2))  # 4 cores, 2 busy
    assert roomy.overlap == 0.0 and roomy.total == pytest.approx(st.total - hidden, rel=1e-9)

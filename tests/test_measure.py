"""Measurement of real runs: the step-time breakdown from profiler spans, model
states counted from tensors, the activation tracker, and predicted vs measured in the
``summary.json`` of real multi-process runs (DDP, tensor parallel, pipeline)."""

import json

import pytest
import torch

from helpers import ok, ptd_train

from ptd.runtime.measure.device_memory import ActivationTracker, model_state_bytes
from ptd.runtime.measure.timeline import Span, analyse_step, comm_kind, is_marker, mean_breakdown

MAIN, GLOO = 1, 2


def sp(name, a, b, thread=MAIN):
    return Span(name, thread, float(a), float(b))


# ----------------------------------------------------------------- timeline arithmetic
def test_comm_kinds_of_real_span_names():
    assert comm_kind("gloo:all_reduce") == "all_reduce"
    assert comm_kind("c10d::allreduce_") == "all_reduce"
    assert comm_kind("_c10d_functional::all_gather_into_tensor") == "all_gather"
    assert comm_kind("c10d::_reduce_scatter_base_") == "reduce_scatter"
    assert comm_kind("gloo:recv") == "recv"
    assert comm_kind("_c10d_functional::wait_tensor") == "wait"
    assert comm_kind("aten::mm") is None
    assert comm_kind("ptd:backward") is None


def test_ddp_step_hidden_and_exposed_all_reduce():
    """Forward 5-35, backward 35-85 (a bucket all-reduce launched at 60 runs on gloo's
    thread 61-90: hidden while the backward computes, exposed 85-90), optimizer 90-100."""
    spans = [sp("ptd:step", 0, 100), sp("ptd:data", 0, 5), sp("aten::copy_", 0, 5),
             sp("ptd:forward", 5, 35), sp("aten::mm", 5, 35),
             sp("ptd:backward", 35, 85), sp("aten::mm", 35, 60),
             sp("c10d::allreduce_", 60, 62), sp("aten::mm", 62, 85),
             sp("gloo:all_reduce", 61, 90, GLOO),
             sp("ptd:optimizer", 90, 100), sp("aten::add_", 90, 100)]
    b = analyse_step(spans, MAIN, (0, 100))
    us = {k: round(v * 1e6, 6) for k, v in b.parts.items()}
    assert us == {"data": 5, "forward": 30, "backward": 48, "comm:all_reduce": 7,
                  "optimizer": 10}
    assert b.comm_exposed == {"all_reduce": pytest.approx(7e-6)}
    assert b.comm_total == {"all_reduce": pytest.approx(29e-6)}
    assert sum(b.parts.values()) == pytest.approx(b.step) == pytest.approx(100e-6)


def test_fsdp_collectives_waited_for_inside_its_hooks_are_exposed_communication():
    """FSDP2 on a CPU: the forward's gather runs to its end inside ``FSDP::all_gather``
    (launch op 10-11, then the main thread waits, gloo's thread gathers 11-18); in the
    backward the gradient all-reduce runs inside FSDP's post-backward node and the engine's
    wrapper (launch 60-61, gloo 61-70). Those waits are exposed communication; the blocks'
    products stay forward (5-10, 18-35) and backward (35-60, 70-85)."""
    spans = [sp("ptd:step", 0, 100), sp("ptd:data", 0, 5), sp("aten::copy_", 0, 5),
             sp("ptd:forward", 5, 35), sp("aten::mm", 5, 10),
             sp("FSDP::pre_forward (layers.1)", 10, 18), sp("FSDP::all_gather (layers.1)", 10, 18),
             sp("c10d::_allgather_base_", 10, 11), sp("gloo:all_gather", 11, 18, GLOO),
             sp("aten::mm", 18, 35),
             sp("ptd:backward", 35, 85), sp("aten::mm", 35, 60),
             sp("autograd::engine::evaluate_function: RegisterPostBackwardFunctionBackward", 60, 70),
             sp("RegisterPostBackwardFunctionBackward", 60, 70),
             sp("FSDP::post_backward_reduce (layers.1)", 60, 70),
             sp("c10d::allreduce_", 60, 61), sp("gloo:all_reduce", 61, 70, GLOO),
             sp("aten::mm", 70, 85),
             sp("ptd:optimizer", 85, 100), sp("aten::add_", 85, 100)]
    b = analyse_step(spans, MAIN, (0, 100))
    us = {k: round(v * 1e6, 6) for k, v in b.parts.items()}
    assert us == {"data": 5, "forward": 22, "backward": 40, "comm:all_gather": 8,
                  "comm:all_reduce": 10, "optimizer": 15}
    assert sum(b.parts.values()) == pytest.approx(100e-6)


def test_recompute_inside_backward_and_pipeline_bubble():
    """A block's forward inside a backward is recompute; inside a schedule, time with no op
    and only a receive in flight is the bubble (waiting for the neighbour)."""
    spans = [sp("ptd:step", 0, 100), sp("ptd:schedule", 0, 100),
             sp("ptd:forward", 0, 20), sp("aten::mm", 0, 20),
             sp("gloo:recv", 20, 50, GLOO),  # waiting for the next stage's gradient
             sp("ptd:backward", 50, 100), sp("ptd:block", 50, 70), sp("aten::mm", 50, 70),
             sp("aten::mm", 70, 100)]
    b = analyse_step(spans, MAIN, (0, 100))
    us = {k: round(v * 1e6, 6) for k, v in b.parts.items()}
    assert us == {"forward": 20, "bubble": 30, "recompute": 20, "backward": 30}


def test_pipeline_stage_waiting_in_the_loss_all_reduce_is_bubble():
    """The last stage of a 1F1B pipeline finishes first and waits in the step's loss
    all-reduce while the first stage runs its last backwards: on a pipeline that wait is
    its bubble (the drain), without one it stays unmodelled ``other``."""
    from types import SimpleNamespace

    from ptd.summary.compare import cost_view
    spans = [sp("ptd:step", 0, 100), sp("ptd:schedule", 0, 60),
             sp("gloo:recv", 0, 10, GLOO),  # fill: waiting for the first activations
             sp("ptd:forward", 10, 30), sp("aten::mm", 10, 30),
             sp("ptd:backward", 30, 60), sp("aten::mm", 30, 60),
             sp("ptd:loss", 60, 100), sp("gloo:all_reduce", 61, 100, GLOO)]
    b = analyse_step(spans, MAIN, (0, 100))
    pipe = cost_view(b.parts, b.comm_exposed_by_phase, SimpleNamespace(pp=2, tp=1, zero=0))
    flat = cost_view(b.parts, b.comm_exposed_by_phase, SimpleNamespace(pp=1, tp=1, zero=0))
    assert pipe["bubble"] == pytest.approx(49e-6) and pipe["other"] == pytest.approx(1e-6)
    assert flat["bubble"] == pytest.approx(10e-6) and flat["other"] == pytest.approx(40e-6)
    assert pipe["compute"] == flat["compute"] == pytest.approx(50e-6)


def test_expert_all_to_alls_waited_for_inside_their_autograd_function_are_communication():
    """Expert parallelism's rows travel by ``dist.all_to_all_single`` inside an autograd
    function (``runtime/parallel/ep.py``): the main thread launches (10-11) and then waits
    inside the function's span while gloo's thread moves the rows (11-16); in the backward
    the same inside the engine's wrapper (launch 40-41, gloo 41-48). The waits are exposed
    all-to-all time, not forward or backward computation (the span names as torch 2.13's
    profiler records them, checked below on a real profile)."""
    spans = [sp("ptd:step", 0, 60), sp("ptd:forward", 0, 30), sp("aten::mm", 0, 10),
             sp("EPAllToAll", 10, 16), sp("aten::empty", 10, 10.5),
             sp("c10d::alltoall_base_", 10.5, 11), sp("gloo:all_to_all", 11, 16, GLOO),
             sp("aten::mm", 16, 30),
             sp("ptd:backward", 30, 60), sp("aten::mm", 30, 40),
             sp("autograd::engine::evaluate_function: EPAllToAllBackward", 40, 48),
             sp("EPAllToAllBackward", 40, 48), sp("c10d::alltoall_base_", 40, 41),
             sp("gloo:all_to_all", 41, 48, GLOO), sp("aten::mm", 48, 60)]
    b = analyse_step(spans, MAIN, (0, 60))
    us = {k: round(v * 1e6, 6) for k, v in b.parts.items()}
    assert us == {"forward": 24.5, "comm:all_to_all": 13.5, "backward": 22}


def test_the_expert_all_to_all_records_the_span_names_the_timeline_knows():
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from ptd.runtime.measure.probe import kineto_spans
    from ptd.runtime.parallel.ep import EPAllToAll
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        x = torch.randn(6, 4, requires_grad=True)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            EPAllToAll.apply(x, [6], [6], dist.group.WORLD).sum().backward()
    finally:
        dist.destroy_process_group()
    names = {s.name for s in kineto_spans(prof)}
    assert {"EPAllToAll", "EPAllToAllBackward", "c10d::alltoall_base_"} <= names
    assert is_marker("EPAllToAll") and is_marker("EPAllToAllBackward")
    assert x.grad is not None and torch.equal(x.grad, torch.ones(6, 4))


def test_expert_and_context_exchanges_get_their_own_parts():
    """All-to-alls inside forward/backward are the experts' dispatch and combine (ep_comm)
    when ep > 1; sends and receives there are cp's ring (cp_comm) when cp > 1 without a
    pipeline, the pipeline's (pp_comm) with one; all-gathers are tensor parallel's, or
    FSDP's under ZeRO."""
    from types import SimpleNamespace

    from ptd.summary.compare import cost_view
    by_phase = {"forward": {"all_to_all": 3.0, "all_gather": 5.0, "send": 0.5, "recv": 1.5},
                "backward": {"all_to_all": 7.0, "all_gather": 11.0, "send": 2.0}}

    def view(**kw):
        return cost_view({}, by_phase, SimpleNamespace(**{"pp": 1, "tp": 1, "zero": 0, "ep": 1,
                                                          "cp": 1, **kw}))
    ep = view(ep=2)
    assert (ep["ep_comm"], ep["cp_comm"], ep["tp_comm"], ep["pp_comm"]) == (10.0, 0.0, 16.0, 4.0)
    cp = view(cp=2)
    assert (cp["ep_comm"], cp["cp_comm"], cp["pp_comm"], cp["dp_comm_exposed"]) == (0.0, 4.0, 0.0, 10.0)
    cp_pp = view(cp=2, pp=2, zero=1)
    assert (cp_pp["cp_comm"], cp_pp["pp_comm"], cp_pp["dp_comm_exposed"]) == (0.0, 4.0, 26.0)
    both = view(ep=2, cp=2)
    assert (both["ep_comm"], both["cp_comm"]) == (10.0, 4.0)


def test_mean_of_breakdowns_is_part_by_part():
    a = analyse_step([sp("ptd:step", 0, 10), sp("ptd:forward", 0, 10)], MAIN, (0, 10))
    b = analyse_step([sp("ptd:step", 0, 30), sp("ptd:optimizer", 0, 30)], MAIN, (0, 30))
    m = mean_breakdown([a, b])
    assert m.step == pytest.approx(20e-6)
    assert m.parts == {"forward": pytest.approx(5e-6), "optimizer": pytest.approx(15e-6)}


# ----------------------------------------------------------------- memory from tensors
def test_model_states_counted_from_the_tensors():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4, bias=False))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(3, 16)).sum().backward()
    opt.step()
    n = 16 * 32 + 32 + 32 * 4
    got = model_state_bytes([model], opt)
    assert got["params"] == got["grads"] == 4 * n
    assert got["optimizer"] == 2 * 4 * n  # exp_avg, exp_avg_sq
    assert got["total"] == 16 * n


def test_activation_tracker_peak_of_saved_tensors():
    """Tensors made under the tracker and alive together: the peak is their sum."""
    x = torch.randn(64, 64)
    with ActivationTracker() as tr:
        a = x * 2          # 16 KiB, kept
        b = a + 1          # 16 KiB, kept
        del a
        c = b.sum(0)       # 256 B
    peak = tr.peak_excluding(set())
    assert 2 * 64 * 64 * 4 <= peak <= 2 * 64 * 64 * 4 + 4 * 64 * 4
    del b, c


def test_activation_tracker_counts_dtensor_results():
    """Tensor parallelism computes on DTensors, which have no storage of their own and whose
    local ops the mode does not see: their local tensors are what is counted."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        w = distribute_tensor(torch.randn(64, 128), mesh, [Shard(1)])
        x = distribute_tensor(torch.randn(32, 64), mesh, [Replicate()])
        with ActivationTracker() as tr:
            y = x @ w            # 32 x 128 fp32: 16 KiB, a new DTensor
            z = y.relu()         # 16 KiB more
            v = z.view(-1)       # a view: nothing new
        peak = tr.peak_excluding(set())
        assert 2 * 32 * 128 * 4 <= peak <= 2 * 32 * 128 * 4 + 1024, peak
        del y, z, v
    finally:
        dist.destroy_process_group()


# ----------------------------------------------------------------- spans from the profiler
def reference_spans(events):
    """Spans from torch's own ``FunctionEvent`` tree, the slow path ``kineto_spans`` replaces."""
    out = []
    for e in events:
        depth, comm_anc, p = 0, False, e.cpu_parent
        while p is not None:
            depth += 1
            comm_anc = comm_anc or comm_kind(p.name) is not None
            p = p.cpu_parent
        out.append(Span(e.name, int(e.thread), float(e.time_range.start),
                        float(e.time_range.end), depth, comm_anc))
    return out


def _profile_small_steps(lin, group):
    from torch.profiler import ProfilerActivity, profile, record_function
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            with record_function("ptd:step"):
                with record_function("ptd:forward"):
                    with record_function("ptd:forward"):  # only child of its namesake
                        y = lin(torch.randn(8, 32)).relu()
                with record_function("ptd:backward"):
                    y.sum().backward()
                with record_function("c10d::allreduce_"):
                    lin.weight.grad.mul_(0.5)
                    lin.weight.grad.add_(1.0)
                torch.distributed.all_reduce(lin.bias.grad, group=group)
    return prof


def test_kineto_spans_equal_the_profiler_event_tree():
    """Nested record_functions (an only child named as its parent is folded, as torch folds
    it), a communication span with ops under it, and gloo's work on its own thread."""
    import torch.distributed as dist

    from ptd.runtime.measure.probe import kineto_spans
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        prof = _profile_small_steps(torch.nn.Linear(32, 32), dist.group.WORLD)
    finally:
        dist.destroy_process_group()
    key = lambda s: (s.thread, s.start, -s.end, s.name, s.depth, s.comm_ancestor)  # noqa: E731
    fast = sorted(kineto_spans(prof), key=key)
    want = sorted(reference_spans(prof.events()), key=key)
    assert len(fast) > 40
    assert len({s.thread for s in fast}) >= 2
    assert any(s.comm_ancestor for s in fast) and max(s.depth for s in fast) >= 3
    assert [s.name for s in fast].count("ptd:forward") == 2  # folded, one per step
    assert fast == want


# ----------------------------------------------------------------- real runs
RUN_TIMEOUT = 180
COMMON = ["--model", "tiny", "--steps", "6", "--global-batch", "8", "--seq-len", "64",
          "--warmup", "2", "--timeout", "60"]


def train(out, *flags):
    r = ok(ptd_train(out, *flags, home=out.parent / "home", common=COMMON,
                     env={"OMP_NUM_THREADS": "1"}, timeout=RUN_TIMEOUT))
    assert "terminate called" not in r.stderr and "USDT" not in r.stderr
    return json.loads((out / "summary.json").read_text()), r.stdout


@pytest.mark.dist
@pytest.mark.timeout(RUN_TIMEOUT + 30)
@pytest.mark.parametrize("name,flags", [
    ("ddp", ["--nproc", "2", "--micro-batch", "4"]),
    ("tp2", ["--nproc", "2", "--tp", "2", "--dp", "1", "--micro-batch", "8"]),
    ("pp2", ["--nproc", "2", "--pp", "2", "--dp", "1", "--micro-batch", "2", "--schedule", "1f1b"]),
])
def test_every_run_reports_measured_beside_predicted(tmp_path, name, flags):
    s, stdout = train(tmp_path / name, *flags)
    m, p, r = s["measured"], s["predicted"], s["ratio"]
    # the breakdown's parts add up to the profiled step (within 5%)
    b = m["breakdown"]
    parts = sum(v for k, v in b.items() if k not in ("forward", "backward", "recompute"))
    assert parts == pytest.approx(m["profiled_step_time_s"], rel=0.05)
    assert b["forward"] > 0 and b["backward"] > 0 and b["optimizer"] > 0
    # throughput and utilisation follow from the measured step and the cost model's FLOPs
    assert m["tokens_per_s"] == pytest.approx(8 * 64 / m["step_time_s"], rel=1e-6)
    assert m["mfu"] == pytest.approx(p["mfu"] * p["step_time_s"] / m["step_time_s"], rel=1e-6)
    assert r["step_time_s"] == pytest.approx(m["step_time_s"] / p["step_time_s"])
    # model states counted from the tensors equal the cost model's on every rank
    assert m["memory"]["model_states_equal_per_rank"] is True
    assert m["memory"]["model_states"] == p["memory"]["model_states"]
    act = m["memory"]["activations"] / p["memory"]["activations"]
    assert 0.8 < act < 1.2, act  # the activation peak within 20%
    # the dimension's own cost shows up where it should
    if name == "ddp":
        assert m["comm_total_s"]["all_reduce"] > 0
    if name == "tp2":
        assert b["tp_comm"] > 0 and p["breakdown"]["tp_comm"] > 0
    if name == "pp2":
        assert b["bubble"] > 0 and p["breakdown"]["bubble"] > 0
    assert "measured vs predicted" in stdout and "MFU" in stdout


@pytest.mark.timeout(RUN_TIMEOUT + 30)
def test_tensorboard_event_files_hold_the_steps_and_the_comparison(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out = tmp_path / "tb_run"
    s, _ = train(out, "--nproc", "1", "--micro-batch", "8", "--tensorboard")
    acc = EventAccumulator(str(out / "tb"))
    acc.Reload()
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == list(range(1, 7))
    assert loss[0].value == pytest.approx(s["first_loss"], rel=1e-6)
    assert acc.Scalars("measured/step_time_s")[0].value == pytest.approx(s["measured"]["step_time_s"])
    assert acc.Scalars("predicted/step_time_s")[0].value == pytest.approx(s["predicted"]["step_time_s"])
    assert "predicted_vs_measured/text_summary" in acc.Tags()["tensors"]

"""runtime/launch's spec-only checks by hand, from a sampled mutation run (30 of 617 mutants,
seed 20261129: 6 killed by the quick tests; docs/testing.md): the schedule class of each
schedule, the interleaved schedules' micro-batch rule and its advice, which layouts refuse
gradient compression, 2-D tensor and context parallelism's limits, the host memory check,
workers per node and the Slurm script's launch line."""

import dataclasses
import re

import pytest

from ptd.errors import PtdError
from ptd.runtime.launch import limits as L
from ptd.runtime.launch import nodes as N
from ptd.runtime.launch import preflight as P
from ptd.specs import ParallelPlan, TrainConfig, get_preset


def _plan(**kw):
    return ParallelPlan(**{**dict(dp=1, micro_batch=1, global_batch=8, seq_len=64), **kw})


@pytest.mark.parametrize("kw, name", [
    (dict(pp=2, schedule="gpipe"), "ScheduleGPipe"),
    (dict(pp=2, schedule="1f1b"), "Schedule1F1B"),
    (dict(pp=2, vpp=2, schedule="interleaved-1f1b"), "ScheduleInterleaved1F1B"),
    (dict(pp=2, schedule="zero-bubble"), "ScheduleZBVZeroBubble"),           # the V: 2 a rank
    (dict(pp=2, vpp=3, schedule="zero-bubble"), "ScheduleInterleavedZeroBubble"),
])
def test_each_schedule_runs_its_own_class(kw, name):
    assert L.schedule_name(_plan(**kw)) == name


def test_interleaved_micro_batches_must_be_whole_rounds_of_pp():
    model = dataclasses.replace(get_preset("tiny"), n_layers=8)
    # pp 4, 9 micro-batches: rounds of max(1, 9 // 4) = 2 do not divide 9; 8 would
    why = L.pp_problem(model, _plan(pp=4, vpp=2, schedule="interleaved-1f1b", global_batch=9))
    assert why is not None and why.endswith("max(1, 9 // pp) = 2; try 8 micro-batches")
    assert L.pp_problem(model, _plan(pp=4, vpp=2, schedule="interleaved-1f1b",
                                     global_batch=8)) is None
    assert L.pp_problem(model, _plan(pp=4, vpp=2, schedule="interleaved-1f1b",
                                     global_batch=12)) is None   # 12 = 3 rounds of 4
    assert L.pp_problem(model, _plan(pp=4, schedule="1f1b", global_batch=9)) is None
    assert L.pp_problem(model, _plan(pp=1, global_batch=9)) is None


@pytest.mark.parametrize("kw, refused", [
    (dict(dp=2), False), (dict(dp=2, tp=2), True), (dict(dp=2, pp=2), True),
])
def test_gradient_compression_needs_plain_ddp(kw, refused):
    plan = _plan(grad_compression="powersgd", **kw)
    assert (L.dp_problem(get_preset("tiny"), plan) is not None) == refused
    assert L.dp_problem(get_preset("tiny"), _plan(**kw)) is None


def test_2d_tensor_parallel_refuses_experts_but_not_a_dense_model():
    plan = _plan(tp=4, tp_mode="2d", micro_batch=2, global_batch=8)
    assert L.tp2d_problem(get_preset("tiny"), plan) is None
    why = L.tp2d_problem(get_preset("tiny-moe"), plan)
    assert why is not None and "mixture-of-experts" in why


def test_context_parallel_refuses_dropout_only_when_there_is_some():
    model = get_preset("tiny")
    plan = _plan(cp=2)
    assert L.cp_problem(model, plan) is None
    why = L.cp_problem(dataclasses.replace(model, dropout=0.1), plan)
    assert why is not None and "dropout 0" in why


def test_host_memory_check_multiplies_by_the_workers(monkeypatch):
    monkeypatch.setattr(P, "host_memory_bytes", lambda: 1.0 * 2**20)  # a 1 MiB host
    cfg = TrainConfig()
    hw = P.resolve_hardware(cfg, 0)
    with pytest.raises(PtdError) as e:
        P.check_memory(cfg, 4, hw)
    a, b, host = (float(x) for x in re.search(
        r"4 worker\(s\) x ([\d.]+) GiB predicted = ([\d.]+) GiB, more than this host's "
        r"([\d.]+) GiB", str(e.value)).groups())
    assert b == pytest.approx(4 * a, abs=0.1) and host == 0.0  # 1 MiB shown as 0.0 GiB
    monkeypatch.setattr(P, "host_memory_bytes", lambda: 1e15)
    P.check_memory(cfg, 4, hw)  # fits


def test_workers_per_node_and_node_count():
    assert N.per_node(16, 2) == 8 and N.per_node(8, 8) == 1
    with pytest.raises(PtdError, match="12 workers do not divide over 8 nodes"):
        N.per_node(12, 8)
    for n in (2, 3):
        N.Nodes(nnodes=n, node_rank=0, rdzv_endpoint="h:29500").validate()
    with pytest.raises(PtdError, match="at least 2"):
        N.Nodes(nnodes=1, node_rank=0, rdzv_endpoint="h:29500").validate()


def test_slurm_script_launches_ptd_train_through_srun():
    text = N.slurm_script("/shared/run/config.toml", 2, 8, port=29600)
    line = next(ln for ln in text.splitlines() if ln.startswith("srun"))
    assert line.startswith("srun --kill-on-bad-exit=1 bash -c 'ptd train --config "
                           "/shared/run/config.toml --nnodes \"$SLURM_NNODES\"")
    assert '--rdzv-endpoint "$HEAD:29600"' in line and text.endswith("\n")


def test_without_a_pipeline_the_schedule_field_is_moot():
    # a config file may name a schedule on pp 1: nothing about pipelines applies to it
    plan = _plan(dp=2, zero=3, schedule="zero-bubble")
    assert L.pp_problem(get_preset("tiny"), plan) is None

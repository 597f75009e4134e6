"""Tensor/pipeline parallelism without workers: the mesh, the stages and the tensor-parallel
shards of a rank equal what the cost model prices, and the schedule checks refuse exactly
what torch 2.13's schedules refuse. One process, a fake process group of any world size."""

import contextlib

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ptd.cost import params as P
from ptd.specs import ParallelPlan, get_preset, load_model
from ptd.specs.layout import AXES, groups, mesh_shape
from ptd.specs.stages import stage_to_rank


@contextlib.contextmanager
def fake_world(rank, world):
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_mesh_is_the_layout_of_the_cost_model():
    from torch.distributed.device_mesh import init_device_mesh
    plan = ParallelPlan(dp=2, tp=2, pp=2)
    for rank in range(plan.world_size):
        with fake_world(rank, plan.world_size):
            mesh = init_device_mesh("cpu", mesh_shape(plan), mesh_dim_names=AXES)
            for axis in AXES:
                mine = [g for g in groups(axis, plan) if rank in g]
                assert mesh[axis].mesh.tolist() == mine[0], (rank, axis)


TINY8 = load_model({"preset": "tiny", "n_layers": 8})
PLANS = [
    ParallelPlan(pp=2, schedule="1f1b"),
    ParallelPlan(pp=2, schedule="zero-bubble"),                       # ZB-V: stages r, 2p-1-r
    ParallelPlan(pp=2, vpp=2, schedule="interleaved-1f1b"),
    ParallelPlan(pp=2, vpp=4, schedule="zero-bubble"),                # interleaved zero bubble
    ParallelPlan(pp=3, schedule="gpipe", uneven_stages=True),         # 8 layers on 3 stages
    ParallelPlan(pp=4, vpp=2, schedule="interleaved-1f1b"),
]


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p.describe())
def test_stages_and_shards_are_what_the_cost_model_prices(plan, tp):
    from ptd.runtime.model.transformer import build_model
    from ptd.runtime.parallel.pp import split_model
    from ptd.runtime.parallel.tp import apply_tp
    plan = plan.replace(tp=tp, sp=tp > 1, global_batch=16, seq_len=64)
    plan.validate(TINY8)
    full = {n for n, _ in build_model(TINY8).named_parameters()}
    seen: list[str] = []
    for pp_rank in range(plan.pp):
        with fake_world(pp_rank * tp, plan.world_size):
            from torch.distributed.device_mesh import init_device_mesh
            mesh = init_device_mesh("cpu", mesh_shape(plan), mesh_dim_names=AXES)
            model, chunks, ids = split_model(build_model(TINY8), plan, pp_rank)
            if tp > 1:
                apply_tp(model, mesh["tp"], plan)
            names = [n for n, _ in model.named_parameters()]
            local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
                        for p in model.parameters())
            assert local == P.local_numel(TINY8, plan, pp_rank)
            assert len(model.layers) == P.layers_per_rank(TINY8, plan)[pp_rank]
            assert ids == [s for s in range(plan.n_stages) if stage_to_rank(s, plan) == pp_rank]
            # the chunks share the rank model's parameters (no copies), in stage order
            chunk_params = [id(p) for c in chunks for p in c.parameters()]
            assert sorted(chunk_params) == sorted(id(p) for p in model.parameters())
            assert (model.tok_embeddings is not None) == (0 in ids)
            assert (model.output is not None) == (plan.n_stages - 1 in ids)
            seen += names
    assert sorted(seen) == sorted(full)  # every parameter on exactly one pipeline rank


def _torch_accepts(plan):
    """Whether torch builds ``plan``'s schedule on every pipeline rank."""
    from torch.distributed.pipelining import PipelineStage
    from ptd.runtime.parallel.pp import local_stages, schedule_class
    cls = schedule_class(plan)
    for rank in range(plan.pp):
        with fake_world(rank, plan.pp):
            stages = [PipelineStage(nn.Linear(2, 2), s, plan.n_stages, torch.device("cpu"))
                      for s in local_stages(plan, rank)]
            try:
                if len(stages) == 1:
                    cls(stages[0], plan.n_microbatches, loss_fn=lambda a, b: a.sum())
                else:
                    cls(stages, plan.n_microbatches, loss_fn=lambda a, b: a.sum())
            except ValueError:
                return False
    return True


def test_schedule_checks_refuse_exactly_what_torch_refuses():
    from ptd.runtime.launch.limits import pp_problem
    model = load_model({"preset": "tiny", "n_layers": 12})
    checked = refused = 0
    for pp in (2, 3, 4):
        for sched, vpp in (("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2),
                           ("interleaved-1f1b", 3), ("zero-bubble", 1), ("zero-bubble", 3)):
            for m in range(1, 12):
                plan = ParallelPlan(pp=pp, vpp=vpp, schedule=sched, global_batch=m,
                                    uneven_stages=True, seq_len=64)
                try:
                    plan.validate(model)
                except Exception:
                    continue
                ok = pp_problem(model, plan) is None
                assert ok == _torch_accepts(plan), plan.describe()
                checked += 1
                refused += not ok
    assert checked > 100 and refused > 5


@pytest.mark.parametrize("plan,match", [
    (ParallelPlan(pp=2, vpp=2, schedule="interleaved-1f1b", global_batch=5), "multiple of max"),
    (ParallelPlan(pp=2, dp=2, zero=3, schedule="zero-bubble", global_batch=8), "zero 3"),
])
def test_pipeline_problems(plan, match):
    from ptd.runtime.launch.limits import pp_problem
    assert match in pp_problem(get_preset("tiny"), plan)


def test_pipeline_problems_of_model_and_compile():
    from ptd.runtime.launch.limits import pp_problem
    # tied embeddings train over stages (two copies, gradients summed), but not where the
    # zero-bubble V puts both stages on rank 0 as two FSDP roots
    gpt = get_preset("tiny-gpt")
    assert pp_problem(gpt, ParallelPlan(pp=2, dp=2, zero=3, schedule="1f1b")) is None
    assert pp_problem(gpt, ParallelPlan(pp=2, schedule="zero-bubble")) is None  # zero 0: shared
    assert "tied embeddings" in pp_problem(gpt, ParallelPlan(pp=2, dp=2, zero=1, schedule="zero-bubble"))
    assert pp_problem(gpt, ParallelPlan(pp=2, vpp=3, dp=2, zero=1, schedule="zero-bubble",
                                        global_batch=8)) is None  # (interleaved: no V)
    assert "compile" in pp_problem(get_preset("tiny"), ParallelPlan(pp=2, schedule="zero-bubble"),
                                   compile=True)
    assert pp_problem(get_preset("tiny"), ParallelPlan(pp=2, dp=2, zero=3, schedule="1f1b")) is None


def test_tensor_parallel_problems():
    from ptd.runtime.launch.limits import tp_problem
    assert tp_problem(get_preset("tiny"), ParallelPlan(tp=2, sp=True, zero=1)) is None
    # learned positions under sp: the embedding stays whole (tp.py), no longer refused
    assert tp_problem(get_preset("tiny-gpt"), ParallelPlan(tp=2, sp=True)) is None
    assert tp_problem(get_preset("tiny-gpt"), ParallelPlan(tp=2)) is None

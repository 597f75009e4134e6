"""Helpers the test modules share (fixtures live in conftest.py). No test module imports
another: what two of them need is here."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

from pytest import approx as _approx

from ptd.specs import ClusterSpec, ModelSpec, get_preset, load_hardware

# ----------------------------------------------------------------- runs of ptd train


def ptd_train(out: Path, *flags: str, home: Path, common: Sequence[str] = (),
              dump_params: bool = False, env: dict[str, str] | None = None,
              timeout: float = 150) -> subprocess.CompletedProcess:
    """``python -m ptd train COMMON FLAGS --out OUT`` as its own process, ptd's home at
    ``home``. ``PTD_FAULT`` and ``PTD_DUMP_PARAMS`` of this process are not passed on: a
    run gets a fault only through ``env``, and ``dump_params`` makes rank 0 save the whole
    model's parameters before the first and after the last step (``params_*.pt``)."""
    e = {k: v for k, v in os.environ.items() if k not in ("PTD_FAULT", "PTD_DUMP_PARAMS")}
    e["PTD_HOME"] = str(home)
    if dump_params:
        e["PTD_DUMP_PARAMS"] = "1"
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "ptd", "train", *common, *flags, "--out", str(out)],
                          env=e, capture_output=True, text=True, timeout=timeout)


def trained(out: Path, *flags: str, **kw: Any) -> Path:
    """:func:`ptd_train` that must succeed; the run folder."""
    ok(ptd_train(out, *flags, **kw))
    return out


def ok(r: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """``r`` if it exited 0; else fail with the ends of its output."""
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-8000:]
    return r


def records(out: Path) -> list[dict[str, Any]]:
    """The run's ``metrics.jsonl``, one dict per logged step."""
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def losses(out: Path) -> list[float]:
    return [r["loss"] for r in records(out)]


def grad_norms(out: Path) -> list[float]:
    return [r["grad_norm"] for r in records(out)]


def params(out: Path, which: str = "final") -> dict[str, Any]:
    """The parameters a ``dump_params`` run saved (``init`` or ``final``)."""
    import torch
    return torch.load(Path(out) / f"params_{which}.pt")


def assert_same_params(run: Path, ref: Path, rel: float = 1e-5) -> float:
    """Two ``dump_params`` runs: the final parameters within ``rel`` of their norm (L2 over
    all tensors), the initial ones bit-identical (the init is seeded by name, not layout).
    Returns the final parameters' relative difference."""
    import math

    import torch
    pa, pb = params(run), params(ref)
    assert set(pa) == set(pb)
    diff = math.sqrt(sum(float(((pa[k].double() - pb[k].double()) ** 2).sum()) for k in pb))
    norm = math.sqrt(sum(float((pb[k].double() ** 2).sum()) for k in pb))
    assert diff <= rel * norm, f"parameters differ by {diff / norm:.2e} of their norm"
    ia, ib = params(run, "init"), params(ref, "init")
    assert all(torch.equal(ia[k], ib[k]) for k in ib)
    return diff / norm


# ----------------------------------------------------------------- processes without ptd


def _in_world(worker: Any, rank: int, world: int, store: str, q: Any) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank,
                            world_size=world)
    try:
        q.put((rank, worker(rank, world)))
    finally:
        dist.destroy_process_group()


def spawn_world(worker: Any, world: int, store: Path, timeout: float = 80) -> dict[int, Any]:
    """``worker(rank, world)`` in each of ``world`` spawned processes, one thread each,
    joined in a gloo process group over a file store at ``store``; their results by rank.
    ``worker`` must be a module-level function (spawn pickles it by name)."""
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_in_world, args=(worker, r, world, str(store), q))
             for r in range(world)]
    for p in procs:
        p.start()
    out = dict(q.get(timeout=timeout) for _ in range(world))
    for p in procs:
        p.join(timeout=30)
    assert sorted(out) == list(range(world))
    return out


# ----------------------------------------------------------------- specs


def cluster(hw: str, n: int, per_node: int = 0) -> ClusterSpec:
    return ClusterSpec(load_hardware(hw), n, per_node)


def gpt(L: int, h: int, a: int, V: int = 51200, S: int = 2048, dropout: float = 0.0) -> ModelSpec:
    """A Megatron-style GPT: F = 4h, multi-head attention, LayerNorm, learned positions."""
    return get_preset("gpt2").replace(name=f"gpt-{L}x{h}", n_layers=L, hidden=h, n_heads=a,
                                      n_kv_heads=a, ffn_hidden=4 * h, vocab_size=V,
                                      max_seq_len=S, dropout=dropout)


# A spread of plans the planner chooses (winners and runners-up): every ZeRO stage, recompute
# kind, schedule, uneven stages, sequence parallel on and off, offload, GQA and MoE,
# fp16/bf16/fp32. (model, hardware, devices, global batch, seq len, fixed, dtype, how many)
EXPORT_SPREAD = [
    ("llama3.1-405b", "h100-sxm", 16384, 2048, 8192, {}, "bf16", 6),
    ("llama3.1-405b", "h100-sxm", 16384, 2048, 8192, {"schedule": "1f1b", "zero": 1}, "bf16", 2),
    ("mixtral-8x7b", "h100-sxm", 64, 256, 4096, {}, "bf16", 3),
    # gpt2 ties its embeddings and ptd's pipeline has no fp16 loss scaling: ptd train
    # refuses both with pp > 1, so the planner (one validator) offers neither
    ("gpt2", "a100-80g", 16, 64, 1024, {"pp": 1}, "fp16", 2),
    ("tiny", "cpu", 4, 32, 256, {"pp": 2, "schedule": "gpipe"}, "fp32", 2),
    ("tiny", "cpu", 4, 32, 256, {}, "fp32", 4),
    ("tiny", "cpu", 4, 32, 256, {"zero": 3, "offload": True, "recompute": "selective"}, "fp32", 2),
    ("tiny", "cpu", 4, 32, 256, {"tp": 2, "sp": False, "zero": 0}, "bf16", 2),
    ("tiny", "cpu", 4, 32, 256, {"pp": 2, "vpp": 2}, "fp32", 2),
    ("tiny", "cpu", 4, 32, 256, {"pp": 4, "schedule": "1f1b", "zero": 2}, "fp32", 2),
    ("llama3-8b", "h100-sxm", 32, 256, 8192, {"pp": 4, "schedule": "1f1b", "tp": 8}, "bf16", 2),
]


def export_spread() -> list[Any]:
    """The estimates of :data:`EXPORT_SPREAD`'s plans, in order."""
    from ptd.planner.search import search
    out = []
    for name, hw, n, gb, s, fix, dtype, k in EXPORT_SPREAD:
        r = search(get_preset(name), cluster(hw, n), gb, s, dtype=dtype, fixed=fix)
        out += r.ranked[:k]
    return out


# ----------------------------------------------------------------- no processes


def forbid_processes(monkeypatch: Any, start_workers: Any = None) -> None:
    """Fail the test if anything starts a worker, a torchrun or any subprocess; with
    ``start_workers``, calls to the launcher go there instead (to record them)."""
    import ptd.runtime.launch.launcher as launch

    def boom(*a: Any, **k: Any) -> None:
        raise AssertionError("a worker or a process was started")
    monkeypatch.setattr(launch, "start_workers", start_workers or boom)
    monkeypatch.setattr(subprocess, "run", boom)
    monkeypatch.setattr(subprocess, "Popen", boom)


def toy_links() -> Any:
    """An H100 preset with hand-chosen links (no calibrated fits), so that communication
    tests can write the alpha-beta arithmetic out: NVLink 100 GB/s at 50% (50 GB/s
    effective), 2 us; network 10 GB/s at 80% (8 GB/s effective), 10 us."""
    from ptd.specs.hardware import LinkSpec
    return load_hardware("h100-sxm").replace(
        intra_node=LinkSpec(bandwidth=100e9, latency=2e-6, efficiency=0.5),
        inter_node=LinkSpec(bandwidth=10e9, latency=10e-6, efficiency=0.8),
        collectives=())


def ptd_logits(spec: Any, state: Any, tokens: Any) -> Any:
    """Logits of ptd's model ``spec`` with weights ``state`` (CPU, eval, no grad)."""
    import torch
    from ptd.runtime.model.transformer import build_model
    model = build_model(spec, "cpu")
    model.init_buffers()
    model.load_state_dict(state, strict=False)
    model.eval()
    with torch.no_grad():
        return model(tokens)


def checkpoint_model(path: Path) -> tuple[Any, dict[str, Any]]:
    """(model spec, full state dict) of a ptd checkpoint folder, read in one process."""
    import torch.distributed.checkpoint as dcp
    from ptd.runtime.model.transformer import build_model
    from ptd.runtime.checkpoint import store
    ck = store.read(path)
    sd = dict(build_model(ck.config.model, "cpu").state_dict())
    dcp.load({"model": sd}, checkpoint_id=str(path), no_dist=True)
    return ck.config.model, sd


def hf_logits(folder: Path, tokens: Any) -> tuple[str, Any]:
    """(class name, logits) of the transformers model in ``folder`` (fp32, eval)."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return type(model).__name__, model(tokens).logits


def assert_same_run(run: Path, ref: Path, params_rel: float = 1e-5) -> None:
    """Per-step loss within 1e-5 (relative); final parameters within ``params_rel`` of their
    norm; initial parameters bit-identical (the init is seeded by name, not by layout)."""
    import torch
    la, lb = losses(run), losses(ref)
    assert len(la) == len(lb) == 10
    for step, (a, b) in enumerate(zip(la, lb), 1):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {step}: {a} vs {b}"
    # The global gradient norm (summed over FSDP shards) is the single process's; it is above
    # the clipping threshold 1.0 early on, so clipping is exercised.
    assert grad_norms(run) == _approx(grad_norms(ref), rel=1e-4)
    assert grad_norms(ref)[0] > 1.0
    assert_same_params(run, ref, params_rel)
    # The run really trained (guards against comparing two runs that did nothing).
    assert lb[-1] < lb[0] - 0.3
    pb, ib = params(ref), params(ref, "init")
    assert any(not torch.equal(pb[k], ib[k]) for k in pb)


# ----------------------------------------------------------------- tests that time the machine
# The suite runs in two pytest-xdist workers (pyproject.toml: two cores, and one worker left
# them ~30% idle while processes started). A test that times this machine against itself
# must not share the cores with the other worker's training runs, so the two workers take
# turns through two file locks in a folder conftest.py makes (PTD_TEST_LOCKS; absent when
# pytest runs in one process, and then nothing here waits):
#   every test holds "main" shared for its setup, call and teardown;
#   ``alone()`` holds "main" exclusively -- the other worker's running test ends first --
#   and holds "gate" exclusively too, which a test must pass (shared) before it takes "main",
#   so that the other worker's next test waits instead of overtaking it.
_FDS: dict[str, int] = {}


def _flock(name: str, how: int) -> None:
    folder = os.environ.get("PTD_TEST_LOCKS")
    if not folder:
        return
    if name not in _FDS:
        _FDS[name] = os.open(os.path.join(folder, name), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(_FDS[name], how)


@contextlib.contextmanager
def shared_turn() -> Iterator[None]:
    """Around each test (conftest.py's ``pytest_runtest_protocol``)."""
    _flock("gate", fcntl.LOCK_SH)  # waits while an alone() of the other worker runs
    _flock("main", fcntl.LOCK_SH)
    _flock("gate", fcntl.LOCK_UN)
    try:
        yield
    finally:
        _flock("main", fcntl.LOCK_UN)


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """``with alone():`` -- nothing of the other pytest worker runs inside (see above)."""
    # main is let go before waiting at the gate: were both workers to enter alone() at
    # once, each would otherwise hold what the other waits for
    _flock("main", fcntl.LOCK_UN)
    _flock("gate", fcntl.LOCK_EX)
    _flock("main", fcntl.LOCK_EX)
    try:
        yield
    finally:
        _flock("main", fcntl.LOCK_SH)  # back to the test's shared hold, still behind the gate
        _flock("gate", fcntl.LOCK_UN)


# ----------------------------------------------------------------- ranks in one test


def run_ranks(worker: Any, n: int, store_path: str, *args: Any, timeout: float = 90) -> dict:
    """``worker(rank, store_path, *args, q)`` in ``n`` spawned processes (a gloo group can
    meet at a ``FileStore`` on ``store_path``); each puts ``(rank, value)`` on ``q``. The
    processes are daemons and are killed if one outlives ``timeout``, so a hung rank fails
    the test rather than the run. Returns ``{rank: value}``; ``worker`` must be a module-level
    function (spawn imports it)."""
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    procs = [ctx.Process(target=_rank_entry, args=(worker, r, store_path, *args, q),
                         daemon=True) for r in range(n)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout)
            assert p.exitcode == 0, f"a rank exited with {p.exitcode}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    return dict(q.get() for _ in range(n))


def _rank_entry(worker: Any, *args: Any) -> None:
    """A rank of :func:`run_ranks`: the worker, then out without C++ static destructors --
    in torch 2.13 on CPU a thread left joinable can abort the exit ("terminate called
    without an active exception", as ``ptd.runtime.worker`` notes) after the work is done."""
    worker(*args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def small_tp_block_model(rank: int, store_path: str, tp: int, sp: bool) -> Any:
    """In a rank of :func:`run_ranks`: join the gloo group of ``tp`` ranks at ``store_path``
    and build ptd's ``small`` model split over it (``apply_tp``, sequence parallel if
    ``sp``), materialised with seed 0. The caller destroys the group."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from ptd.runtime.model.init import materialize
    from ptd.runtime.model.transformer import build_model
    from ptd.runtime.parallel.tp import apply_tp
    from ptd.specs.plan import ParallelPlan
    dist.init_process_group("gloo", store=dist.FileStore(store_path, tp), rank=rank,
                            world_size=tp)
    model = build_model(get_preset("small"), "meta")
    apply_tp(model, init_device_mesh("cpu", (tp,)), ParallelPlan(tp=tp, sp=sp))
    materialize(model, torch.device("cpu"), seed=0)
    return model

"""``ptd train``'s launcher: resolve, check, write the config, start the workers.

Everything that can be refused is refused *before* anything starts or is written:
the plan (``TrainConfig.validate``), the runtime's own limits (:func:`check_runtime`),
and the data (:func:`prepare_data`, which also builds the shared token cache). Then
``OUT/config.toml`` -- the fully resolved config -- is written and is the only thing the
workers read.

With ``nproc > 1`` the workers run under torchrun's elastic agent on this host. On a GPU
host that is a torchrun process starting fresh interpreters::

    python -m torch.distributed.run --standalone --nnodes 1 --nproc-per-node N \\
        --max-restarts R --log-dir OUT/torchrun -m ptd.runtime.worker OUT/config.toml

On a CPU-only Linux host the same agent, configured as ``--standalone`` configures it, runs
in this process and forks the workers from it (:func:`fork_workers`: torch is imported once,
not once per worker). The agent watches them: when one fails it stops the others; the
launcher then reads the failing worker's error file and prints its error. With one
process the worker runs inside ``ptd train`` itself (same code path, world size 1).

Several nodes: write the config once (``ptd train ... --dry-run --out OUT``), copy it to
every node, and on each run torchrun with its own rendezvous flags, e.g. node ``R`` of 2::

    OMP_NUM_THREADS=1 python -m torch.distributed.run --nnodes 2 --node-rank R \\
        --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST0:29500 \\
        --rdzv-id myrun -m ptd.runtime.worker OUT/config.toml
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from ...errors import PtdError
from ...specs import TrainConfig
from .nodes import Nodes, torchrun_flags


# what a GPU driver leaves on a host (NVIDIA's, and ROCm's which torch.cuda also drives)
_GPU_DRIVER_FILES = ("/proc/driver/nvidia/version", "/dev/nvidiactl", "/dev/kfd")


def gpu_count() -> int:
    """``torch.cuda.device_count()`` where it can be non-zero, else 0 without importing torch.

    Importing torch costs ~3 s of CPU on a small box, and the launcher of a multi-worker run
    would pay it only for this answer, before torchrun and every worker import it again:
    without a GPU driver torch cannot see a GPU, so there the answer is 0 for free."""
    if not any(os.path.exists(f) for f in _GPU_DRIVER_FILES):
        return 0
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_runtime(cfg: TrainConfig, nproc: int, this_host: bool = True) -> None:
    """What the plan allows but this runtime cannot do (yet), or this machine cannot.
    ``this_host``: all ``nproc`` workers run here (not so for a multi-node dry run)."""
    # the launcher imports nothing of the parallel runtime, which every worker imports again
    from .limits import plan_problem
    plan = cfg.plan
    problem = plan_problem(cfg.model, plan, compile=cfg.compile)  # the rules plan/export apply
    if problem:
        raise PtdError(problem)
    if plan.grad_compression != "none" and (plan.tp > 1 or plan.pp > 1 or plan.cp > 1):
        raise PtdError("gradient compression hooks need DDP, which tp > 1 or pp > 1 do not use "
                       "(their gradients are averaged over dp by the runner); use none")
    if plan.ep > 1 and plan.grad_compression != "none":
        raise PtdError("gradient compression hooks need DDP, which ep > 1 does not use; use none")
    gpus = gpu_count()
    if this_host and gpus and nproc > gpus:
        raise PtdError(f"{nproc} workers but {gpus} GPU(s) on this host")
    if cfg.tensorboard:
        import importlib.util
        if importlib.util.find_spec("tensorboard") is None:
            raise PtdError("--tensorboard needs the tensorboard package: "
                           "pip install -e '.[tensorboard]' (scripts/setup installs it)")
    if cfg.resume:  # a usable checkpoint of this same run
        from ..checkpoint.restore import precheck
        precheck(cfg)
    if cfg.init_from and not cfg.resume:
        from ..checkpoint.hf import precheck as hf_precheck
        hf_precheck(cfg.init_from, cfg.model, cfg.plan.seq_len)


def prepare_data(cfg: TrainConfig) -> None:
    """Resolve the data paths, build the token cache, check tokens against the model."""
    from ..data.corpus import Sources, check_stream, open_stream
    sources = Sources.resolve(cfg.data)
    stream = open_stream(sources)
    check_stream(stream, sources, cfg.model.vocab_size, cfg.plan.seq_len)
    train, val = stream.split(cfg.data.val_fraction)
    if len(train) < cfg.plan.seq_len + 1:
        raise PtdError("data: the training split is shorter than one sequence")
    if cfg.eval_every:
        from ..data.loader import eval_batches
        eval_batches(val, seq_len=cfg.plan.seq_len, global_batch=cfg.plan.global_batch,
                     micro_batch=cfg.plan.micro_batch, dp_rank=0, dp_size=cfg.plan.dp, max_steps=1)


def torchrun_command(config_path: Path, nproc: int, max_restarts: int, log_dir: Path,
                     nodes: Nodes | None = None) -> list[str]:
    where = torchrun_flags(nodes) if nodes else ["--standalone", "--nnodes", "1"]
    return [sys.executable, "-m", "torch.distributed.run", *where,
            "--nproc-per-node", str(nproc), "--max-restarts", str(max_restarts),
            "--log-dir", str(log_dir), "-m", "ptd.runtime.worker", str(config_path)]


def worker_env(cfg: TrainConfig) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(cfg.threads))
    if cfg.max_restarts:
        # torchrun shares its rendezvous store with the workers and keeps it across
        # restarts; a restarted worker can then read a dead peer's address left by the
        # previous attempt ("Gloo connectFullMesh failed ... Connection refused", seen here
        # with torch 2.13; pytorch/pytorch#135712). A fresh store per attempt avoids it.
        env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    return env


def failed_workers(log_dir: Path) -> list[str]:
    """``rank N: message`` for each worker error file torchrun left under ``log_dir``."""
    out = []
    for f in sorted(log_dir.glob("**/error.json"), key=lambda p: p.stat().st_mtime):
        try:
            msg = json.loads(f.read_text())["message"]
            text = msg["message"] if isinstance(msg, dict) else str(msg)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        rank = f.parent.name
        out.append(f"local rank {rank}: {text.strip().splitlines()[-1] if text.strip() else text}")
    return out


DIES_WITH_PARENT = "PTD_WORKER_DIES_WITH_PARENT"


def fork_ok() -> bool:
    """Fork CPU workers from this process (Linux, no GPU driver) instead of torchrun's
    fresh interpreters; ``PTD_LAUNCH=torchrun`` asks for the latter anyway."""
    import multiprocessing
    return (os.environ.get("PTD_LAUNCH", "fork") != "torchrun" and sys.platform == "linux"
            and "fork" in multiprocessing.get_all_start_methods() and gpu_count() == 0)


def fork_workers(cfg: TrainConfig, config_path: Path, nproc: int, log_dir: Path,
                 nodes: Nodes | None = None) -> int:
    """torchrun's own elastic agent (same rendezvous, restarts, error files, signal
    handling), run in this process, with workers forked from a fork server that has
    imported torch and the runtime once.

    Why: each fresh worker interpreter spends ~4.5 s of CPU importing torch and the parallel
    runtime, and torchrun's interpreter ~3 s more; on a 2-core box a 4-worker run of the tiny
    model then starts ~10 s before its first step. Imported once and forked, it starts in
    about half the time (docs/benchmarks.md, "Launching workers"). Why a fork *server* and
    not a fork of this process: by the time the agent starts workers it runs the rendezvous
    store's threads (``pt_tcpstore_uv``), and a child forked from a threaded process can
    inherit a lock some thread held at that instant and never get it (a worker that never
    reaches the store, and a launch that hangs in ``init_process_group`` until its timeout).
    The fork server has one thread (its imports start none). CPU only: a forked CUDA context is unusable, so GPU
    hosts keep torchrun. Nothing runs a torch op before the fork (a forked OpenMP pool would
    hang the workers)."""
    from ..resilience.interrupt import Forward
    saved = dict(os.environ)
    os.environ.update(worker_env(cfg))  # before torch is imported: its thread pools read it
    os.environ[DIES_WITH_PARENT] = "1"  # a forked worker dies with the fork server
    try:
        import multiprocessing
        from multiprocessing import forkserver
        # What the workers import, once, in the server: DDP, FSDP and pipelining import
        # torch._dynamo (~1 s of CPU), and pipelining itself with pp > 1. Started first, so
        # that its imports run beside the agent's own below.
        # The guard first: the server dies with this process (forkserver_guard.py).
        preload = ["ptd.runtime.launch.forkserver_guard", "ptd.runtime.worker", "torch._dynamo"]
        preload += ["torch.distributed.pipelining"] if cfg.plan.pp > 1 else []
        multiprocessing.set_forkserver_preload(preload)
        forkserver.ensure_running()
        from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.launcher.api import LaunchConfig, elastic_launch

        from .. import worker
        _cheap_rendezvous_event_names()
        n = nodes.nnodes if nodes else 1
        config = LaunchConfig(min_nodes=n, max_nodes=n, nproc_per_node=nproc,
                              run_id=nodes.rdzv_id if nodes else str(uuid.uuid4()),
                              rdzv_backend="c10d",
                              rdzv_endpoint=nodes.rdzv_endpoint if nodes else "localhost:0",
                              max_restarts=cfg.max_restarts,
                              monitor_interval=0.1, start_method="forkserver",
                              signals_to_handle=Forward.SIGNALS,  # Ctrl-C: interrupt.py
                              logs_specs=DefaultLogsSpecs(log_dir=str(log_dir)))
        try:
            with Forward():
                elastic_launch(config, worker.main)([str(config_path)])
        except ChildFailedError:
            return 1
        except SignalException as e:  # the agent stopped the workers first, as torchrun does
            return 128 + int(e.sigval)
        return 0
    finally:
        stop_fork_server()
        os.environ.clear()
        os.environ.update(saved)


def _cheap_rendezvous_event_names() -> None:
    """torch's dynamic rendezvous names each event it records after the method recording
    it, found with two ``inspect.stack()`` calls, each of which reads the source line of
    every frame; with torch imported that took 0.84 s of a 4-worker run's launch (9 events,
    2-core box, torch 2.13, cProfile). The frame's code name is the same name."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
    if getattr(dr, "get_method_name", None) is None or getattr(dr.get_method_name, "_ptd", False):
        return

    def get_method_name(depth: int = 2) -> str:
        try:
            return sys._getframe(depth).f_code.co_name
        except ValueError:  # a stack shallower than depth
            return "no_method_name"
    get_method_name._ptd = True  # type: ignore[attr-defined]
    dr.get_method_name = get_method_name


def stop_fork_server(timeout: float = 10.0) -> None:
    """Stop the fork server, then multiprocessing's resource tracker, before ``ptd train``
    prints its outcome. The tracker cleans up semaphores a crashed worker left registered
    and warns about them on stderr; it exits only when every holder of its pipe (the fork
    server too) has gone, so left to interpreter exit its warning came after ptd's last
    line, where people and scripts read the outcome. Bounded: a stop that hangs is left."""
    import threading
    from multiprocessing import forkserver, resource_tracker

    def stop() -> None:
        # The server holds nothing (its children have exited): killed, it skips the
        # interpreter's teardown of torch's modules, ~0.9 s of a 2-core box's time per run
        pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for server in (forkserver._forkserver, resource_tracker._resource_tracker):
            getattr(server, "_stop", lambda: None)()
    t = threading.Thread(target=stop, daemon=True)
    t.start()
    t.join(timeout)


def start_workers(cfg: TrainConfig, config_path: Path, nproc: int,
                  nodes: Nodes | None = None, log_dir: Path | None = None) -> int:
    """Run the workers to completion; return the exit code for ``ptd train``."""
    if nproc == 1 and nodes is None:
        from ..worker import run
        run(cfg)
        return stopped(cfg)
    log_dir = log_dir or Path(cfg.out) / "torchrun"
    shutil.rmtree(log_dir, ignore_errors=True)  # error files of an earlier run would mislead
    if fork_ok():
        rc = fork_workers(cfg, config_path, nproc, log_dir, nodes)
    else:
        cmd = torchrun_command(config_path, nproc, cfg.max_restarts, log_dir, nodes)
        rc = subprocess.run(cmd, env=worker_env(cfg)).returncode
    if rc == 128 + 2:  # Ctrl-C: the workers finished their step and saved (interrupt.py)
        return stopped(cfg, interrupted=True)
    if rc != 0:
        failures = failed_workers(log_dir)
        if failures:
            more = f" (and {len(failures) - 1} later)" if len(failures) > 1 else ""
            detail = f"earliest worker error: {failures[0]}{more}"
            if "No space left on device" in failures[0] or "disk full" in failures[0]:
                detail = "disk full: " + detail
        else:
            detail = ("no worker left an error file (killed by a signal?); see the elastic "
                      "agent's report above")
        print(f"ptd train: error: training failed (exit code {rc}); {detail}", file=sys.stderr)
        return rc if rc > 0 else 1
    return stopped(cfg)


def stopped(cfg: TrainConfig, interrupted: bool = False) -> int:
    """1 with the reason if the workers stopped the run on purpose (a non-finite loss);
    130 with the step if Ctrl-C stopped it."""
    try:
        status = json.loads((Path(cfg.out) / "summary.json").read_text()).get("status", "ok")
    except (OSError, ValueError):
        status = "interrupted (no summary written)" if interrupted else "ok"
    if status.startswith("interrupted"):
        print(f"ptd train: {status} (Ctrl-C); ptd train --resume {cfg.out} continues it",
              file=sys.stderr)
        return 130
    if status == "ok":
        return 0
    print(f"ptd train: error: training {status}", file=sys.stderr)
    return 1


def train(cfg: TrainConfig, nproc: int, dry_run: bool = False, nodes: Nodes | None = None) -> int:
    """Validate, prepare, write ``OUT/config.toml``, and (unless ``dry_run``) train.
    ``nodes``: this node's part of a multi-node job (:mod:`.nodes`); ``nproc`` is then the
    workers on this node."""
    from ...safeio import run_lock
    from .preflight import preflight
    if nodes:
        nodes.validate()
    cfg.validate(nproc * (nodes.nnodes if nodes else 1))
    check_runtime(cfg, nproc, this_host=not dry_run)
    done = preflight(cfg, nproc, dry_run)  # hardware, writable paths, memory, final step
    if done and not dry_run:
        print(done)
        return 0
    prepare_data(cfg)
    out, log_dir = Path(cfg.out), None
    if nodes and not nodes.writes_out:  # node 0 writes OUT/config.toml; the others nothing there
        out = nodes.private_dir()
        log_dir = out / "torchrun"
    with run_lock(out):  # a second ptd train into the same folder is refused, naming us
        config_path = out / "config.toml"
        cfg.save(config_path)
        if dry_run:
            print(f"ptd: wrote {config_path} ({cfg.plan.describe()}, {nproc} worker(s)); not training")
            return 0
        from ..calibrate.first_run import ensure_profile
        ensure_profile(cfg.hardware)  # the first run on a machine measures it (auto hardware)
        return start_workers(cfg, config_path, nproc, nodes, log_dir)

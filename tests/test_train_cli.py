"""ptd train before any worker: flags, config resolution, and one-line refusals."""

import pytest

from ptd.specs import load_config
from ptd.specs.tomlio import dumps


# Every ParallelPlan validation error of the specs (tests/test_specs.py), as a [plan] table.
PLAN_ERRORS = [
    ({"dp": 2, "tp": 2}, ["--nproc", "8", "--dp", "2"], "does not equal the world size 8"),
    ({"tp": 3}, [], "not divisible by tp 3"),
    ({"tp": 8}, [], "key/value heads are not divisible by tp 8"),
    ({"pp": 3}, [], "layers are not divisible by pp = 3"),
    ({"pp": 2, "vpp": 4, "schedule": "interleaved-1f1b", "global_batch": 8}, [],
     r"cannot fill pp\*vpp = 2\*4 stages"),
    ({"dp": 3, "global_batch": 8}, [], r"not divisible by micro-batch\*dp"),
    ({"pp": 4, "global_batch": 2, "schedule": "1f1b"}, [], "at least pp = 4 micro-batches"),
    ({"pp": 2, "vpp": 1, "schedule": "interleaved-1f1b"}, [], "needs vpp > 1"),
    ({"pp": 2, "vpp": 2, "schedule": "1f1b"}, [], "one stage per rank"),
    ({"vpp": 2}, [], "needs pp > 1"),
    ({"sp": True}, [], "needs tp > 1"),
    ({"zero": 4}, [], "zero must be"),
    ({"recompute": "most"}, [], "recompute must be"),
    ({"dtype": "fp64"}, [], "dtype must be"),
    ({"micro_batch": 0}, [], "positive integer"),
    ({"seq_len": 100000}, [], "exceeds"),
    ({"offload": True}, [], "offload needs zero 3"),
    ({"zero": 1, "grad_compression": "fp16"}, [], "DDP only"),
]
BASE_PLAN = {"dp": 1, "tp": 1, "pp": 1, "micro_batch": 1, "global_batch": 8, "seq_len": 128}


def _assert_refused(rc, err, out_dir, match):
    import re
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("ptd train: error:"), err
    assert re.search(match, err), err
    assert "Traceback" not in err
    assert not out_dir.exists()


@pytest.mark.parametrize("plan,flags,match", PLAN_ERRORS)
def test_plan_errors_one_line_exit_2_nothing_started(ptd_cli, no_workers, tmp_path, plan, flags, match):
    cfg = tmp_path / "run.toml"
    cfg.write_text(dumps({"model": {"preset": "tiny"}, "plan": {**BASE_PLAN, **plan}}))
    out = tmp_path / "out"
    rc, _, err = ptd_cli("train", "--config", str(cfg), "--out", str(out), *flags)
    _assert_refused(rc, err, out, match)


@pytest.mark.parametrize("flags,match", [
    (["--zero", "5"], "invalid choice"),
    (["--nproc", "0"], "positive integer"),
    (["--nproc", "3"], r"not divisible by micro-batch\*dp"),
    (["--model", "nope"], "unknown model preset"),
    (["--config", "/nonexistent.toml"], "config file not found"),
    (["--data", "/nonexistent/*.txt"], "no file matches"),
    (["--model", "tiny", "--seq-len", "300"], "exceeds"),
    (["--lr", "-1"], "positive number"),
])
def test_runtime_and_flag_errors_one_line(ptd_cli, no_workers, tmp_path, flags, match):
    out = tmp_path / "out"
    rc, _, err = ptd_cli("train", "--out", str(out), *flags)
    _assert_refused(rc, err, out, match)


def test_nproc_sets_dp_and_dry_run_writes_reproducible_config(ptd_cli, no_workers, tmp_path):
    out = tmp_path / "out"
    rc, stdout, err = ptd_cli("train", "--nproc", "2", "--model", "tiny", "--zero", "3",
                              "--micro-batch", "2", "--global-batch", "8", "--seq-len", "64",
                              "--steps", "7", "--lr", "0.01", "--seed", "5", "--recompute",
                              "selective", "--out", str(out), "--dry-run")
    assert rc == 0, err
    cfg = load_config(out / "config.toml")
    assert cfg.plan.dp == 2 and cfg.plan.zero == 3 and cfg.plan.recompute == "selective"
    assert cfg.steps == 7 and cfg.optim.lr == 0.01 and cfg.seed == 5 and cfg.out == str(out)
    assert cfg.model.name == "tiny" and cfg.model.hidden == 64
    # The written config alone reproduces the same resolved config.
    rc, _, err = ptd_cli("train", "--config", str(out / "config.toml"), "--dry-run")
    assert rc == 0, err
    assert load_config(out / "config.toml") == cfg


def test_default_config_is_valid_for_four_workers(ptd_cli, no_workers, tmp_path):
    from ptd.commands.train import resolve
    from ptd.cli import build_parser
    cfg, nproc = resolve(build_parser().parse_args(["train"]))
    assert nproc == 4 and cfg.model.name == "small" and cfg.plan.dtype == "fp32"
    cfg.validate(nproc)


# ------------------------------------------------------------------ the launcher's own cost
def _python(code, tmp_path):
    import os
    import subprocess
    import sys
    env = dict(os.environ, PTD_HOME=str(tmp_path / "home"))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)


def test_launcher_checks_devices_without_torch_where_no_gpu_driver_is(tmp_path):
    """Without a GPU driver torch cannot see a GPU, so the launcher of a multi-worker run
    (which hands everything to workers that import torch anyway) does not import it."""
    out = tmp_path / "run"
    r = _python(f"""
import sys
from ptd.runtime.launch import launcher as launch
launch._GPU_DRIVER_FILES = ("{tmp_path}/no-such-driver",)
assert launch.gpu_count() == 0
from ptd.cli import main
assert main(["train", "--nproc", "4", "--dp", "2", "--tp", "2", "--global-batch", "8",
             "--out", "{out}", "--dry-run"]) == 0
assert "torch" not in sys.modules, "the launcher imported torch"
""", tmp_path)
    assert r.returncode == 0, r.stderr
    assert (out / "config.toml").is_file()


def test_with_a_gpu_driver_the_launcher_asks_torch(tmp_path):
    driver = tmp_path / "version"
    driver.write_text("a driver")
    r = _python(f"""
import sys
from ptd.runtime.launch import launcher as launch
launch._GPU_DRIVER_FILES = ("{driver}",)
assert "torch" not in sys.modules
n = launch.gpu_count()
assert "torch" in sys.modules, "a GPU driver is there: torch must answer"
import torch
assert n == (torch.cuda.device_count() if torch.cuda.is_available() else 0), n
print(n)
""", tmp_path)
    assert r.returncode == 0, r.stderr


def test_cpu_workers_are_forked_unless_torchrun_is_asked_for(monkeypatch):
    from ptd.runtime.launch import launcher as launch
    monkeypatch.setattr(launch, "gpu_count", lambda: 0)
    monkeypatch.delenv("PTD_LAUNCH", raising=False)
    assert launch.fork_ok()
    monkeypatch.setenv("PTD_LAUNCH", "torchrun")
    assert not launch.fork_ok()
    monkeypatch.delenv("PTD_LAUNCH")
    monkeypatch.setattr(launch, "gpu_count", lambda: 8)
    assert not launch.fork_ok()  # a forked CUDA context is unusable


def test_cpu_workers_fork_from_a_fork_server_not_from_the_agent(monkeypatch, tmp_path):
    """The agent runs the rendezvous store's threads when it starts the workers, and a child
    forked from a threaded process can hang on a lock it inherited (one launch here did,
    in init_process_group): the workers come from the one-thread fork server, which has
    imported the worker (and pipelining, with pp > 1) before anything forks."""
    import multiprocessing
    from multiprocessing import forkserver

    import torch.distributed.launcher.api as api

    from ptd.runtime import worker
    from ptd.runtime.launch import launcher as launch
    from ptd.specs import TrainConfig
    seen: dict = {}
    monkeypatch.setattr(multiprocessing, "set_forkserver_preload",
                        lambda mods: seen.__setitem__("preload", list(mods)))
    monkeypatch.setattr(forkserver, "ensure_running", lambda: seen.__setitem__(
        "server_started_after_preload", "preload" in seen))

    def fake_launch(config, fn):
        seen.update(start_method=config.start_method, fn=fn)
        return lambda args: seen.__setitem__("args", args)
    monkeypatch.setattr(api, "elastic_launch", fake_launch)
    cfg = TrainConfig()
    cfg = cfg.replace(plan=cfg.plan.replace(dp=1, pp=2))
    assert launch.fork_workers(cfg, tmp_path / "config.toml", 2, tmp_path / "logs") == 0
    assert seen["start_method"] == "forkserver" and seen["server_started_after_preload"]
    assert {"ptd.runtime.worker", "torch.distributed.pipelining"} <= set(seen["preload"])
    assert seen["fn"] is worker.main and seen["args"] == [str(tmp_path / "config.toml")]


@pytest.mark.timeout(60)
def test_fork_server_and_resource_tracker_are_stopped_before_the_outcome_is_printed():
    """A crashed worker leaves semaphores registered with multiprocessing's resource tracker,
    which warns about them when it exits, and it exits only after the fork server: left to
    interpreter exit, that warning landed after ptd's last line ("ptd: error: training
    failed ..."). stop_fork_server ends both, so the outcome line is printed last."""
    from multiprocessing import forkserver, resource_tracker

    from ptd.runtime.launch.launcher import stop_fork_server
    forkserver.ensure_running()
    resource_tracker.ensure_running()
    assert forkserver._forkserver._forkserver_pid is not None
    assert resource_tracker._resource_tracker._pid is not None
    stop_fork_server()
    assert forkserver._forkserver._forkserver_pid is None
    assert resource_tracker._resource_tracker._pid is None


def test_rendezvous_event_names_are_the_callers_as_torch_names_them():
    """The launcher replaces the rendezvous's ``get_method_name`` (two ``inspect.stack()``
    calls, 0.84 s a launch) with a frame lookup; it must name the same frame: torch's
    ``inspect.stack()[depth].function``, where frame 0 is ``get_method_name`` itself."""
    import inspect

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    from ptd.runtime.launch.launcher import _cheap_rendezvous_event_names
    _cheap_rendezvous_event_names()
    fast = dr.get_method_name
    assert fast._ptd

    def as_torch(depth=2):
        return inspect.stack()[depth].function

    def recording_method(fn, depth):  # frame 2: the method that records the event
        return helper(fn, depth)

    def helper(fn, depth):  # frame 1: the recorder (dynamic_rendezvous's _record)
        return fn(depth)

    for depth in (1, 2, 3):
        assert recording_method(fast, depth) == recording_method(as_torch, depth)
    assert recording_method(fast, 2) == "recording_method"
    assert fast(10_000) == "no_method_name"


@pytest.mark.parametrize("pp,mb", [(2, 2), (4, 1)])
def test_default_micro_batch_leaves_a_pipeline_enough_micro_batches(tmp_path, monkeypatch, pp, mb):
    # the default plan: dp 4, global batch 16, micro-batch 4 -- one micro-batch a replica,
    # fewer than pp. 16 / 4 = 4 sequences a replica: pp 2 needs >= 2 micro-batches (mb 2),
    # pp 4 needs 4 (mb 1). A micro-batch the user gives is kept, and refused with the reason.
    import tomllib
    from ptd.cli import main
    monkeypatch.setenv("PTD_HOME", str(tmp_path / "home"))
    out = tmp_path / f"pp{pp}"
    assert main(["train", "--model", "tiny", "--pp", str(pp), "--dry-run", "--out", str(out)]) == 0
    plan = tomllib.loads((out / "config.toml").read_text())["plan"]
    assert (plan["dp"], plan["pp"], plan["global_batch"], plan["micro_batch"]) == (4, pp, 16, mb)
    assert main(["train", "--model", "tiny", "--pp", str(pp), "--micro-batch", "4", "--dry-run",
                 "--out", str(tmp_path / "given")]) == 2

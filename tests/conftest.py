import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

import helpers
from helpers import forbid_processes

ROOT = Path(__file__).resolve().parents[1]

# Tests keep their own ptd home: no hardware profile or data cache of whoever runs them
# (~/.ptd, $PTD_HOME) reaches a test, and none is written there. Many tests
# give each run a home of its own on top of this one.
_HOME = tempfile.mkdtemp(prefix="ptd-test-home-")
os.environ["PTD_HOME"] = _HOME
atexit.register(shutil.rmtree, _HOME, True)
# No test calibrates the machine unless it means to (``ptd train`` would, on a first run:
# ptd.runtime.calibrate.first_run); the runs tests start inherit this. Tests of the
# first-run calibration turn it back on.
os.environ["PTD_AUTO_CALIBRATE"] = "0"


def pytest_configure(config):
    """In pytest-xdist's controller (``-n 2``, pyproject.toml): the folder of the locks by
    which a test that times the machine runs alone (helpers.alone). The workers it starts
    next inherit the variable."""
    if getattr(config, "workerinput", None) is not None:
        return
    os.environ.pop("PTD_TEST_LOCKS", None)  # one from a pytest that started this one
    if getattr(config.option, "numprocesses", 0):
        config._ptd_locks = tempfile.mkdtemp(prefix="ptd-test-locks-")
        os.environ["PTD_TEST_LOCKS"] = config._ptd_locks


def pytest_unconfigure(config):
    if getattr(config, "_ptd_locks", None):
        shutil.rmtree(config._ptd_locks, True)


def pytest_collection_modifyitems(config, items):
    """Modules with the most multi-process tests first (the order within a module kept).
    pytest-xdist hands each worker whole modules in this order (``--no-loadscope-reorder``),
    so the long ones start early and the quick ones fill the end; by default it would order
    modules by their number of tests, and the last long module ran with the other worker
    idle (~2.5 min, 2026-11-28)."""
    def module(item):
        return getattr(getattr(item, "module", None), "__name__", "")
    heavy: dict[str, int] = {}
    for item in items:
        if item.get_closest_marker("dist"):
            heavy[module(item)] = heavy.get(module(item), 0) + 1
    items.sort(key=lambda item: -heavy.get(module(item), 0))  # (a stable sort)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with helpers.shared_turn():  # setup, call and teardown (module fixtures set up inside)
        yield


@pytest.fixture
def ptd_cli(capsys):
    """Run the ptd CLI in-process; returns (exit code, stdout, stderr)."""
    from ptd.cli import main

    def run(*argv: str):
        rc = main(list(argv))
        out, err = capsys.readouterr()
        return rc, out, err

    return run


@pytest.fixture(scope="module")
def module_home(tmp_path_factory):
    """A ptd home folder that one test module's training runs share."""
    return tmp_path_factory.mktemp("ptd_home")


@pytest.fixture
def no_workers(monkeypatch, tmp_path):
    """Nothing may start a process; ptd's home is a fresh folder."""
    forbid_processes(monkeypatch)
    monkeypatch.setenv("PTD_HOME", str(tmp_path / "cache"))


@pytest.fixture
def one_rank_gloo(tmp_path):
    """A one-rank gloo process group (a file store in ``tmp_path``), destroyed afterwards:
    collectives are identities, so code that reduces over a group runs in one process."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()

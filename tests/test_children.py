"""Processes ptd starts end with it (``ptd.children``): SIGTERM, SIGKILL, a timeout and
Ctrl-C to the parent each leave no child behind, and a child is asked (SIGTERM) before it
is killed, so that a ``ptd train`` child's agent can stop its own workers.

Each test runs a real parent process and real children and watches their pids; nothing is
mocked. The child below records each SIGTERM it gets in a file, then exits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

CHILD = textwrap.dedent("""
    import os, signal, sys, time
    d = sys.argv[1]
    def asked(*_):
        open(os.path.join(d, "asked"), "w").write(repr(time.time()))
        sys.exit(0)
    signal.signal(signal.SIGTERM, asked)
    open(os.path.join(d, "child.pid"), "w").write(str(os.getpid()))
    time.sleep(60)
""")

PARENT = textwrap.dedent("""
    import signal, sys
    from ptd.children import Terminated, run_child
    # Ctrl-C raises KeyboardInterrupt here even where the test runner was started with SIGINT
    # ignored (nohup, or `&` without job control), which its children would inherit
    signal.signal(signal.SIGINT, signal.default_int_handler)
    d, grace, timeout = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    try:
        run_child([sys.executable, "-c", {child!r}, d], grace=grace,
                  timeout=None if timeout == "none" else float(timeout))
    except Terminated:
        sys.exit(143)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:
        print(type(e).__name__)
        sys.exit(3)
""").format(child=CHILD)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_for(path: Path, limit: float = 30.0) -> None:
    end = time.monotonic() + limit
    while not path.exists():
        if time.monotonic() > end:
            raise AssertionError(f"{path.name} never appeared")
        time.sleep(0.05)


def _gone(pid: int, limit: float = 15.0) -> bool:
    end = time.monotonic() + limit
    while _alive(pid):
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def _parent(tmp_path: Path, grace: float = 10.0, timeout: str = "none") -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path), str(grace), timeout],
                         stdout=subprocess.PIPE, text=True)
    _wait_for(tmp_path / "child.pid")
    return p


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl: Linux")
def test_sigterm_to_the_parent_asks_the_child_to_stop_and_exits_143(tmp_path):
    p = _parent(tmp_path)
    child = int((tmp_path / "child.pid").read_text())
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 143
    assert (tmp_path / "asked").exists()  # SIGTERM first, not SIGKILL
    assert _gone(child)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl: Linux")
def test_a_parent_killed_outright_takes_its_child_with_it(tmp_path):
    p = _parent(tmp_path)
    child = int((tmp_path / "child.pid").read_text())
    p.kill()  # no code of the parent runs: the kernel's parent-death signal does it
    p.wait(30)
    _wait_for(tmp_path / "asked", 15)
    assert _gone(child)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl: Linux")
def test_a_timeout_asks_the_child_then_raises(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path), "10", "3"],
                         stdout=subprocess.PIPE, text=True)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 3 and out.strip() == "TimeoutExpired"
    assert (tmp_path / "asked").exists()
    assert not _alive(int((tmp_path / "child.pid").read_text()))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl: Linux")
def test_ctrl_c_gives_the_child_its_grace_before_asking(tmp_path):
    # Only the parent gets SIGINT here (a terminal would signal the child too, and a ptd
    # train child would be saving its step): the child is asked after `grace` seconds.
    p = _parent(tmp_path, grace=2.0)
    child = int((tmp_path / "child.pid").read_text())
    sent = time.time()
    p.send_signal(signal.SIGINT)
    assert p.wait(30) == 130
    asked_at = float((tmp_path / "asked").read_text())
    assert 1.8 <= asked_at - sent < 10
    assert _gone(child)


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                out.append(int(d.name))
    return out


def _spawned(pid: int) -> bool:
    """A multiprocessing worker (not its resource tracker)."""
    try:
        return b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _calibration(tmp_path: Path) -> tuple[subprocess.Popen, list[int]]:
    env = {**os.environ, "PTD_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    # the full calibration (minutes): an orphaned worker would still be timing when checked
    p = subprocess.Popen([sys.executable, "-m", "ptd", "calibrate", "--workers", "1,2",
                          "--out", str(tmp_path / "x.toml")], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 60
    while len(workers := [c for c in _children(p.pid) if _alive(c) and _spawned(c)]) < 2:
        assert p.poll() is None and time.monotonic() < end, "the calibration's workers never started"
        time.sleep(0.1)
    time.sleep(1.0)  # the workers have begun (spawned, importing or timing)
    return p, workers


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl: Linux")
def test_sigterm_to_ptd_calibrate_stops_its_workers(tmp_path):
    p, workers = _calibration(tmp_path)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143
    assert err.strip().splitlines()[-1] == "ptd calibrate: terminated"
    assert all(_gone(w) for w in workers)
    assert not (tmp_path / "x.toml").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl: Linux")
def test_ptd_calibrate_killed_outright_leaves_no_worker(tmp_path):
    p, workers = _calibration(tmp_path)
    p.kill()
    p.communicate(timeout=60)
    assert all(_gone(w) for w in workers)


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl: Linux")
def test_ptd_train_killed_outright_leaves_no_worker(tmp_path):
    # Forked workers (the CPU launch): before the guard the fork server and both workers
    # went on training, orphaned, to the last step.
    env = {**os.environ, "PTD_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    env.pop("PTD_LAUNCH", None)
    p = subprocess.Popen([sys.executable, "-m", "ptd", "train", "--model", "tiny", "--nproc", "2",
                          "--steps", "2000", "--hardware", "cpu", "--out", str(tmp_path / "run")],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + 90
    while not (tmp_path / "run" / "metrics.jsonl").exists():  # the workers are training
        assert p.poll() is None and time.monotonic() < end, "the run never started"
        time.sleep(0.2)
    tree = [q for q in _descendants(p.pid) if _alive(q)]
    assert len([q for q in tree if _spawned(q) or b"forkserver" in
                Path(f"/proc/{q}/cmdline").read_bytes()]) >= 3  # the server and 2 workers
    p.kill()
    p.wait(30)
    assert all(_gone(q) for q in tree)

"""The locks by which a test that times the machine runs alone while pytest-xdist runs the
suite in two workers (helpers.alone, helpers.shared_turn), between real processes. No step
here rests on how fast a process starts: each waits for what it must see in the log or in
the locks."""

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# a process that takes a turn (shared: as every test; alone: as a timing test) and appends
# "<name> in" and "<name> out" to a log around its hold; it holds for SECS seconds, or, given
# a log line instead, until that line is in the log (exit 3 after 20 s without it)
HOLD = """
import sys, time
sys.path.insert(0, {here!r})
import helpers
name, how, until, log = sys.argv[1:5]
def note(s):
    with open(log, "a") as f:
        f.write(f"{{name}} {{s}}\\n")
def hold():
    note("in")
    try:
        time.sleep(float(until))
    except ValueError:
        t0 = time.monotonic()
        while until not in open(log).read().splitlines():
            if time.monotonic() - t0 > 20:
                sys.exit(3)
            time.sleep(0.02)
    note("out")
with helpers.shared_turn():
    if how == "alone":
        with helpers.alone():
            hold()
    else:
        hold()
"""


def start(name, how, until, log, locks=None):
    env = {k: v for k, v in os.environ.items() if k != "PTD_TEST_LOCKS"}
    if locks:
        env["PTD_TEST_LOCKS"] = str(locks)
    return subprocess.Popen([sys.executable, "-c", HOLD.format(here=str(HERE)), name, how,
                             str(until), str(log)], env=env)


def wait_until(ready, what, timeout=30):
    t0 = time.monotonic()
    while not ready():
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.02)


def lines(log):
    return log.read_text().splitlines() if log.exists() else []


def gate_taken(locks):
    """Whether a process holds the gate exclusively (an alone() waiting or running)."""
    fd = os.open(locks / "gate", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_alone_waits_for_the_running_test_and_the_next_one_waits_for_it(tmp_path):
    locks, log = tmp_path / "locks", tmp_path / "log"
    locks.mkdir()
    a = start("a", "shared", "go", log, locks)  # the other worker's running test
    wait_until(lambda: "a in" in lines(log), "a in")
    b = start("b", "alone", 0.2, log, locks)  # the timing test, waiting for a
    wait_until(lambda: gate_taken(locks), "b at the gate")
    c = start("c", "shared", 0.1, log, locks)  # the other worker's next test
    time.sleep(0.5)
    assert lines(log) == ["a in"]  # neither b nor c got in while a holds its turn
    with open(log, "a") as f:
        f.write("go\n")  # a ends its test
    for p in (a, b, c):
        assert p.wait(timeout=30) == 0
    # b after a, and c, started before a ended, only after b
    assert lines(log) == ["a in", "go", "a out", "b in", "b out", "c in", "c out"]


def test_shared_turns_overlap_and_no_locks_means_no_waiting(tmp_path):
    locks = tmp_path / "locks"
    locks.mkdir()
    # each waits inside its turn for the other's "in": both inside at once, or a timeout
    for how, folder, log in (("shared", locks, tmp_path / "log"),
                             ("alone", None, tmp_path / "log2")):  # no PTD_TEST_LOCKS
        ps = [start("a", how, "b in", log, folder), start("b", how, "a in", log, folder)]
        assert [p.wait(timeout=30) for p in ps] == [0, 0], how
        assert sorted(lines(log)[:2]) == ["a in", "b in"], how

"""The locks by which a test that times the machine runs alone while pytest-xdist runs the
suite in two workers (helpers.alone, helpers.shared_turn), between real processes."""

import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# a process that takes a turn (shared: as every test; alone: as a timing test), appends
# "<name> in" and "<name> out" to a log around a sleep inside it
HOLD = """
import sys, time
sys.path.insert(0, {here!r})
import helpers
name, how, secs, log = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
def note(s):
    with open(log, "a") as f:
        f.write(f"{{name}} {{s}}\\n")
with helpers.shared_turn():
    if how == "alone":
        with helpers.alone():
            note("in"); time.sleep(secs); note("out")
    else:
        note("in"); time.sleep(secs); note("out")
"""


def start(name, how, secs, log, locks):
    env = dict(os.environ, PTD_TEST_LOCKS=str(locks))
    return subprocess.Popen([sys.executable, "-c", HOLD.format(here=str(HERE)), name, how,
                             str(secs), str(log)], env=env)


def wait_for(log, line, timeout=30):
    t0 = time.monotonic()
    while line not in (log.read_text().splitlines() if log.exists() else []):
        assert time.monotonic() - t0 < timeout, f"no {line!r} in {log}"
        time.sleep(0.02)


def test_alone_waits_for_the_running_test_and_the_next_one_waits_for_it(tmp_path):
    locks, log = tmp_path / "locks", tmp_path / "log"
    locks.mkdir()
    a = start("a", "shared", 1.0, log, locks)  # the other worker's running test
    wait_for(log, "a in")
    b = start("b", "alone", 1.0, log, locks)  # the timing test
    time.sleep(0.3)
    c = start("c", "shared", 0.1, log, locks)  # the other worker's next test, started later
    for p in (a, b, c):
        assert p.wait(timeout=30) == 0
    # b did not start before a ended, and c not before b ended
    assert log.read_text().split("\n")[:6] == ["a in", "a out", "b in", "b out", "c in", "c out"]


def test_shared_turns_overlap_and_no_locks_means_no_waiting(tmp_path):
    locks, log = tmp_path / "locks", tmp_path / "log"
    locks.mkdir()
    a, b = start("a", "shared", 1.0, log, locks), start("b", "shared", 1.0, log, locks)
    for p in (a, b):
        assert p.wait(timeout=30) == 0
    lines = log.read_text().split("\n")
    assert sorted(lines[:2]) == ["a in", "b in"]  # both inside at once
    # without PTD_TEST_LOCKS (pytest in one process) alone() takes nothing: two at once
    log2 = tmp_path / "log2"
    env = {k: v for k, v in os.environ.items() if k != "PTD_TEST_LOCKS"}
    ps = [subprocess.Popen([sys.executable, "-c", HOLD.format(here=str(HERE)), n, "alone", "1.0",
                            str(log2)], env=env) for n in ("a", "b")]
    for p in ps:
        assert p.wait(timeout=30) == 0
    assert sorted(log2.read_text().split("\n")[:2]) == ["a in", "b in"]

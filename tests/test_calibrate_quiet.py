"""``ptd calibrate`` says when other work shared the machine (``runtime/calibrate/quiet.py``):
the arithmetic by hand, and a real calibration beside two busy loops."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ptd.runtime.calibrate.quiet import _own_ticks, other_cores, warning


def test_other_cores_is_the_machines_busy_time_less_ours_over_the_wall():
    # 2 s; the machine's CPUs were busy 500 ticks of 10 ms (5 CPU-seconds), ours 300 (3):
    # other work took 2 CPU-seconds in 2 s, one core
    assert other_cores(10.0, 1000, 700, 12.0, 1500, 1000, 100.0) == pytest.approx(1.0)
    # ours above the machine's (ticks counted at different instants): none, not negative
    assert other_cores(0.0, 0, 0, 1.0, 10, 20, 100.0) == 0.0
    assert other_cores(1.0, 0, 0, 1.0, 10, 0, 100.0) == 0.0  # no time passed


def test_the_warning_judges_stages_long_enough_to_count():
    quiet = [{"stage": "a", "seconds": 3.0, "cores": 0.02},
             {"stage": "b", "seconds": 0.1, "cores": 0.9}]  # 0.1 s: a tick or two of noise
    assert warning(quiet, 2) is None
    assert warning([{"stage": "a", "seconds": 3.0, "cores": 0.24}], 2) is None
    shared = quiet + [{"stage": "matmul fp32 x2", "seconds": 2.0, "cores": 0.8},
                      {"stage": "memory x2", "seconds": 4.0, "cores": 0.3}]
    w = warning(shared, 2)
    assert w.startswith("warning: other processes kept 0.80 of 2 cores busy during "
                        "'matmul fp32 x2' (2 of 3 stages")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc: Linux")
def test_our_own_children_count_as_ours_alive_and_reaped():
    # A child burning a core is ours, while it runs and after it has been reaped; what the
    # rest of the machine does (a parallel test run) does not enter this count.
    hz = float(os.sysconf("SC_CLK_TCK"))
    me = os.getpid()
    t0, own0 = time.monotonic(), _own_ticks(me)
    p = subprocess.Popen([sys.executable, "-c",
                          "import time\nt=time.time()\nwhile time.time()-t<3: pass"])
    time.sleep(1.5)
    own_mid = _own_ticks(me)  # the child still running: a live descendant
    p.wait(30)
    own_end = _own_ticks(me)  # reaped: in our cutime now
    # under a shared machine's contention the child gets at least a third of a core
    assert (own_mid - own0) / hz >= 0.5
    # were a reaped child not counted, its ticks would vanish and this would be negative
    assert (own_end - own_mid) / hz >= 0.5
    assert time.monotonic() - t0 >= 3.0


@pytest.mark.timeout(180)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc: Linux")
def test_a_calibration_beside_busy_loops_says_so(tmp_path):
    burn = "import time\nt=time.time()\nwhile time.time()-t<90: pass"
    burners = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.5)
        env = {**os.environ, "PTD_HOME": str(tmp_path / "home")}
        r = subprocess.run([sys.executable, "-m", "ptd", "calibrate", "--quick", "--workers", "1",
                            "--out", str(tmp_path / "x.toml")], env=env, capture_output=True,
                           text=True, timeout=170)
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert r.returncode == 0, r.stderr
    assert "ptd calibrate: warning: other processes kept" in r.stderr
    stages = json.loads((tmp_path / "x.json").read_text())["meta"]["other_load"]
    long = [s for s in stages if s["seconds"] >= 0.5]
    assert long and max(s["cores"] for s in long) >= 0.5

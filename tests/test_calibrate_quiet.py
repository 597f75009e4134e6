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
    runs = [{"run": "n2-dp2-tp1-pp1-z0", "seconds": 9.0, "cores": 0.5}]
    assert warning(runs, 2, key="run", consequence="slow rows").startswith(
        "warning: other processes kept 0.50 of 2 cores busy during 'n2-dp2-tp1-pp1-z0' "
        "(1 of 1 runs of 0.5 s or more")
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
    # one busy loop: a whole core of other work (more would only slow a parallel test run)
    burn = "import time\nt=time.time()\nwhile time.time()-t<90: pass"
    burners = [subprocess.Popen([sys.executable, "-c", burn])]
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


@pytest.mark.timeout(120)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc: Linux")
def test_the_bench_records_what_other_processes_took_during_each_run(monkeypatch, tmp_path):
    # Each fake run sleeps 1.5 s; during the second a detached busy loop (not our
    # descendant: its parent exits at once) takes a core. Run 1 may share the machine with
    # a parallel test run, so only run 2's figure is checked, and that the runs are named.
    from ptd.bench import scaling as S
    burn = "import time\nt=time.time()\nwhile time.time()-t<1.4: pass"
    detach = ("import subprocess, sys\n"
              f"subprocess.Popen([sys.executable, '-c', {burn!r}])")

    def fake(folder, flags, timeout):
        if folder.name.startswith("n2"):
            subprocess.run([sys.executable, "-c", detach], check=True)
        time.sleep(1.5)
        return {"measured": {"step_time_s": 1.0, "tokens_per_s": 1.0, "mfu": 0.1},
                "predicted": {"step_time_s": 1.0, "tokens_per_s": 1.0, "mfu": 0.1},
                "plan_desc": folder.name}
    monkeypatch.setattr(S, "train_subprocess", fake)
    data = S.measure(tmp_path, model="tiny", seq_len=8, global_batch=4, steps=5, workers=[1, 2],
                     strategies=["ddp"], hardware=None, run_timeout=10, log=lambda *a: None)
    runs = {r["run"]: r for r in data["other_load"]}
    assert list(runs) == ["n1-dp1-tp1-pp1-z0", "n2-dp2-tp1-pp1-z0"]
    assert runs["n2-dp2-tp1-pp1-z0"]["seconds"] >= 1.5
    assert runs["n2-dp2-tp1-pp1-z0"]["cores"] >= 0.4  # ~1.3 CPU-seconds of 1.5+ s

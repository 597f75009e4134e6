"""ptd report: one self-contained HTML page per run folder.

Run folders are written by hand in the structure of a real `ptd train` run (a dp2 x pp2
run, trimmed to two ranks); one test makes a real 1-process run and reports on it.
"""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ptd.report.svg import LineChart, Series, nice_ticks

SRC = Path(__file__).resolve().parents[1] / "src"

LOSSES = [5.5771, 5.4913, 5.4247, 5.3318, 5.2715, 5.2611, 5.1033, 4.9420]
VAL = {4: 5.4467, 8: 5.3299}
CONFIG = """steps = 8
seed = 0
out = "RUN"
hardware = "auto"

[model]
name = "tiny"
n_layers = 4
hidden = 64

[plan]
dp = 2
tp = 1
pp = 2
zero = 0
micro_batch = 2
global_batch = 8
seq_len = 64
schedule = "1f1b"
dtype = "fp32"
"""

BREAKDOWN_M = {"compute": 0.0244, "forward": 0.0108, "backward": 0.0136, "recompute": 0.0,
               "tp_comm": 0.0, "pp_comm": 0.0017, "dp_comm_exposed": 0.0069, "bubble": 0.0188,
               "optimizer": 0.0066, "data": 0.00026, "other": 0.0032}
BREAKDOWN_P = {"compute": 0.0099, "forward": 0.0034, "backward": 0.0065, "recompute": 0.0,
               "tp_comm": 0.0, "pp_comm": 0.0041, "dp_comm_exposed": 0.0016, "bubble": 0.0,
               "optimizer": 0.0017, "dp_comm_total": 0.0016}
MEM = {"params": 361728, "grads": 361728, "optimizer": 723456, "model_states": 1446912,
       "activations": 2447360}


def report_html(ptd_cli, run):
    """``ptd report RUN`` (must exit 0) and the page it wrote."""
    rc, _, err = ptd_cli("report", str(run))
    assert rc == 0, err
    return (run / "report.html").read_text()


def _rank(rank, pp, dp):
    return {
        "rank": rank, "coords": {"pp": pp, "dp": dp, "tp": 0},
        "memory": {"activations": 2447360, "activations_with_grads": 2480128,
                   "model_states": {"params": 361472, "grads": 361472, "optimizer": 722944,
                                    "optimizer_step_counters": 76, "total": 1445888}},
        "predicted_memory": {"params": 361472, "grads": 361472, "optimizer": 722944,
                             "total": 1445888, "activations": 2244608.0},
        "breakdown": {"step": 0.0618,
                      "parts": {"forward": 0.0108, "backward": 0.0136, "bubble": 0.0188,
                                "comm:send": 0.00157, "comm:recv": 0.000125,
                                "comm:all_reduce": 0.00919, "optimizer": 0.0056},
                      "comm_total": {"send": 0.0145, "recv": 0.0130, "all_reduce": 0.00904},
                      "comm_exposed_by_phase": {"schedule": {"send": 0.00157}}},
        "cost_view": dict(BREAKDOWN_M),
    }


def summary(**over):
    measured = {
        "step_time_s": 0.1338, "tokens_per_s": 3825.9, "tokens_per_s_per_device": 956.5,
        "samples_per_s": 59.78, "samples_per_s_per_device": 14.94,
        "tflops_per_device": 0.001128, "hardware_tflops_per_device": 0.001128,
        "mfu": 0.01243, "hfu": 0.01243, "clean_steps": [6, 7, 8], "breakdown_rank": 1,
        "profiled_step_time_s": 0.0618, "breakdown": dict(BREAKDOWN_M),
        "breakdown_sum_s": 0.0618,
        "comm_total_s": {"send": 0.0145, "recv": 0.0130, "all_reduce": 0.00904},
        "comm_exposed_s": {"send": 0.00157, "recv": 0.000125, "all_reduce": 0.00919},
        "bubble_per_rank_s": {"0": 0.0139, "1": 0.0188},
        "memory": {**MEM, "optimizer_step_counters": 80, "model_states_equal_per_rank": True},
    }
    predicted = {
        "step_time_s": 0.01737, "tokens_per_s": 29482.4, "tokens_per_s_per_device": 7370.6,
        "samples_per_s": 460.66, "samples_per_s_per_device": 115.17,
        "tflops_per_device": 0.008695, "hardware_tflops_per_device": 0.008695,
        "mfu": 0.09576, "hfu": 0.09576, "breakdown": dict(BREAKDOWN_P),
        "memory": {**MEM, "activations": 2244608.0},
    }
    ratio = {k: measured[k] / predicted[k] for k in
             ("step_time_s", "tokens_per_s", "tokens_per_s_per_device", "samples_per_s",
              "tflops_per_device", "mfu", "hfu")}
    s = {
        "status": "ok", "steps": 8, "first_loss": LOSSES[0], "last_loss": LOSSES[-1],
        "min_loss": min(LOSSES), "last10_loss": sum(LOSSES) / len(LOSSES),
        "loss_curve": [[1, LOSSES[0]], [3, LOSSES[2]], [5, LOSSES[4]], [6, LOSSES[5]],
                       [8, LOSSES[7]]],
        "tokens": 4096, "tokens_per_s": 5105.2, "step_time_s_mean": 0.1003,
        "train_time_s": 0.796, "wall_time_s": 2.8025, "world_size": 4,
        "plan": {"dp": 2, "tp": 1, "pp": 2, "zero": 0, "micro_batch": 2, "global_batch": 8,
                 "seq_len": 64, "schedule": "1f1b", "dtype": "fp32"},
        "plan_desc": "dp2 tp1 pp2 zero0 mb2 gb8 1f1b", "model": "tiny",
        "param_count": 180800, "device": "cpu", "dtype": "fp32", "torch": "2.13.0+cpu",
        "val_loss": VAL[8], "measured": measured, "predicted": predicted, "ratio": ratio,
        "per_rank": [_rank(0, 0, 0), _rank(1, 0, 1)],
        "prediction": {"hardware": "cpu", "hardware_source": "preset cpu",
                       "peak_flops": 9.08e10,
                       "flops_per_token": {"model": 1179648.0, "hardware": 1179648.0}},
    }
    s.update(over)
    return s


def metrics(losses=LOSSES, val=VAL):
    recs = []
    for i, loss in enumerate(losses, 1):
        r = {"step": i, "loss": loss, "lr": 1.5e-4 * i, "grad_norm": 3.0, "tokens": 512 * i,
             "step_tokens": 512, "step_time_s": 0.1 + 0.01 * i,
             "tokens_per_s": 512 / (0.1 + 0.01 * i), "skipped": not math.isfinite(loss),
             "elapsed_s": 0.12 * i}
        if i in val:
            r["val_loss"] = val[i]
        if i == 2:
            r["memory_tracked"] = True
        if i in (3, 4, 5):
            r["profiled"] = True
        recs.append(r)
    return recs


def make_run(path: Path, summ=None, recs=None, config=CONFIG) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if summ is not False:
        (path / "summary.json").write_text(json.dumps(summary() if summ is None else summ))
    if recs is not False:
        recs = metrics() if recs is None else recs
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    if config is not None:
        (path / "config.toml").write_text(config.replace("RUN", str(path)))
    return path


def external_refs(html: str) -> list[str]:
    """Anything the page would fetch: src/href/url() to a URL, scripts, imports."""
    bad = re.findall(r"""(?:src|href|xlink:href)\s*=\s*["']?\s*(?:https?:|//)""", html, re.I)
    bad += re.findall(r"<script\b[^>]*\bsrc\s*=", html, re.I)
    bad += re.findall(r"""url\(\s*["']?\s*(?:https?:|//)""", html, re.I)
    bad += re.findall(r"@import", html, re.I)
    bad += re.findall(r"<link\b", html, re.I)
    return bad


def test_report_written_self_contained_with_loss_plan_and_charts(ptd_cli, tmp_path):
    run = make_run(tmp_path / "run")
    rc, out, err = ptd_cli("report", str(run))
    assert rc == 0, err
    path = run / "report.html"
    assert out.strip() == f"ptd: wrote {path}"
    html = path.read_text()
    assert html.startswith("<!DOCTYPE html>")
    assert external_refs(html) == []
    assert "http://" not in html and "https://" not in html
    assert "<script" not in html.lower()
    assert html.count("<svg") >= 3  # loss, throughput, breakdown
    assert "dp2 tp1 pp2 zero0 mb2 gb8 1f1b" in html
    for i, loss in enumerate(LOSSES, 1):                 # every step's loss, as a tooltip
        assert f"train loss, step {i}: {loss:.4f}" in html
    for step, v in VAL.items():
        assert f"validation loss, step {step}: {v:.4f}" in html
    assert "4.9420" in html and "5.5771" in html         # header: first and last loss
    assert "2.13.0+cpu" in html and "4,096" in html
    assert 'schedule = &quot;1f1b&quot;' in html              # config.toml, escaped, in <pre>
    assert "throughput per step" in html and "step time by part" in html
    # per rank memory: both ranks; communication: each kind
    assert html.count("<table") >= 4
    for kind in ("all_reduce", "send", "recv"):
        assert f"<td>{kind}</td>" in html


def _row(html: str, key: str) -> str:
    m = re.search(rf'<tr class="d\d" data-key="{key}">(.*?)</tr>', html)
    assert m, key
    return m.group(1)


def test_ratios_coloured_only_when_off_by_more_than_25_percent(ptd_cli, tmp_path):
    s = summary()
    s["measured"]["memory"]["activations"] = 1.2 * s["predicted"]["memory"]["activations"]
    s["measured"]["memory"]["grads"] = 0.5 * s["predicted"]["memory"]["grads"]
    run = make_run(tmp_path / "run", s)
    html = report_html(ptd_cli, run)
    step = _row(html, "step_time_s")
    assert 'class="r hi"' in step and ">7.70<" in step       # 0.1338 / 0.01737
    assert 'class="r lo"' in _row(html, "tokens_per_s")
    assert 'class="r lo"' in _row(html, "mem_grads") and ">0.50<" in _row(html, "mem_grads")
    act = _row(html, "mem_activations")                       # 1.20: within 25%
    assert ">1.20<" in act and " hi" not in act and " lo" not in act
    params = _row(html, "mem_params")
    assert ">1.00<" in params and " hi" not in params
    assert "not predicted" in _row(html, "bubble")           # measured 18.8 ms, predicted 0


def test_model_name_is_escaped(ptd_cli, tmp_path):
    evil = '<script>alert("x")</script>&'
    s = summary(model=evil, plan_desc="dp2 <b>pp2</b>")
    run = make_run(tmp_path / "run", s, config=CONFIG.replace('"tiny"', '"</pre><script>"'))
    html = report_html(ptd_cli, run)
    assert "<script" not in html.lower()
    assert "<b>" not in html and "</pre><script>" not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;" in html
    assert "dp2 &lt;b&gt;pp2&lt;/b&gt;" in html


def test_json_flag_and_out_path(ptd_cli, tmp_path):
    run = make_run(tmp_path / "run")
    out = tmp_path / "elsewhere" / "r.html"
    rc, stdout, err = ptd_cli("report", str(run), "--out", str(out), "--json")
    assert rc == 0, err
    assert json.loads(stdout) == {"html": str(out)}
    assert out.is_file() and not (run / "report.html").exists()


@pytest.mark.parametrize("setup,match", [
    (lambda p: None, "no such run folder"),
    (lambda p: p.mkdir(), "not a ptd run folder"),
    (lambda p: p.write_text("x"), "not a ptd run folder"),
    (lambda p: (p.mkdir(), (p / "summary.json").write_text("{oops")), "not a ptd run folder"),
])
def test_bad_run_dir_one_line_exit_2(ptd_cli, tmp_path, setup, match):
    p = tmp_path / "run"
    setup(p)
    rc, out, err = ptd_cli("report", str(p))
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("ptd report: error:") and match in err, err
    assert "Traceback" not in err and out == ""
    assert not (p / "report.html").exists()


def test_bad_run_dir_exit_code_of_the_real_command(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    r = subprocess.run([sys.executable, "-m", "ptd", "report", str(tmp_path / "missing")],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "no such run folder" in r.stderr


def test_out_is_a_directory_refused(ptd_cli, tmp_path):
    run = make_run(tmp_path / "run")
    rc, _, err = ptd_cli("report", str(run), "--out", str(tmp_path))
    assert rc == 2 and "is a directory" in err


def test_stopped_run_without_measurement_still_renders(ptd_cli, tmp_path):
    losses = [5.5771, 5.4913, float("nan")]
    s = summary(status="stopped: non-finite loss at step 3", steps=3, last_loss=float("nan"))
    for k in ("measured", "predicted", "ratio", "per_rank", "prediction"):
        del s[k]
    run = make_run(tmp_path / "run", s, metrics(losses, {}))
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 4, "loss": 5.1, "lr"')              # cut off by a crash
    html = report_html(ptd_cli, run)
    assert "stopped: non-finite loss at step 3" in html
    assert 'class="status bad"' in html
    assert "no prediction" in html
    assert "nothing measured" in html or "no measurement" in html
    assert "non-finite loss at step(s) 3" in html
    assert "1 unreadable line(s) skipped" in html
    assert "train loss, step 2: 5.4913" in html and "train loss, step 3" not in html
    assert "NaN" not in html.replace("nan</dd>", "")
    assert external_refs(html) == []


def test_steps_are_printed_as_ranges(ptd_cli, tmp_path):
    from ptd.fmt import step_ranges
    assert step_ranges([6, 7, 8]) == "6-8"
    assert step_ranges([3]) == "3"
    assert step_ranges([9, 1, 2, 3, 5, 7, 8, 2]) == "1-3, 5, 7-9"
    assert step_ranges([]) == ""
    s = summary()
    s["measured"]["clean_steps"] = [6] + list(range(8, 201))     # step 7 profiled, say
    losses = [5.0] * 8
    losses[3] = losses[4] = losses[6] = float("nan")             # steps 4, 5, 7
    run = make_run(tmp_path / "run", s, metrics(losses, {}))
    html = report_html(ptd_cli, run)
    assert "measured step time: mean of steps 6, 8-200 (no warm-up" in html
    assert "8, 9" not in html
    assert "non-finite loss at step(s) 4-5, 7" in html


def test_crashed_run_with_metrics_only(ptd_cli, tmp_path):
    run = make_run(tmp_path / "run", summ=False, recs=metrics(LOSSES[:4], {}))
    html = report_html(ptd_cli, run)
    assert "unknown (no summary.json)" in html
    assert "<h1>ptd run: tiny, dp2 tp1 pp2 zero0</h1>" in html   # from config.toml
    assert f"train loss, step 4: {LOSSES[3]:.4f}" in html


def test_single_step_run_without_prediction(ptd_cli, tmp_path):
    s = summary(steps=1, loss_curve=[[1, 5.5659]], first_loss=5.5659, last_loss=5.5659)
    del s["predicted"], s["ratio"], s["prediction"]
    del s["measured"]["breakdown"]
    s.pop("val_loss")
    run = make_run(tmp_path / "run", s, metrics([5.5659], {}))
    html = report_html(ptd_cli, run)
    assert "train loss, step 1: 5.5659" in html
    assert "no prediction" in html
    assert "no measured breakdown" in html
    step = _row(html, "step_time_s")
    assert "134 ms" in step and step.endswith('<td class="r">-</td>')


def test_report_package_imports_neither_torch_nor_matplotlib(tmp_path):
    run = make_run(tmp_path / "run")
    code = (f"import sys; from ptd.report import write_report; write_report({str(run)!r});"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'matplotlib')];"
            "assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (run / "report.html").is_file()


def test_nice_ticks_and_degenerate_charts():
    assert nice_ticks(0, 10) == [0, 2, 4, 6, 8, 10]
    assert nice_ticks(4.93, 5.61) == pytest.approx([5.0, 5.2, 5.4, 5.6])
    one = LineChart("x", [Series("s", [(1.0, 2.0)])]).render()
    assert one.startswith("<svg") and one.count("<circle") == 1 and "NaN" not in one
    flat = LineChart("x", [Series("s", [(1.0, 3.0), (2.0, 3.0)])]).render()
    assert "<polyline" in flat and "nan" not in flat.lower()
    assert "no data" in LineChart("empty", [Series("s", [])]).render()


@pytest.mark.timeout(120)
def test_real_run_report(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1",
           "PTD_HOME": str(tmp_path / "home")}
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "ptd", "train", "--model", "tiny", "--steps", "3",
                        "--nproc", "1", "--global-batch", "2", "--micro-batch", "2",
                        "--seq-len", "32", "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=110)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([sys.executable, "-m", "ptd", "report", str(out), "--json"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    path = Path(json.loads(r.stdout)["html"])
    html = path.read_text()
    summ = json.loads((out / "summary.json").read_text())
    from ptd.summary.schema import problems
    assert problems(summ) == []  # what ptd train writes follows the typed schema
    assert "does not follow the schema" not in html
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(recs) == 3
    assert summ["plan_desc"] in html
    for rec in recs:
        assert f"train loss, step {rec['step']}: {rec['loss']:.4f}" in html
    assert external_refs(html) == [] and "<svg" in html
    assert ("no prediction" in html) == ("predicted" not in summ)


@pytest.mark.parametrize("profiled, note", [(0.0618, None), (0.1525, None), (0.1606, "1.20x")])
def test_a_profiled_step_much_longer_than_the_clean_ones_is_flagged(profiled, note):
    # clean steps 0.1338 s: 0.1525 s is 1.14x (no note, under 1.15x), 0.1606 s is 1.20x
    from ptd.summary.compare import comparison_table
    s = summary()
    s["measured"]["profiled_step_time_s"] = profiled
    flagged = [ln for ln in comparison_table(s).splitlines() if "the profiled step took" in ln]
    if note is None:
        assert flagged == []
    else:
        assert flagged == [f"ptd: the profiled step took {note} the clean steps: its parts above "
                           "carry the profiler's own cost; the step time is the clean steps'"]


@pytest.mark.parametrize("zero", [0, 1, 3])
def test_a_zero_runs_activation_line_says_what_the_peak_also_holds(zero):
    # under ZeRO the tracked peak also holds FSDP's gathers and unreduced gradients, the
    # estimate's buffers: the table says so beside them (here 24,659,968 B = 23.52 MiB)
    from ptd.summary.compare import comparison_table
    s = summary()
    s["prediction"]["estimate"] = {"plan": {**s["plan"], "zero": zero},
                                   "memory_per_device_bytes": {"buffers": 24659968.0}}
    noted = [ln for ln in comparison_table(s).splitlines() if "under ZeRO" in ln]
    if zero == 0:
        assert noted == []
    else:
        assert noted == ["ptd: under ZeRO the measured activation peak also holds FSDP's "
                         "gathered parameters and unreduced gradients, which the prediction "
                         "counts apart as buffers (23.52 MiB on the most loaded rank)"]

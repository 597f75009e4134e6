"""The first run on a machine calibrates it (ptd.runtime.calibrate.first_run): the cache key,
a cache hit, a miss when the machine changes, the opt-outs, ``ptd train`` using the profile
it measured, ``ptd calibrate`` refreshing it.

The measurement itself is replaced by a stand-in that writes a recognisable profile
(an fp32 matmul rate of 1.234e11 FLOP/s): what ``ptd calibrate --quick`` measures is tested in
test_calibrate.py; here what matters is when it runs and what is used afterwards.
"""

import json
import os
from pathlib import Path

import pytest

from ptd.cli import main
from ptd.runtime.calibrate import first_run

ROOT = Path(__file__).resolve().parents[1]
MARK = 1.234e11


def fake_calibration(calls):
    def calibrate(workers, dtypes, quick, base, name, info, on_tick=lambda s: None,
                  model_shapes=None, model_attention=None, op_spec=None, moe_spec=None):
        calls.append({"workers": workers, "dtypes": dtypes, "quick": quick, "base": base,
                      "cpu": info["name"], "model_shapes": model_shapes,
                      "model_attention": model_attention, "op_spec": op_spec,
                      "moe_spec": moe_spec})
        on_tick("gemm")
        rates = {"fp32": MARK, "bf16": 5e9, "fp16": 5e9}
        return {"hardware": {"preset": base, "peak_flops": rates,
                             "gemm_flops_measured": {"fp32": {1: MARK}, "bf16": {1: 5e9}}},
                "meta": {"cpu": info["name"], "cpu_count": info["count"]},
                "plan": {}, "summary": {}}
    return calibrate


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A PTD home with no profile, first-run calibration on, no GPU, a fake measurement."""
    monkeypatch.setenv("PTD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PTD_AUTO_CALIBRATE", "1")
    monkeypatch.setattr(first_run, "_has_gpu", lambda: False)
    calls = []
    import ptd.runtime.calibrate as calibrate_pkg
    monkeypatch.setattr(calibrate_pkg, "calibrate", fake_calibration(calls))
    return tmp_path / "home", calls


def test_key_names_cpu_model_cores_and_torch():
    assert first_run.machine_key("AMD EPYC 7B13", 2, "2.13.0+cpu") == "amd-epyc-7b13-2c-torch2.13.0-cpu"
    assert (first_run.machine_key("Intel(R) Xeon(R) CPU @ 2.20GHz", 8, "2.13.0")
            == "intel-xeon-cpu-2.20ghz-8c-torch2.13.0")
    keys = {first_run.machine_key("AMD EPYC 7B13", 2, "2.13.0"),
            first_run.machine_key("AMD EPYC 7B13", 4, "2.13.0"),
            first_run.machine_key("AMD EPYC 9654", 2, "2.13.0"),
            first_run.machine_key("AMD EPYC 7B13", 2, "2.14.0")}
    assert len(keys) == 4


def test_measured_once_then_cached_and_again_on_another_torch(home, monkeypatch, capsys):
    from ptd.runtime.calibrate.first_run import resolve_hardware
    root, calls = home
    path = first_run.ensure_profile("auto")
    assert path == root / "hardware" / f"machine-{first_run.machine_key()}.toml"
    assert path.is_file() and len(calls) == 1
    assert calls[0]["quick"] and calls[0]["workers"] == [1, 2, 4] and calls[0]["base"] == "cpu"
    assert "first run on this machine" in capsys.readouterr().err
    hw, source = resolve_hardware("auto")
    assert hw.peak_flops["fp32"] == MARK and source == str(path)

    assert first_run.ensure_profile("auto") == path and len(calls) == 1       # cache hit
    assert first_run.ensure_profile(None) == path and len(calls) == 1
    assert capsys.readouterr().err == ""

    monkeypatch.setattr(first_run, "torch_version", lambda: "9.9.9")         # another machine
    other = first_run.ensure_profile("auto")
    assert other != path and other.is_file() and len(calls) == 2


def test_named_hardware_and_the_switch_skip_it(home, monkeypatch):
    root, calls = home
    assert first_run.ensure_profile("cpu") is None
    assert first_run.ensure_profile("h100-sxm") is None
    monkeypatch.setenv("PTD_AUTO_CALIBRATE", "0")
    assert first_run.ensure_profile("auto") is None
    monkeypatch.setenv("PTD_AUTO_CALIBRATE", "1")
    monkeypatch.setattr(first_run, "_has_gpu", lambda: True)
    assert first_run.ensure_profile("auto") is None
    assert calls == [] and not (root / "hardware").exists()


@pytest.mark.timeout(120)
def test_ptd_train_calibrates_first_and_predicts_with_it(home, tmp_path, capfd):
    root, calls = home
    corpus = tmp_path / "corpus.txt"
    corpus.write_text((ROOT / "README.md").read_text() * 4)
    run = ["train", "--model", "tiny", "--nproc", "1", "--steps", "3", "--global-batch", "2",
           "--micro-batch", "1", "--seq-len", "32", "--warmup", "1", "--data", str(corpus)]
    assert main([*run, "--out", str(tmp_path / "a")]) == 0
    err = capfd.readouterr().err
    assert len(calls) == 1 and "first run on this machine" in err and "calibrated in" in err
    pred = json.loads((tmp_path / "a" / "summary.json").read_text())["prediction"]
    assert pred["hardware_source"] == str(first_run.machine_profile())
    assert pred["peak_flops"] == MARK
    # --hardware overrides: no calibration, the preset's numbers
    assert main([*run, "--hardware", "cpu", "--out", str(tmp_path / "b")]) == 0
    pred = json.loads((tmp_path / "b" / "summary.json").read_text())["prediction"]
    assert len(calls) == 1 and pred["hardware_source"] == "preset cpu" and pred["peak_flops"] != MARK


def test_ptd_calibrate_refreshes_the_machine_profile(home, monkeypatch, capsys):
    root, calls = home
    import ptd.runtime.calibrate as calibrate_pkg
    monkeypatch.setattr(calibrate_pkg, "detect", lambda: {
        "device": "cpu", "count": os.cpu_count(), "name": "test cpu", "memory_bytes": 1e9})
    assert main(["calibrate", "--quick", "--json"]) == 0
    assert (root / "hardware" / "calibrated.toml").is_file()
    assert first_run.machine_profile().is_file() and len(calls) == 1
    assert first_run.ensure_profile("auto") == first_run.machine_profile() and len(calls) == 1
    # a profile written elsewhere (--out) or under another name is not the machine's
    first_run.machine_profile().unlink()
    assert main(["calibrate", "--quick", "--json", "--name", "other"]) == 0
    assert not first_run.machine_profile().exists()
    # --model: a mixture-of-experts model's fields go to the workers, whose layer they time
    # (moe_layer_measured); a dense model's do not
    assert calls[-1]["moe_spec"] is None
    assert main(["calibrate", "--quick", "--json", "--name", "m", "--model", "tiny-moe"]) == 0
    assert calls[-1]["moe_spec"]["n_experts"] == 8 and calls[-1]["moe_spec"]["top_k"] == 2
    assert main(["calibrate", "--quick", "--json", "--name", "d", "--model", "tiny"]) == 0
    assert calls[-1]["moe_spec"] is None
    capsys.readouterr()


def test_a_gpu_without_a_profile_gets_its_own_preset(home, monkeypatch):
    """Before 2026-11-27 every GPU got the H100's preset: an H200 was priced with the H100's
    memory bandwidth. The name nvidia-smi reports picks the preset; an unknown GPU, or none
    reported, falls back to the H100's and says so."""
    from ptd.runtime.calibrate.first_run import resolve_hardware
    monkeypatch.setattr(first_run, "gpu_name", lambda: ("NVIDIA H200", 143771 * 2**20))
    hw, source = resolve_hardware("auto", "cuda")
    assert hw.name == "h200" and source.startswith("preset h200 (NVIDIA H200, no calibrated")
    monkeypatch.setattr(first_run, "gpu_name", lambda: ("NVIDIA A100-SXM4-40GB", 40 * 2**30))
    assert resolve_hardware("auto", "cuda")[0].name == "a100-40g"
    monkeypatch.setattr(first_run, "gpu_name", lambda: None)
    hw, source = resolve_hardware("auto", "cuda")
    assert hw.name == "h100-sxm" and "GPU not identified" in source
    monkeypatch.setattr(first_run, "gpu_name", lambda: ("Some Future GPU", 1e12))
    assert resolve_hardware("auto", "cuda")[0].name == "h100-sxm"

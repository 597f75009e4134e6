"""One class of bad input per test: every one is one line ``ptd <cmd>: error:
...``, exit code 2, before anything is started or written. Faults of the machine (a full
disk) and bugs (an unexpected exception) are one line and exit 1. All in this process;
one short training run (world of one, tiny model) for the cases that need a real run.
"""

import errno
import json
import re
from pathlib import Path

import pytest

from helpers import forbid_processes
from ptd.cli import main
from ptd.errors import PtdError, PtdFault

ROOT = Path(__file__).resolve().parents[1]
ONE_LINE = re.compile(r"^ptd( [a-z]+)?: error: [^\n]+\n$")


@pytest.fixture
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("PTD_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def refused(capfd, *argv, code=2, match=None):
    """Run ``ptd argv`` in process; hold the one-line contract; return stderr."""
    rc = main([str(a) for a in argv])
    err = capfd.readouterr().err
    assert rc == code, (argv, rc, err)
    assert ONE_LINE.match(err) and "Traceback" not in err, err
    assert err.startswith(f"ptd {argv[0]}: error: "), err
    if match:
        assert re.search(match, err), err
    return err


@pytest.fixture
def files(home):
    (home / "bin.toml").write_bytes(b"\xff\xfe\x00\x81binary\x00")
    (home / "bin.json").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    hf = home / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2,
        "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
        "vocab_size": 256, "rope_theta": "fast"}))
    (home / "neg.toml").write_text('preset = "h100-sxm"\n[intra_node]\nbandwidth = -5e9\n'
                                   'latency = 1e-6\n')
    (home / "frac.toml").write_text('preset = "cpu"\ndevices_per_node = 2.5\n')
    (home / "infpeak.toml").write_text('preset = "cpu"\n[peak_flops]\nfp32 = inf\n')
    (home / "strtype.toml").write_text('preset = "tiny"\nnorm_eps = "small"\n')
    (home / "huge.toml").write_text('preset = "tiny"\nn_layers = 1000000000\n')
    (home / "hugef.toml").write_text('preset = "tiny"\nn_layers = 1e9\n')
    (home / "eps.toml").write_text('preset = "tiny"\nnorm_eps = 1e300\n')
    (home / "std.toml").write_text('preset = "tiny"\ninit_std = 2.0\n')
    (home / "zloss.toml").write_text('preset = "tiny-moe"\nz_loss_coef = 11.0\n')
    (home / "densecap.toml").write_text('preset = "tiny"\ncapacity_factor = 1.25\n')
    # tiny-moe: 8 experts, top-2: at capacity 8 / 2 = 4 every expert can take every token
    (home / "cap4.toml").write_text('preset = "tiny-moe"\ncapacity_factor = 4.0\n')
    (home / "cap5.toml").write_text('preset = "tiny-moe"\ncapacity_factor = 4.01\n')
    return home


@pytest.mark.parametrize("argv,match", [
    (["estimate", "--model", "bin.toml"], r"model 'bin.toml' is not UTF-8"),
    (["estimate", "--model", "bin.json"], r"not UTF-8"),
    (["estimate", "--model", "hf"], r"hf: Hugging Face config has a value of the wrong type"),
    (["estimate", "--model", "tiny", "--hardware", "bin.toml"], r"hardware 'bin.toml' is not UTF-8"),
    (["train", "--config", "bin.toml", "--dry-run"], r"config 'bin.toml' is not UTF-8"),
    (["estimate", "--model", "tiny", "--hardware", "neg.toml", "--gpus", "1"],
     r"hardware 'neg.toml': intra_node.bandwidth must be > 0, got -5000000000.0"),
    (["estimate", "--model", "tiny", "--hardware", "frac.toml", "--gpus", "1"],
     r"devices_per_node must be an integer, got 2.5"),
    (["estimate", "--model", "tiny", "--hardware", "infpeak.toml", "--gpus", "1"], r"peak_flops"),
    (["estimate", "--model", "strtype.toml"], r"norm_eps must be a finite number, got 'small'"),
    (["estimate", "--model", "huge.toml"], r"n_layers = 1000000000 is beyond any real model"),
    (["estimate", "--model", "hugef.toml"], r"n_layers must be an integer, got 1000000000.0"),
    (["estimate", "--model", "eps.toml"], r"norm_eps = 1e\+300 is beyond any real model \(at most 0.1\)"),
    (["estimate", "--model", "std.toml"], r"init_std = 2 is beyond any real model \(at most 1\)"),
    (["estimate", "--model", "zloss.toml"], r"z_loss_coef = 11 is beyond"),
    (["estimate", "--model", "densecap.toml"], r"capacity_factor needs a mixture-of-experts model"),
    (["estimate", "--model", "cap5.toml"], r"capacity_factor 4.01 is past n_experts / top_k = 4,"),
    (["estimate", "--model", "tiny", "--gpus", "9" * 400], r"positive integer"),
    (["plan", "--model", "tiny", "--gpus", "9" * 5000], r"positive integer"),
])
def test_bad_files_values_and_sizes(capfd, files, argv, match):
    refused(capfd, *argv, match=match)


def test_capacity_at_the_dropless_bound_is_accepted(capfd, files):
    assert main(["estimate", "--model", "cap4.toml", "--gpus", "2"]) == 0


def test_damaged_calibrated_profile_refused_up_front(capfd, home, monkeypatch):
    forbid_processes(monkeypatch)
    prof = home / "home" / "hardware"
    prof.mkdir(parents=True)
    (prof / "calibrated.toml").write_text('[hardware]\npreset = "cpu"\nmemory_bandwidth = nan\n')
    # auto resolves to the calibrated profile: refused in a dry run, before any data or folder
    refused(capfd, "train", "--model", "tiny", "--nproc", "1", "--dry-run", "--out", "r",
            match=r"calibrated.toml.: memory_bandwidth must be a finite number, got nan")
    assert not (home / "r").exists()
    refused(capfd, "estimate", "--model", "tiny", "--hardware", "calibrated", match="calibrated")


def test_unknown_hardware_refused_in_dry_run(capfd, home, monkeypatch):
    forbid_processes(monkeypatch)
    refused(capfd, "train", "--model", "tiny", "--nproc", "1", "--hardware", "tpu9", "--dry-run",
            "--out", "r", match="unknown hardware 'tpu9'")
    assert not (home / "r").exists()


@pytest.mark.parametrize("argv,match", [
    (["train", "--model", "tiny", "--nproc", "1", "--dry-run", "--out", "afile/sub"], "is a file"),
    (["train", "--model", "tiny", "--nproc", "1", "--dry-run", "--out", "r",
      "--checkpoint-every", "2", "--checkpoint-dir", "/proc/nope"], "--checkpoint-dir '/proc/nope' is not writable"),
    (["report", "RUN", "--out", "afile/x.html"], "is a file"),
    (["export", "RUN", "--out", "afile/hf"], "is a file"),
    (["bench", "scaling", "--out", "afile/b"], "is a file"),
    (["plan", "--model", "tiny", "--hardware", "cpu", "--gpus", "2", "--try", "1",
      "--try-dir", "afile/t"], "is a file"),
    (["plan", "--model", "tiny", "--gpus", "2", "--export", "ptd", "-o", "afile/p.toml"], "is a file"),
    (["calibrate", "--out", "afile/c.toml"], "is a file"),
    (["calibrate", "--out", "/proc/c.toml"], "not writable"),
])
def test_unwritable_output_refused_before_work(capfd, home, monkeypatch, argv, match):
    forbid_processes(monkeypatch)  # nothing may be measured or trained first
    import ptd.runtime.calibrate as cal
    monkeypatch.setattr(cal, "calibrate", lambda *a, **k: pytest.fail("measured first"))
    (home / "afile").write_text("x")
    run = home / "RUN"
    run.mkdir()
    (run / "summary.json").write_text("{}")
    argv = [str(run) if a == "RUN" else a for a in argv]
    refused(capfd, *argv, match=re.escape(match))


# An empty path is what an unset shell variable gives (``--cases "$CASES"``). Before, six of
# these quietly meant the flag's default: validate priced the shipped cases, calibrate wrote
# the default profile after measuring for minutes, train --config and --slurm-script started
# the default training run, plan -o printed to stdout, --data '' passed the dry run.
@pytest.mark.parametrize("argv", [
    ["validate", "--cases", ""],
    ["calibrate", "--out", ""],
    ["train", "--config", ""],
    ["train", "--model", "tiny", "--slurm-script", ""],
    ["train", "--model", "tiny", "--dry-run", "--data", ""],
    ["train", "--model", "tiny", "--dry-run", "--out", ""],
    ["train", "--model", "tiny", "--dry-run", "--checkpoint-dir", ""],
    ["train", "--model", "tiny", "--dry-run", "--resume", ""],
    ["train", "--model", "tiny", "--dry-run", "--init-from", ""],
    ["train", "--model", "tiny", "--dry-run", "--resume", "  "],  # blank is no path either
    ["train", "--model", "tiny", "--dry-run", "--data", "a\0b"],
    ["plan", "--model", "tiny", "--gpus", "2", "--export", "ptd", "-o", ""],
    ["plan", "--model", "tiny", "--hardware", "cpu", "--gpus", "2", "--try", "1", "--try-dir", ""],
    ["report", ""],
    ["report", "RUN", "--out", ""],
    ["export", "", "--out", "hf"],
    ["export", "RUN", "--out", ""],
    ["bench", "scaling", "--out", ""],
])
def test_an_empty_path_is_refused_not_taken_for_the_default(capfd, home, monkeypatch, argv):
    forbid_processes(monkeypatch)
    import ptd.runtime.calibrate as cal
    monkeypatch.setattr(cal, "calibrate", lambda *a, **k: pytest.fail("measured first"))
    (home / "RUN").mkdir()
    argv = [str(home / "RUN") if a == "RUN" else a for a in argv]
    refused(capfd, *argv, match=r"expected a path, got '(\s*|a\\x00b)'")
    assert sorted(p.name for p in home.iterdir()) == ["RUN"]  # nothing written


@pytest.mark.parametrize("model", ["", " "])
def test_an_empty_model_is_an_unknown_preset_not_the_working_folders_config(capfd, home, model):
    (home / "config.json").write_text("{}")  # what Path('') would have read
    refused(capfd, "estimate", "--model", model, "--hardware", "cpu",
            match=re.escape(f"unknown model preset {model!r}; choose from"))


@pytest.mark.parametrize("argv,match", [
    (["plan", "--model", "tiny", "--gpus", "2", "--repeats", "3"], "--repeats only applies with --try"),
    (["plan", "--model", "tiny", "--gpus", "2", "--tolerance", "0.2"], "--tolerance only applies"),
    (["plan", "--model", "tiny", "--gpus", "2", "--run-timeout", "5"], "--run-timeout only applies"),
    (["plan", "--model", "tiny", "--gpus", "2", "--fix", "tp=2", "--fix", "tp=1"], "tp is given more"),
    (["plan", "--model", "tiny", "--gpus", "2", "--fix", "zero=1,zero=2"], "zero is given more"),
    (["plan", "--model", "tiny", "--hardware", "cpu", "--gpus", "2", "--try", "1",
      "--run-timeout", "0"], "--run-timeout must be > 0"),
    (["plan", "--model", "tiny", "--hardware", "cpu", "--gpus", "2", "--try", "1",
      "--run-timeout", "-3"], "--run-timeout must be > 0"),
    (["bench", "scaling", "--run-timeout", "0"], "--run-timeout must be > 0"),
    (["bench", "scaling", "--run-timeout", "nan"], "--run-timeout must be > 0"),
    (["bench", "scaling", "--strategies", "ddp,zero1,ddp"], "named twice"),
    # a grid whose runs ptd train would refuse is refused before the first run, not row by
    # row minutes in: 3 sequences do not split over 2 replicas; tiny's 4 key/value heads
    # over tp 8; small's 512 positions
    (["bench", "scaling", "--global-batch", "3"], "ddp on 2 worker(s) (dp2 tp1 pp1 zero0 mb1 gb3): global batch 3"),
    (["bench", "scaling", "--model", "tiny", "--workers", "1,8", "--strategies", "tp"],
     "tp on 8 worker(s) (dp1 tp8 pp1 zero0 mb16 gb16): tiny: 4 key/value heads"),
    (["bench", "scaling", "--steps", "1"], "--steps 1: each run needs at least 2"),
    (["bench", "scaling", "--seq-len", "513"], "--seq-len 513 exceeds small's max_seq_len 512"),
    # the cluster tables are priced before the runs: their flags too
    (["bench", "scaling", "--cluster-model", "nope"], "--cluster-model: unknown model preset 'nope'"),
    (["bench", "scaling", "--cluster-hardware", "nope"], "--cluster-hardware: unknown hardware 'nope'"),
    (["bench", "scaling", "--cluster-gpus", "7"], "no cluster layout applies to --cluster-gpus 7"),
    # 3 divides no layout of 64 devices: the line names what was held (it named nothing)
    (["plan", "--model", "llama3-8b", "--gpus", "64", "--cp", "3,5"], "no layout dp*tp*pp*cp = 64 has cp in 3,5"),
    (["plan", "--model", "llama3-8b", "--gpus", "64", "--fix", "cp=3"], "no layout dp*tp*pp*cp = 64 has cp=3"),
    (["plan", "--model", "llama3-8b", "--gpus", "64", "--fix", "tp=3"], "no layout dp*tp*pp = 64 has tp=3\n"),
    (["train", "--model", "tiny", "--steps", "5", "--warmup", "5"], "--warmup 5 >= --steps 5"),
    (["train", "--model", "tiny", "--threads", "100000"], "--threads 100000: this host has"),
    # a schedule and uneven stages shape a pipeline: with pp 1 they would change nothing
    (["train", "--model", "tiny", "--dry-run", "--schedule", "zero-bubble"], "--schedule applies to pipeline"),
    (["train", "--model", "tiny", "--dry-run", "--uneven-stages"], "--uneven-stages applies to pipeline"),
    (["estimate", "--model", "tiny", "--schedule", "gpipe"], "--schedule applies to pipeline parallelism (--pp > 1)"),
    (["estimate", "--model", "tiny", "--uneven-stages"], "--uneven-stages applies to pipeline"),
    (["train", "--model", "tiny", "--steps", "5", "--warmup", "6"], "--warmup 6 >= --steps 5"),
    (["plan", "--model", "tiny", "--gpus", "2", "--no-layouts"], "--no-layouts only applies with --try"),
    # estimate's single --tp-mode and its --depth: ptd plan took them and did nothing
    (["plan", "--model", "tiny", "--gpus", "2", "--depth", "2"], "unrecognized arguments: --depth 2"),
    # an empty item is skipped, the rest still checked; an alias is its field
    (["plan", "--model", "tiny", "--gpus", "2", "--fix", ",tp=2,tp=1"], "tp is given more"),
    (["plan", "--model", "tiny", "--gpus", "2", "--fix", "mb=2", "--fix", "micro_batch=1"],
     "micro_batch is given more"),
    (["bench", "scaling", "--run-timeout", "1e7"], "--run-timeout must be > 0 seconds (and below 1e7)"),
    # no checkpoint is saved without --checkpoint-every: where and how many would be moot
    (["train", "--model", "tiny", "--dry-run", "--checkpoint-keep", "3"], "--checkpoint-keep needs --checkpoint-every"),
    (["train", "--model", "tiny", "--dry-run", "--checkpoint-async"], "--checkpoint-async needs --checkpoint-every"),
    (["train", "--model", "tiny", "--dry-run", "--checkpoint-dir", "ck"], "--checkpoint-dir needs --checkpoint-every"),
    (["train", "--model", "tiny", "--dry-run", "--capacity-factor", "1.5"], "capacity_factor needs a mixture-of-experts model"),
    (["train", "--model", "tiny", "--dry-run", "--steps", "5", "--memory-step", "6"],
     "--memory-step 6 is past the run's last step (--steps 5)"),
    # nothing would be written to --output without --export or --run
    (["plan", "--model", "tiny", "--gpus", "2", "-o", "p.toml"], "--output names where --export"),
    # a dense model has no experts to balance; an MoE's worst case is every token on the
    # same top_k experts: tiny-moe has 8 experts, top-2, so at most 8 / 2 = 4
    (["estimate", "--model", "tiny", "--moe-imbalance", "1.5"], "tiny is dense"),
    (["plan", "--model", "tiny", "--gpus", "2", "--moe-imbalance", "2"], "tiny is dense"),
    (["estimate", "--model", "tiny-moe", "--moe-imbalance", "4.01"], "between 1 and n_experts / top_k = 4 "),
    (["estimate", "--model", "tiny-moe", "--moe-imbalance", "inf"], "between 1 and"),
    (["estimate", "--model", "tiny-moe", "--moe-imbalance", "nan"], "between 1 and"),
    (["estimate", "--model", "tiny-moe", "--moe-imbalance", "0.99"], "between 1 and"),
])
def test_flags_without_effect_refused(capfd, home, monkeypatch, argv, match):
    forbid_processes(monkeypatch)
    refused(capfd, *argv, match=re.escape(match))
    assert not any(home.iterdir()) or [p.name for p in home.iterdir()] == ["home"]


def test_threads_beyond_the_host_refused_from_a_config_file_too(capfd, home, monkeypatch):
    forbid_processes(monkeypatch)
    import os
    assert main(["train", "--model", "tiny", "--dry-run", "--out", "r"]) == 0
    capfd.readouterr()
    text = (home / "r" / "config.toml").read_text()
    assert "\nthreads = 1\n" in text
    many = (os.cpu_count() or 1) + 1
    (home / "c.toml").write_text(text.replace("\nthreads = 1\n", f"\nthreads = {many}\n"))
    refused(capfd, "train", "--config", "c.toml", "--dry-run", "--force",
            match=re.escape(f"threads (--config) {many}: this host has"))


def test_flags_at_their_bounds_are_accepted(capfd, home, monkeypatch):
    import os
    from ptd import flagcheck
    flagcheck._timeout(0.5, "--run-timeout")  # under a second is a timeout too
    flagcheck._timeout(9.9e6, "--run-timeout")
    forbid_processes(monkeypatch)
    cores = os.cpu_count() or 1
    # the memory step may be the last step; as many threads as cores
    assert main(["train", "--model", "tiny", "--dry-run", "--out", "a", "--steps", "5",
                 "--memory-step", "5", "--threads", str(cores)]) == 0, capfd.readouterr().err


def test_moe_imbalance_at_its_bound_is_priced(capfd):
    # exactly n_experts / top_k (every token on the same two of tiny-moe's eight experts)
    assert main(["estimate", "--model", "tiny-moe", "--gpus", "2", "--moe-imbalance", "4"]) == 0


@pytest.mark.parametrize("argv", [
    ["plan", "--model", "tiny", "--gpus", "2", "--run", "--hardware", "h100-sxm"],
    ["plan", "--model", "tiny", "--gpus", "2", "--try", "1", "--hardware", "h100-sxm"],
    ["bench", "scaling", "--hardware", "h100-sxm", "--out", "b"],
    ["train", "--model", "tiny", "--nproc", "1", "--hardware", "h100-sxm", "--out", "r"],
])
def test_measuring_against_another_hardware_refused(capfd, home, monkeypatch, argv):
    import ptd.runtime.launch.launcher as launch
    if launch.gpu_count():
        pytest.skip("this host has a GPU: the H100 profile may describe it")
    forbid_processes(monkeypatch)
    err = refused(capfd, *argv, match="describes a GPU and this host has none")
    if argv[0] == "plan":  # the line names the flag that measures
        assert ("--run measures" if "--run" in argv else "--try measures") in err, err


def test_memory_beyond_the_host_refused_in_dry_run(capfd, home, monkeypatch):
    forbid_processes(monkeypatch)
    refused(capfd, "train", "--model", "llama3-8b", "--nproc", "1", "--dry-run", "--out", "r",
            match=r"GiB predicted = .* more than this host's")
    assert not (home / "r").exists()


def test_unexpected_error_is_one_line_with_a_log_and_debug_shows_it(capfd, home, monkeypatch):
    import ptd.commands.calc as calc

    def bug(a):
        raise KeyError("planted")
    monkeypatch.setattr(calc, "run", bug)
    err = refused(capfd, "calc", "--flops", "1", code=1, match=r"unexpected KeyError")
    log = Path(re.search(r"traceback in (\S+);", err).group(1))
    assert log.is_file() and "Traceback" in log.read_text() and "planted" in log.read_text()
    with pytest.raises(KeyError, match="planted"):
        main(["calc", "--flops", "1", "--debug"])
    monkeypatch.setenv("PTD_DEBUG", "1")
    with pytest.raises(KeyError, match="planted"):
        main(["calc", "--flops", "1"])


def test_disk_full_is_one_line_naming_the_path_exit_1(capfd, home, monkeypatch):
    import ptd.commands.calc as calc

    def full(a):
        raise OSError(errno.ENOSPC, "No space left on device", str(home / "out.json"))
    monkeypatch.setattr(calc, "run", full)
    refused(capfd, "calc", "--flops", "1", code=1, match=r"disk full writing \S*out.json")


def test_atomic_write_on_a_full_disk_keeps_the_old_file(home, monkeypatch):
    """ENOSPC simulated at the write boundary (os.fsync raises; no root mount needed)."""
    import os

    from ptd.safeio import atomic_write_text
    target = home / "summary.json"
    target.write_text('{"old": 1}')

    def enospc(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", enospc)
    with pytest.raises(PtdFault, match=r"disk full writing .*summary.json"):
        atomic_write_text(target, '{"new": 2}')
    assert target.read_text() == '{"old": 1}'
    assert sorted(p.name for p in home.iterdir() if p.is_file()) == ["summary.json"]


def test_run_lock_refuses_a_second_holder_naming_the_first(capfd, home, monkeypatch):
    forbid_processes(monkeypatch)
    from ptd.safeio import run_lock
    corpus = home / "c.txt"
    corpus.write_text((ROOT / "README.md").read_text())
    with run_lock(home / "r"):
        refused(capfd, "train", "--model", "tiny", "--nproc", "1", "--dry-run", "--out", "r",
                "--data", corpus, "--global-batch", "4", "--seq-len", "32",
                match=rf"run folder 'r' is in use by pid {__import__('os').getpid()}")
        assert not (home / "r" / "config.toml").exists()
    assert main(["train", "--model", "tiny", "--nproc", "1", "--dry-run", "--out", "r", "--data",
                 str(corpus), "--global-batch", "4", "--seq-len", "32"]) == 0


def test_check_writable_creates_nothing(home):
    from ptd.safeio import check_writable
    check_writable(home / "a" / "b" / "c", "--out")
    assert not (home / "a").exists()
    assert [p.name for p in home.iterdir()] == []
    with pytest.raises(PtdError, match="empty"):
        check_writable("", "--out")


def test_json_safe_replaces_non_finite_with_null_and_a_reason(capsys):
    from ptd.commands.args import emit_json
    from ptd.safeio import dumps_strict
    obj = {"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": -float("inf")}, "e": 2.5}
    text = dumps_strict(obj)
    back = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
    assert back == {"a": None, "a_null_reason": "not finite: nan", "b": [1.0, None],
                    "c": {"d": None, "d_null_reason": "not finite: -inf"}, "e": 2.5}
    emit_json(obj)
    assert json.loads(capsys.readouterr().out) == back


def test_report_never_overwrites_a_runs_own_file(capfd, home):
    run = home / "run"
    run.mkdir()
    (run / "summary.json").write_text('{"status": "ok", "steps": 1}')
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
    refused(capfd, "report", run, "--out", run / "summary.json",
            match=r"summary.json' exists; it was not written by this command \(pass --force")
    assert (run / "summary.json").read_text() == '{"status": "ok", "steps": 1}'
    assert main(["report", str(run)]) == 0  # its own report.html, twice: allowed
    assert main(["report", str(run)]) == 0
    assert (run / "report.html").read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("argv,existing", [
    (["plan", "--model", "tiny", "--gpus", "2", "--export", "ptd", "-o", "p.toml"], "p.toml"),
    # the launcher script deepspeed's export writes beside its config counts too
    (["plan", "--model", "tiny", "--gpus", "2", "--export", "deepspeed", "-o", "ds.json"],
     "ds.launch.sh"),
    (["calibrate", "--quick", "--out", "c.toml"], "c.toml"),
    (["bench", "scaling", "--out", "b"], "b/scaling.json"),
    (["train", "--model", "tiny", "--nproc", "1", "--out", "r"], "r/summary.json"),
    (["train", "--model", "tiny", "--nproc", "1", "--out", "r"], "r/metrics.jsonl"),
    (["train", "--model", "tiny", "--nproc", "2", "--nnodes", "2", "--out", "r2",
      "--slurm-script", "job.sh"], "job.sh"),
])
def test_an_existing_output_is_not_replaced_without_force(capfd, home, monkeypatch, argv,
                                                          existing):
    forbid_processes(monkeypatch)  # refused before anything is measured or trained
    import ptd.runtime.calibrate as cal
    monkeypatch.setattr(cal, "calibrate", lambda *a, **k: pytest.fail("measured first"))
    f = home / existing
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text("mine\n")
    err = refused(capfd, *argv, match="--force")
    assert existing.split("/")[0] in err
    assert f.read_text() == "mine\n"


def test_force_replaces_an_existing_output(capfd, home):
    (home / "p.toml").write_text("mine\n")
    argv = ["plan", "--model", "tiny", "--gpus", "2", "--export", "ptd", "-o", "p.toml"]
    assert main(argv + ["--force"]) == 0
    assert "[plan]" in (home / "p.toml").read_text()
    # a train --out holding an earlier run: --force lets a dry run rewrite its config.toml
    (home / "r").mkdir()
    (home / "r" / "summary.json").write_text("{}")
    dry = ["train", "--model", "tiny", "--nproc", "1", "--out", "r", "--dry-run"]
    refused(capfd, *dry, match="holds an earlier run")
    assert main(dry + ["--force"]) == 0 and (home / "r" / "config.toml").exists()
    capfd.readouterr()


def test_an_incomplete_table_names_the_missing_fields(capfd, home, monkeypatch):
    (home / "m.toml").write_text('n_layers = 2\nhidden = 64\nn_heads = 4\n')
    refused(capfd, "estimate", "--model", "m.toml",
            match=re.escape("m: incomplete model table: missing n_kv_heads, ffn_hidden, "
                            "vocab_size, max_seq_len"))
    # a Hugging Face config.json given from inside its folder is named after the folder
    hf = home / "myllama"
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "llama", "hidden_size": 64}')
    monkeypatch.chdir(hf)
    refused(capfd, "estimate", "--model", "config.json",
            match=re.escape("myllama: Hugging Face config lacks key 'num_attention_heads'"))


def test_an_earlier_try_is_kept_unless_force(capfd, home, monkeypatch):
    forbid_processes(monkeypatch)
    (home / "t").mkdir()
    (home / "t" / "try.json").write_text("{}")
    refused(capfd, "plan", "--model", "tiny", "--hardware", "cpu", "--gpus", "2", "--try", "1",
            "--try-dir", "t", match=re.escape("--try-dir 't/try.json' exists"))
    assert (home / "t" / "try.json").read_text() == "{}"

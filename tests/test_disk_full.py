"""Faults: a full disk while saving a checkpoint is one line naming the path,
exit code 1, the partial checkpoint removed and the previous one intact.

ENOSPC is simulated at the write boundary -- ``store.write_durably``, through which the
checkpoint's metrics, manifest and commit marker go -- by monkeypatching it to raise
``OSError(ENOSPC)`` for the second checkpoint (no loop or tmpfs mount: the CI runner has no
root). One in-process run of the tiny model, one worker."""

import errno
import re
from pathlib import Path

import pytest

from ptd.cli import main
from ptd.runtime.checkpoint import store

ROOT = Path(__file__).resolve().parents[1]


def train_tiny(corpus, out, *flags):
    """``ptd train`` of the tiny model in this process (one worker, 4 x 32 tokens a step, no
    profiling): its exit code."""
    return main(["train", "--model", "tiny", "--nproc", "1", "--global-batch", "4",
                 "--micro-batch", "4", "--seq-len", "32", "--warmup", "1", *flags,
                 "--data", str(corpus), "--out", str(out), "--profile-steps", "0",
                 "--memory-step", "0"])


@pytest.mark.timeout(120)
def test_full_disk_during_a_checkpoint(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("PTD_HOME", str(tmp_path / "home"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text((ROOT / "README.md").read_text())
    real = store.write_durably

    def full_at_step_4(path, text):
        if "step_00000004" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, text)
    monkeypatch.setattr(store, "write_durably", full_at_step_4)
    out = tmp_path / "run"
    rc = train_tiny(corpus, out, "--steps", "4", "--checkpoint-every", "2")
    err = capfd.readouterr().err
    last = err.strip().splitlines()[-1]
    assert rc == 1, err[-2000:]
    assert re.match(r"ptd train: error: disk full: no space left on device writing \S+"
                    r"step_00000004\S* \(checkpoint of step 4\)", last), last
    assert "Traceback" not in err
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert ckpts == ["step_00000002"], ckpts  # no partial step 4 left behind
    from ptd.runtime.checkpoint.restore import validate
    assert validate(out / "checkpoints" / "step_00000002", deep=True).step == 2


@pytest.mark.timeout(120)
def test_resume_at_the_final_step_says_so_and_exits_0(tmp_path, monkeypatch, capfd):
    # before: ZeroDivisionError in the comparison after "training" zero steps
    monkeypatch.setenv("PTD_HOME", str(tmp_path / "home"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text((ROOT / "README.md").read_text())
    out = tmp_path / "run"
    argv = ["train", "--model", "tiny", "--nproc", "1", "--steps", "2", "--global-batch", "4",
            "--micro-batch", "4", "--seq-len", "32", "--warmup", "1", "--checkpoint-every", "2",
            "--data", str(corpus), "--out", str(out), "--profile-steps", "0", "--memory-step", "0"]
    assert main(argv) == 0
    summary = (out / "summary.json").read_text()
    capfd.readouterr()
    assert main(["train", "--resume", str(out), "--out", str(out)]) == 0
    said = capfd.readouterr()
    assert re.search(r"checkpoint \S+step_00000002 is at step 2, the run's final step is 2: "
                     r"nothing to train", said.out), said
    assert (out / "summary.json").read_text() == summary  # nothing was rewritten
    # --resume naming a run folder other than --out: the note reads the checkpoints under
    # --resume's folder (the new --out has none), and nothing is written to either
    other = tmp_path / "other"
    assert main(["train", "--resume", str(out), "--out", str(other)]) == 0
    said = capfd.readouterr()
    assert re.search(r"checkpoint " + re.escape(str(out / "checkpoints" / "step_00000002"))
                     + r" is at step 2, the run's final step is 2: nothing to train", said.out), said
    assert not (other / "summary.json").exists()


@pytest.mark.timeout(120)
def test_every_step_skipped_fails_and_metrics_stay_json(tmp_path, monkeypatch, capfd):
    # --on-nan skip with a non-finite loss at every step: before, exit 0 and "NaN" in
    # metrics.jsonl (not JSON)
    import json
    monkeypatch.setenv("PTD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PTD_FAULT", "nan:rank=*:step=1,nan:rank=*:step=2")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text((ROOT / "README.md").read_text())
    out = tmp_path / "run"
    rc = train_tiny(corpus, out, "--steps", "2", "--on-nan", "skip")
    err = capfd.readouterr().err
    assert rc == 1, err[-2000:]
    assert err.strip().splitlines()[-1].startswith(
        "ptd train: error: training failed: every one of the 2 step(s)"), err[-1000:]
    strict = dict(parse_constant=lambda c: pytest.fail(f"{c} in metrics.jsonl"))
    recs = [json.loads(x, **strict) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in recs] == [None, None]
    assert all(r["loss_null_reason"] == "not finite: nan" for r in recs)
    json.loads((out / "summary.json").read_text(), **strict)

"""Checkpoints without extra processes: the format on disk, validation of damaged
checkpoints and the fallback to the previous good one, one-line refusals, the NaN guard,
exact resume in one process, Hugging Face export/import.

One short training run in this process (world of one, tiny model, a small text corpus)
writes the checkpoints the tests copy and damage.
"""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from helpers import forbid_processes, checkpoint_model, hf_logits, ptd_logits
from ptd.cli import main
from ptd.errors import PtdError
from ptd.runtime.checkpoint import restore, store
from ptd.specs import load_config

ROOT = Path(__file__).resolve().parents[1]
RUN = ["--model", "tiny", "--nproc", "1", "--steps", "4", "--global-batch", "4", "--micro-batch", "4",
       "--seq-len", "32", "--warmup", "1", "--checkpoint-every", "2", "--checkpoint-keep", "3"]


def cli(*argv):
    """Run ``ptd`` in this process; (exit code, stderr) with stderr read from capfd by callers."""
    return main([str(a) for a in argv])


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    base = tmp_path_factory.mktemp("ckpt")
    corpus = base / "corpus.txt"
    corpus.write_text("".join(p.read_text() for p in sorted((ROOT / "src" / "ptd").rglob("*.py"))))
    old = os.environ.get("PTD_HOME")
    os.environ["PTD_HOME"] = str(base / "home")
    yield base, corpus
    if old is None:
        os.environ.pop("PTD_HOME", None)
    else:
        os.environ["PTD_HOME"] = old


@pytest.fixture(scope="module")
def run_dir(env):
    base, corpus = env
    out = base / "run"
    assert cli("train", *RUN, "--data", corpus, "--out", out) == 0
    return out


def losses(out):
    return [json.loads(line)["loss"] for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def copy_root(run_dir, dest):
    shutil.copytree(run_dir / "checkpoints", dest)
    return dest


def rewrite_manifest(path: Path, change) -> None:
    """Edit a checkpoint's manifest and make it self-consistent again (new file entries and
    marker), as a bug that wrote a wrong but complete checkpoint would."""
    import hashlib
    m = json.loads((path / store.MANIFEST).read_text())
    change(m)
    m["files"] = {n: store.file_entry(path / n) for n in m["files"]}
    text = json.dumps(m, indent=1, sort_keys=True)
    (path / store.MANIFEST).write_text(text)
    (path / store.MARKER).write_text(json.dumps({"manifest_sha256": hashlib.sha256(text.encode()).hexdigest()}))


def shard(path: Path) -> Path:
    return sorted(path.glob("*.distcp"))[0]


# ----------------------------------------------------------------- format
@pytest.mark.timeout(120)
def test_layout_manifest_and_marker(run_dir):
    root = run_dir / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step_00000002", "step_00000004"]
    ck = restore.validate(root / "step_00000004", deep=True)
    m = ck.manifest
    assert m["format"] == store.FORMAT and m["step"] == 4 and m["tokens"] == 4 * 4 * 32
    assert m["data"]["samples"] == 4 * 4  # global samples consumed: step x global batch
    assert m["layout"] == {"world_size": 1, "pp": 1, "dp": 1, "tp": 1, "zero": 0,
                           "plan": "dp1 tp1 pp1 zero0 mb4 gb4"}
    assert ck.config.model.name == "tiny" and ck.config.steps == 4
    assert {".metadata", "metrics.jsonl"} <= set(m["files"]) and any(n.endswith(".distcp") for n in m["files"])
    assert [r["step"] for r in store.read_metrics(ck)] == [1, 2, 3, 4]
    assert [r["loss"] for r in store.read_metrics(ck)] == losses(run_dir)


# ----------------------------------------------------------------- validation
def _truncate(p):
    f = shard(p)
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _flip(p):
    f = shard(p)
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 0xFF
    f.write_bytes(bytes(b))


def _edit_manifest(p):
    text = (p / store.MANIFEST).read_text().replace('"step": 4', '"step": 40')
    (p / store.MANIFEST).write_text(text)


def _garbage_metadata(p):
    f = p / ".metadata"
    f.write_bytes(b"\0" * f.stat().st_size)
    rewrite_manifest(p, lambda m: None)


def _wrong_config(p):
    rewrite_manifest(p, lambda m: m["config"]["model"].update(hidden=128, head_dim=16))


DAMAGE = [
    (_truncate, "truncated"),
    (_flip, "does not match its SHA-256"),
    (lambda p: (p / store.MARKER).unlink(), "no COMPLETE marker"),
    (_edit_manifest, "does not match the hash in COMPLETE"),
    (lambda p: shard(p).unlink(), r"__0_0\.distcp is missing"),
    (_garbage_metadata, r"\.metadata does not load"),
    (_wrong_config, "shape.* disagree with its config"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("damage,reason", DAMAGE,
                         ids=["truncated", "bit-flip", "no-marker", "edited-manifest", "missing-shard",
                              "garbage-metadata", "config-mismatch"])
def test_damaged_checkpoint_is_refused_with_its_reason(run_dir, tmp_path, damage, reason):
    root = copy_root(run_dir, tmp_path / "ckpts")
    damage(root / "step_00000004")
    with pytest.raises(store.Refused, match=reason) as e:
        restore.validate(root / "step_00000004", deep=True)
    assert "\n" not in str(e.value)
    # ... and the previous good one is what a resume picks, with a warning naming the reason.
    cfg = load_config(run_dir / "config.toml").replace(resume=str(root))
    warnings = []
    ck = restore.pick(cfg, warn=warnings.append)
    assert ck.step == 2
    assert len(warnings) == 1 and "step_00000004 refused" in warnings[0]
    # An explicit step folder falls back to its older siblings too.
    cfg = cfg.replace(resume=str(root / "step_00000004"))
    assert restore.pick(cfg).step == 2


@pytest.mark.timeout(60)
def test_size_check_is_cheap_hash_check_is_deep(run_dir, tmp_path):
    root = copy_root(run_dir, tmp_path / "ckpts")
    _flip(root / "step_00000004")
    store.check(root / "step_00000004", deep=False)  # the launcher's check: sizes only
    with pytest.raises(store.Refused):
        store.check(root / "step_00000004", deep=True)
    # Ranks split the hashing: a file is hashed by exactly one of them.
    files = sorted(store.read(root / "step_00000004").manifest["files"])
    bad = files.index(shard(root / "step_00000004").name)
    ck = store.read(root / "step_00000004")
    assert [bool(store.problems(ck, deep=True, share=(r, 2))) for r in range(2)] == [bad % 2 == 0, bad % 2 == 1]


@pytest.mark.timeout(60)
def test_nothing_usable_is_an_error_and_auto_starts_fresh(run_dir, tmp_path):
    root = copy_root(run_dir, tmp_path / "ckpts")
    for p in root.iterdir():
        _truncate(p)
    cfg = load_config(run_dir / "config.toml")
    with pytest.raises(PtdError, match="no usable checkpoint .* newest refused: step_00000004: .*truncated"):
        restore.pick(cfg.replace(resume=str(root)))
    empty = tmp_path / "empty"
    assert restore.pick(cfg.replace(resume="auto", out=str(empty))) is None  # nothing: fresh start
    damaged = tmp_path / "damaged"
    shutil.copytree(root, damaged / "checkpoints")
    with pytest.raises(PtdError, match="no usable checkpoint"):  # all damaged: not a fresh start
        restore.pick(cfg.replace(resume="auto", out=str(damaged)))


@pytest.mark.timeout(60)
def test_temporary_and_unmarked_folders_are_never_candidates_and_prune_keeps_n(run_dir, tmp_path):
    root = copy_root(run_dir, tmp_path / "ckpts")
    (root / ".tmp-step_00000006").mkdir()
    (root / ".tmp-step_00000006" / "__0_0.distcp").write_bytes(b"partial")
    assert [p.name for p in store.candidates(root)] == ["step_00000004", "step_00000002"]
    assert [p.name for p in store.candidates(root / "step_00000002")] == ["step_00000002"]
    assert store.candidates(tmp_path / "run-without-checkpoints") == []
    store.prune(root, keep=1)
    assert sorted(p.name for p in root.iterdir()) == ["step_00000004"]


# ----------------------------------------------------------------- refusals before any worker
@pytest.fixture
def no_workers(monkeypatch):
    """conftest's, without a fresh ptd home: these runs read the module's own."""
    forbid_processes(monkeypatch)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("flags,match", [
    (["--model", "small"], "holds another model .*hidden 64 != 256"),
    (["--seed", "3"], "seed = 0, this run has 3"),
    (["--global-batch", "8", "--micro-batch", "4"], "global_batch = 4, this run has 8"),
    (["--steps", "3"], "is at step 4, beyond this run's steps = 3"),
])
def test_resuming_another_run_is_refused_in_one_line(run_dir, tmp_path, capfd, no_workers, flags, match):
    import re
    out = tmp_path / "out"
    rc = cli("train", "--resume", run_dir, *flags, "--out", out)
    err = capfd.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("ptd train: error: ") and "Traceback" not in err
    assert re.search(match, err), err
    assert not out.exists()


@pytest.mark.timeout(60)
def test_resume_path_errors_in_one_line(run_dir, tmp_path, capfd, no_workers):
    root = copy_root(run_dir, tmp_path / "ckpts")
    for p in root.iterdir():
        (p / store.MARKER).unlink()
    (tmp_path / "empty").mkdir()
    for ref, match in [(tmp_path / "nope", "does not exist"), (tmp_path / "empty", "no checkpoint in"),
                       (root, "no usable checkpoint .*no COMPLETE marker")]:
        rc = cli("train", "--resume", ref, "--model", "tiny", "--out", tmp_path / "out")
        err = capfd.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert __import__("re").search(match, err), err


@pytest.mark.timeout(60)
def test_resume_without_config_continues_the_run_and_flags_change_the_layout(run_dir, tmp_path, capfd):
    out = tmp_path / "out"
    assert cli("train", "--resume", run_dir, "--nproc", "2", "--zero", "3", "--micro-batch", "2",
               "--out", out, "--dry-run") == 0
    cfg = load_config(out / "config.toml")
    saved = load_config(run_dir / "config.toml")
    assert cfg.model == saved.model and cfg.steps == saved.steps and cfg.data == saved.data
    assert (cfg.plan.dp, cfg.plan.zero, cfg.plan.micro_batch) == (2, 3, 2)
    assert cfg.resume == str(run_dir) and cfg.checkpoint.every == 2


# ----------------------------------------------------------------- exact resume, one process
@pytest.mark.timeout(120)
def test_resume_in_one_process_is_exact(run_dir, tmp_path):
    out = tmp_path / "resumed"
    assert cli("train", "--resume", run_dir / "checkpoints" / "step_00000002", "--out", out) == 0
    assert losses(out) == losses(run_dir)  # steps 1-2 replayed from the checkpoint, 3-4 trained
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000004"]


@pytest.mark.timeout(120)
def test_resuming_an_older_checkpoint_in_place_sets_the_newer_history_aside(run_dir, tmp_path, capfd):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    (run / "config.toml").write_text((run_dir / "config.toml").read_text().replace(str(run_dir), str(run)))
    assert cli("train", "--resume", run / "checkpoints" / "step_00000002", "--out", run) == 0
    assert "set aside step_00000004" in capfd.readouterr().err
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names[0].startswith("abandoned-step_00000004-") and names[1:] == ["step_00000002", "step_00000004"]
    assert losses(run) == losses(run_dir)


# ----------------------------------------------------------------- never a poisoned checkpoint
@pytest.mark.timeout(120)
def test_non_finite_state_is_never_saved(run_dir, tmp_path):
    from ptd.runtime.checkpoint.saver import Checkpointer
    from ptd.runtime.parallel.mesh import init_distributed, shutdown
    from ptd.runtime.worker import build_trainer
    cfg = load_config(run_dir / "config.toml").replace(out=str(tmp_path / "run"))
    dims = init_distributed(cfg.plan, 30)
    try:
        trainer = build_trainer(cfg, dims)
        ck = Checkpointer(cfg, dims, trainer)
        trainer.step = 1
        assert ck.save(trainer) is True
        with torch.no_grad():
            next(trainer.model.parameters()).view(-1)[3] = float("nan")
        trainer.step = 2
        assert ck.save(trainer) is False
        ck.close()
        trainer.log._bar.close()
        trainer.log._file.close()
    finally:
        shutdown()
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step_00000001"]
    assert ck.skipped == [2]


# ----------------------------------------------------------------- Hugging Face
@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.mark.timeout(120)
def test_export_llama_gives_transformers_the_same_logits(run_dir, tmp_path, offline, capfd):
    out = tmp_path / "hf"
    assert cli("export", run_dir, "--format", "hf", "--out", out) == 0
    assert "LlamaForCausalLM" in capfd.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "ptd_export.json"]
    spec, state = checkpoint_model(run_dir / "checkpoints" / "step_00000004")
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    name, theirs = hf_logits(out, tokens)
    ours = ptd_logits(spec, state, tokens)
    assert name == "LlamaForCausalLM"
    assert (ours - theirs).abs().max().item() <= 1e-4
    # The export is of the newest good checkpoint: a damaged newest is skipped with a warning.
    root = copy_root(run_dir, tmp_path / "ckpts")
    _truncate(root / "step_00000004")
    assert cli("export", root, "--out", tmp_path / "hf2") == 0
    err = capfd.readouterr().err
    assert "step_00000004 refused" in err
    assert json.loads((tmp_path / "hf2" / "ptd_export.json").read_text())["step"] == 2


@pytest.mark.timeout(120)
def test_gpt2_style_exports_as_gpt2lmheadmodel(tmp_path, offline):
    from ptd.runtime.checkpoint import hf
    from ptd.runtime.model.init import materialize
    from ptd.runtime.model.transformer import build_model
    from ptd.specs import get_preset
    spec = get_preset("tiny-gpt")
    model = materialize(build_model(spec), "cpu", seed=3)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    hf.save_folder(state, spec, tmp_path / "gpt")
    back = hf.from_hf(hf.to_hf(state, spec), spec)
    assert all(torch.equal(back[k], state[k]) for k in state)
    tokens = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(2))
    name, theirs = hf_logits(tmp_path / "gpt", tokens)
    assert name == "GPT2LMHeadModel"
    assert (ptd_logits(spec, state, tokens) - theirs).abs().max().item() <= 1e-4


def test_unmappable_models_are_refused_with_the_reason():
    from ptd.runtime.checkpoint import hf
    from ptd.specs import get_preset
    with pytest.raises(PtdError, match="no Hugging Face class has mlp=swiglu, norm=layernorm"):
        hf.architecture(get_preset("tiny").replace(norm="layernorm"))
    with pytest.raises(PtdError, match="without biases"):
        hf.architecture(get_preset("tiny-gpt").replace(bias=False))
    with pytest.raises(PtdError, match="only Mixtral-shaped mixture-of-experts"):
        hf.architecture(get_preset("mixtral-8x7b").replace(n_shared_experts=1))


@pytest.mark.timeout(120)
def test_init_from_a_hugging_face_folder(run_dir, env, tmp_path, monkeypatch, capfd):
    from safetensors.torch import load_file

    from ptd.runtime.checkpoint import hf
    _, corpus = env
    folder = tmp_path / "hf"
    assert cli("export", run_dir, "--out", folder) == 0
    monkeypatch.setenv("PTD_DUMP_PARAMS", "1")
    out = tmp_path / "init"
    # Without --model the model comes from the folder's config.json.
    assert cli("train", "--init-from", folder, "--nproc", "1", "--steps", "1", "--global-batch", "4",
               "--micro-batch", "4", "--seq-len", "32", "--data", corpus, "--out", out) == 0
    assert "initial weights from" in capfd.readouterr().err
    start = torch.load(out / "params_init.pt")
    want = hf.from_hf(load_file(folder / "model.safetensors"), load_config(out / "config.toml").model)
    assert set(start) == set(want) and all(torch.equal(start[k], want[k]) for k in want)


@pytest.mark.timeout(60)
def test_init_from_refusals_in_one_line(run_dir, tmp_path, capfd, no_workers):
    import re
    folder = tmp_path / "hf"
    assert cli("export", run_dir, "--out", folder) == 0
    capfd.readouterr()
    scaled = tmp_path / "scaled"
    shutil.copytree(folder, scaled)
    c = json.loads((scaled / "config.json").read_text())
    c["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0}
    (scaled / "config.json").write_text(json.dumps(c))
    noweights = tmp_path / "noweights"
    noweights.mkdir()
    shutil.copy(folder / "config.json", noweights / "config.json")
    cases = [([folder, "--model", "tiny-gpt"], "holds another model than this run's tiny-gpt"),
             ([tmp_path / "nope"], "is not a folder"),
             ([scaled, "--model", "tiny"], "RoPE scaling"),
             ([noweights, "--model", "tiny"], "lacks model.safetensors")]
    for args, match in cases:
        rc = cli("train", "--init-from", *args, "--out", tmp_path / "out")
        err = capfd.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and re.search(match, err), err
    rc = cli("export", run_dir, "--out", folder)  # not empty
    assert rc == 2 and "exists and is not an empty folder" in capfd.readouterr().err

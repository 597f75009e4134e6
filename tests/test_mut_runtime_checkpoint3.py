"""runtime/checkpoint: single-process tests for the real survivors of a fresh mutation sample
(seed 20261202, N 25; docs/testing.md). Each expected value is written out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ptd.errors import PtdError
from ptd.runtime.checkpoint import store
from ptd.runtime.checkpoint.hf import weight_files


def test_a_file_longer_than_the_manifest_says_is_refused(tmp_path):
    # store.py: size != entry["size"] (a file with bytes appended is as damaged as a
    # truncated one; "<" would let it through)
    (tmp_path / ".metadata").write_bytes(b"meta")
    (tmp_path / "shard").write_bytes(b"0123456789" + b"xx")
    ckpt = store.Checkpoint(tmp_path, {"files": {".metadata": {"size": 4, "sha256": ""},
                                                 "shard": {"size": 10, "sha256": ""}}})
    assert store.problems(ckpt, deep=False) == [
        "shard has 12 bytes, the manifest says 10 (truncated?)"]


def test_sharded_weights_are_the_files_their_index_names(tmp_path):
    # hf.py weight_files: a folder with model.safetensors.index.json reads every file the
    # weight map names, once each, in order
    names = ["model-00002-of-00002.safetensors", "model-00001-of-00002.safetensors"]
    for n in names:
        (tmp_path / n).write_bytes(b"")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": names[0], "b": names[1], "c": names[0]}}))
    assert weight_files(tmp_path) == [tmp_path / names[1], tmp_path / names[0]]
    (tmp_path / names[0]).unlink()
    with pytest.raises(PtdError, match=f"lacks {names[0]}"):
        weight_files(tmp_path)


def test_an_explicit_resume_folder_with_no_checkpoint_is_refused(tmp_path, monkeypatch):
    # restore.py precheck: an explicit resume folder (here "zz", which sorts after "auto")
    # holding no checkpoint at all is refused; only resume == "auto" may find nothing
    from ptd.runtime.checkpoint.restore import precheck
    from ptd.specs.config import TrainConfig
    monkeypatch.chdir(tmp_path)
    Path("zz").mkdir()
    with pytest.raises(PtdError, match=r"^resume: no checkpoint in zz$"):
        precheck(TrainConfig().replace(resume="zz", out=str(tmp_path / "run")))
    precheck(TrainConfig().replace(resume="auto", out=str(tmp_path / "run")))  # nothing: fine

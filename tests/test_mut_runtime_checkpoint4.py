"""runtime/checkpoint: single-process tests for the two real survivors the fresh sample of
seed 20261203 left (docs/testing.md): the time an asynchronous save held the training loop,
and how the ranks' verdicts on a checkpoint are combined. Expected values by hand."""

from __future__ import annotations

import types

import pytest

from ptd.runtime.checkpoint import restore, saver
from ptd.specs import ParallelPlan, get_preset
from ptd.specs.config import CheckpointConfig, TrainConfig


class FakeDist:
    """``torch.distributed`` as ``restore._agree`` sees it on a group of ``len(others)+1``
    ranks whose other ranks said ``others``."""

    def __init__(self, others):
        self.others = others

    def is_initialized(self):
        return True

    def get_world_size(self, group=None):
        return len(self.others) + 1

    def all_gather_object(self, out, obj, group=None):
        assert len(out) == len(self.others) + 1  # a list of one slot per rank
        out[:] = [obj, *self.others]


def test_every_ranks_reason_is_named_once_in_rank_order(monkeypatch):
    monkeypatch.setattr(restore, "dist", FakeDist([None, "shard 3 truncated", "bad marker",
                                                   "shard 3 truncated"]))
    assert restore._agree("bad marker") == "bad marker; shard 3 truncated"
    assert restore._agree(None) == "shard 3 truncated; bad marker"
    monkeypatch.setattr(restore, "dist", FakeDist([None, None]))
    assert restore._agree(None) is None  # no rank refused it


@pytest.mark.timeout(120)
def test_an_async_save_reports_the_time_it_held_the_loop(tmp_path, monkeypatch, capfd):
    # a clock read 100.0 when the save starts and 100.25 at every later reading: the loop was
    # held 0.25 s, and the background write finished 0.25 s after the step
    from ptd.runtime.parallel.mesh import init_distributed, shutdown
    from ptd.runtime.worker import build_trainer
    readings = iter([100.0])
    monkeypatch.setattr(saver, "time", types.SimpleNamespace(
        perf_counter=lambda: next(readings, 100.25)))
    cfg = TrainConfig(model=get_preset("tiny"), steps=2, out=str(tmp_path / "run"),
                      plan=ParallelPlan(dp=1, micro_batch=2, global_batch=2, seq_len=32),
                      checkpoint=CheckpointConfig(every=1, async_save=True))
    dims = init_distributed(cfg.plan, 30)
    try:
        trainer = build_trainer(cfg, dims)
        ck = saver.Checkpointer(cfg, dims, trainer)
        trainer.step = 1
        assert ck.save(trainer) is True
        ck.wait()
        ck.close()
        trainer.log._bar.close()
        trainer.log._file.close()
    finally:
        shutdown()
    assert ck.save_seconds == [0.25]
    # the note gives the checkpoint's size in MiB: its manifest's files
    import json
    final = tmp_path / "run" / "checkpoints" / "step_00000001"
    files = json.loads((final / "ptd.json").read_text())["files"]
    mib = sum(e["size"] for e in files.values()) / 2**20
    err = capfd.readouterr().err
    assert "ptd: checkpoint of step 1 staged in 0.25 s; writing in the background" in err
    assert f"({mib:.1f} MiB, 0.25 s after the step, written in the background)" in err
    assert mib >= 0.1  # (tiny's weights and Adam's states: the figure is not a rounded 0)


# ---- survivors of the fresh sample of seed 20261204 (N 30; docs/testing.md)
def test_a_checkpoint_every_k_steps_and_after_the_last():
    # saver.py after_step: step % every == 0 (every 2: 2, 4, 6) or the last step (7)
    import contextlib
    ck = saver.Checkpointer.__new__(saver.Checkpointer)
    ck.every, ck.cfg = 2, types.SimpleNamespace(steps=7)
    saved = []
    ck.save = lambda trainer, rec: saved.append(trainer.step)
    trainer = types.SimpleNamespace(step=0, phase=lambda name: contextlib.nullcontext())
    for s in range(1, 8):
        trainer.step = s
        ck.after_step(trainer, {})
    assert saved == [2, 4, 6, 7]


def test_the_lowest_rank_with_a_non_finite_value_is_named_on_every_rank(monkeypatch):
    # state.py nonfinite_anywhere on 3 ranks: this one (rank 0) clean, ranks 1 and 2 each
    # found a value; the all-reduce takes the lowest reporting rank, the gather its name
    import torch

    from ptd.runtime.checkpoint import state

    class Dist3:
        ReduceOp = state.dist.ReduceOp

        def get_world_size(self, group=None):
            return 3

        def all_reduce(self, flag, op=None, group=None):
            flag.fill_(min(int(flag), 1, 2))  # ranks 1 and 2 report themselves

        def all_gather_object(self, out, obj, group=None):
            assert len(out) == 3
            out[:] = [obj, "layers.0.w on its shard", "norm.weight"]

    monkeypatch.setattr(state, "dist", Dist3())
    got = state.nonfinite_anywhere({"w": torch.ones(2)}, 0, None, torch.device("cpu"))
    assert got == "layers.0.w on its shard on rank 1"


def test_a_deep_check_hashes_every_file(tmp_path):
    # store.py problems(deep=True) with the default share (0, 1): every file is hashed, the
    # second of three (same size, other bytes) too
    from ptd.runtime.checkpoint import store
    names = [store.DCP_METADATA, "__0_0.distcp", "__1_0.distcp"]
    for n in names:
        (tmp_path / n).write_bytes(b"0123456789")
    files = {n: store.file_entry(tmp_path / n) for n in names}
    (tmp_path / names[1]).write_bytes(b"0123456780")
    ckpt = store.Checkpoint(tmp_path, {"files": files})
    assert sorted(files)[1] == names[1]
    assert store.problems(ckpt, deep=True) == [f"{names[1]} does not match its SHA-256 (corrupted)"]
    assert store.problems(ckpt, deep=False) == []


def test_a_gelu_model_with_rmsnorm_and_rope_has_no_hugging_face_class():
    # hf.py architecture: Llama needs SwiGLU; GELU with RMSNorm and RoPE is neither class
    from ptd.errors import PtdError
    from ptd.runtime.checkpoint.hf import architecture
    spec = get_preset("tiny").replace(mlp="gelu")
    assert (spec.norm, spec.position) == ("rmsnorm", "rope")
    with pytest.raises(PtdError, match="no Hugging Face class has mlp=gelu, norm=rmsnorm"):
        architecture(spec)
    assert architecture(get_preset("tiny")) == "llama"


# ---- survivors of the fresh sample of seed 20261205 (N 30; docs/testing.md)
def _safetensors(path, header, data=b""):
    import json
    import struct
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def test_a_zero_sized_tensor_is_a_well_formed_weight(tmp_path):
    # weights_check.py: a dimension of 0 is a shape (an empty tensor, no bytes), not damage
    from ptd.runtime.checkpoint.weights_check import check_header
    f = _safetensors(tmp_path / "a.safetensors",
                     {"w": {"dtype": "F32", "shape": [0, 4], "data_offsets": [0, 0]},
                      "v": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8)
    assert set(check_header(f)) == {"w", "v"}


def test_offsets_that_are_no_pair_are_a_malformed_entry(tmp_path):
    # weights_check.py: data_offsets 8 (not a pair) fails to unpack with a TypeError
    from ptd.errors import PtdError
    from ptd.runtime.checkpoint.weights_check import check_header
    f = _safetensors(tmp_path / "b.safetensors",
                     {"w": {"dtype": "F32", "shape": [2], "data_offsets": 8}}, b"\0" * 8)
    with pytest.raises(PtdError, match="tensor 'w' has a malformed header entry"):
        check_header(f)


def test_a_checkpoint_past_step_0_must_hold_the_optimizer_state(tmp_path, monkeypatch):
    # restore.py metadata_problems: from step 1 on, Adam's exp_avg of every parameter
    import torch.distributed.checkpoint as dcp

    from ptd.runtime.checkpoint import restore

    class Reader:
        def __init__(self, path):
            pass

        def read_metadata(self):
            return types.SimpleNamespace(state_dict_metadata={
                "model.w": types.SimpleNamespace(size=(2, 3))})

    monkeypatch.setattr(dcp, "FileSystemReader", Reader)
    monkeypatch.setattr(restore, "expected_params", lambda model, split: {"w": (2, 3)})
    cfg = types.SimpleNamespace(model=None, plan=types.SimpleNamespace(tp_split=None))
    ckpt = lambda step: types.SimpleNamespace(path=tmp_path, step=step, config=cfg)  # noqa: E731
    assert restore.metadata_problems(ckpt(0)) == []
    assert restore.metadata_problems(ckpt(1)) == [
        "1 tensor(s) its config implies are not in .metadata (first: optim.state.w.exp_avg)"]


def test_only_a_full_disk_is_reported_as_one(tmp_path):
    # saver.py disk_full: ENOSPC (28) is a full disk; EROFS (30), a read-only filesystem,
    # is not, and goes back to the caller to be re-raised
    import errno

    from ptd.errors import PtdFault
    (tmp_path / "tmp").mkdir()
    saver.disk_full(OSError(errno.EROFS, "Read-only file system"), tmp_path / "tmp", 3, [])
    assert not (tmp_path / "tmp").exists()  # the partial checkpoint is removed either way
    with pytest.raises(PtdFault, match=r"^disk full: no space left on device writing .* "
                                       r"\(checkpoint of step 3\); .* no earlier checkpoint"):
        saver.disk_full(OSError(errno.ENOSPC, "No space"), tmp_path / "tmp", 3, [])

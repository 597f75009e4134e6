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
    err = capfd.readouterr().err
    assert "ptd: checkpoint of step 1 staged in 0.25 s; writing in the background" in err
    assert "MiB, 0.25 s after the step, written in the background)" in err

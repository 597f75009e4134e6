"""The trainer's phase hooks: measurement and failure handling attach through
``Trainer.phase_hooks`` / ``record_hooks``, not by replacing methods on instances."""

import contextlib
import inspect
import json
from pathlib import Path

import pytest

from ptd.cli import main
from ptd.runtime.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]


def bare_trainer(hooks):
    t = Trainer.__new__(Trainer)  # phase() needs nothing else
    t.phase_hooks = list(hooks)
    return t


def recorder(tag, log):
    @contextlib.contextmanager
    def hook(name, step):
        log.append(("enter", tag, name, step))
        try:
            yield
        except KeyError as e:
            log.append(("saw", tag, type(e).__name__))
            raise ValueError(f"{tag} explains: {e}") from e
        finally:
            log.append(("exit", tag, name, step))
    return hook


def test_phase_hooks_nest_latest_outermost_and_see_errors_innermost_first():
    log = []
    t = bare_trainer([recorder("guard", log), recorder("probe", log)])
    with t.phase("train_step", 7):
        log.append(("body",))
    assert log == [("enter", "probe", "train_step", 7), ("enter", "guard", "train_step", 7),
                   ("body",), ("exit", "guard", "train_step", 7),
                   ("exit", "probe", "train_step", 7)]
    log.clear()
    with pytest.raises(ValueError, match="guard explains"):
        with t.phase("global_loss"):
            raise KeyError("x")
    # the inner hook (registered first) turns the error into its own; the outer one sees that
    assert log == [("enter", "probe", "global_loss", None), ("enter", "guard", "global_loss", None),
                   ("saw", "guard", "KeyError"), ("exit", "guard", "global_loss", None),
                   ("exit", "probe", "global_loss", None)]


def test_no_hooks_runs_the_body():
    t = bare_trainer([])
    with t.phase("next_batch"):
        ran = True
    assert ran


def _shadowed_methods(obj):
    """Instance attributes that hide a method of the object's class."""
    cls = type(obj)
    return sorted(k for k, v in vars(obj).items()
                  if callable(v) and inspect.isfunction(getattr(cls, k, None)))


@pytest.mark.timeout(120)
def test_a_measured_run_replaces_no_method(tmp_path, monkeypatch):
    """A real run in this process (world of one): the probe and the guard are registered
    hooks, no method of the trainer, runner or blocks is replaced, and what they measure
    still reaches metrics.jsonl and summary.json."""
    from ptd.runtime.model.transformer import Block
    seen = {}
    train = Trainer.train

    def inspecting_train(self):
        blocks = [m for m in self.model.modules() if isinstance(m, Block)]
        seen.update(phase_hooks=len(self.phase_hooks), record_hooks=len(self.record_hooks),
                    shadowed=_shadowed_methods(self) + _shadowed_methods(self.runner)
                    + [k for b in blocks for k in _shadowed_methods(b)],
                    spans=all(b.span and b.attention.span for b in blocks))
        return train(self)
    monkeypatch.setattr(Trainer, "train", inspecting_train)
    monkeypatch.setenv("PTD_HOME", str(tmp_path / "home"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text((ROOT / "README.md").read_text() * 4)
    out = tmp_path / "run"
    rc = main(["train", "--model", "tiny", "--nproc", "1", "--steps", "7", "--global-batch", "2",
               "--micro-batch", "1", "--seq-len", "32", "--warmup", "1", "--data", str(corpus),
               "--out", str(out)])
    assert rc == 0
    assert seen == {"phase_hooks": 2, "record_hooks": 1, "shadowed": [], "spans": True}
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r.get("memory_tracked")] == [2]
    assert [r["step"] for r in recs if r.get("profiled")] == [3, 4, 5]
    assert all(r["t_fwd_bwd_s"] > 0 and r["t_data_s"] > 0 and r["t_optimizer_s"] > 0
               for r in recs)
    m = json.loads((out / "summary.json").read_text())["measured"]
    assert m["clean_steps"] == [6, 7]
    b = m["breakdown"]
    assert b["forward"] > 0 and b["backward"] > 0 and b["optimizer"] > 0 and b["data"] > 0
    assert m["memory"]["activations"] > 0


def test_spans_wait_for_the_device_only_while_the_probe_profiles_on_a_gpu(monkeypatch):
    # CUDA kernels run after the host issues them: a span must wait for them before it
    # closes, or its time lands in whichever later span synchronises. Here the device is a
    # stand-in that records when it is synchronised relative to the span's body.
    import torch

    from ptd.runtime.measure import spans
    events = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: events.append("sync"))
    spans.set_device_sync(True)
    try:
        with spans.span("ptd:backward"):
            events.append("body")
        assert events == ["body", "sync"]
    finally:
        spans.set_device_sync(False)
    with spans.span("ptd:backward"):
        events.append("body")
    assert events == ["body", "sync", "body"]  # off outside the profiled steps
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    spans.set_device_sync(True)  # no CUDA: never on
    with spans.span("ptd:forward"):
        pass
    assert events == ["body", "sync", "body"]
    spans.set_device_sync(False)


def test_block_spans_wait_for_the_device_only_when_recomputed_in_the_backward(monkeypatch):
    # A sync per block in the forward drains the device's queue 2 x n_layers times a step
    # (GPT-2 1.5B's profiled forward on an H200: 124-132 ms with them, 95-98 without); in
    # the backward a block's span marks a recomputation, which must hold its own kernels.
    import torch

    from ptd.runtime.measure import spans
    from ptd.runtime.model.init import materialize
    from ptd.runtime.model.transformer import build_model
    from ptd.specs import get_preset
    spec = get_preset("tiny")
    model = materialize(build_model(spec, "meta"), torch.device("cpu"), seed=0)
    block = model.layers["0"]
    block.span = block.attention.span = True
    syncs = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: syncs.append(1))
    x = torch.randn(2, 8, spec.hidden, requires_grad=True)
    rope = (model.rope_cos, model.rope_sin) if model.rope_cos is not None else None
    spans.set_device_sync(True)
    try:
        for mode in ("none", "full", "selective"):
            block.set_recompute(mode)
            y = block(x, rope)
            assert syncs == [], mode  # forward: no block waits for the device
            y.sum().backward()
            # recomputed spans wait, also when the non-reentrant checkpoint stops
            # recomputing early (it raises once it has the tensors it needs): full, the
            # block's span and its attention core's; selective, the core's
            assert len(syncs) == {"none": 0, "full": 2, "selective": 1}[mode], mode
            syncs.clear()
    finally:
        spans.set_device_sync(False)

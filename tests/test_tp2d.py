"""2-D tensor parallelism (``--tp-mode 2d``, :mod:`ptd.runtime.parallel.tp2d`).

* one forward and backward of a whole model on a 2 x 2 gloo mesh against the same model in
  one plain process: loss, every parameter's gradient (gathered from its DTensor blocks,
  so the placements must tell the truth), with LayerNorm, biases, learned positions and a
  vocabulary whose padding fills a whole mesh column's logits;
* checkpoints move 2-D -> 1-D -> 2-D (DCP reshards the DTensor blocks) and continue the
  uninterrupted 2-D run;
* what ``ptd train`` refuses, one line and exit code 2 before any worker starts.

The loss parity of whole training runs (tp 4 as 2 x 2, alone and with dp 2) is in
test_train_tppp.py's LAYOUTS.
"""

import functools
import re

import pytest
import torch

import helpers
from helpers import losses, ok
from ptd.specs import ParallelPlan, get_preset

# GPT-2 style (LayerNorm with bias, GELU, learned positions, biases), untied; vocabulary 200
# padded to 256 at q = 2: column 1's logits (global 128..255) hold 56 real entries, and at
# vocab_multiple 128 every padded row sits in column 1's block -- see the asserts below.
SPEC = get_preset("tiny-gpt").replace(name="tiny-gpt-untied", tied_embeddings=False, vocab_size=200)
B, S, SEED = 4, 16, 3


def _batch():
    g = torch.Generator().manual_seed(11)
    tokens = torch.randint(0, SPEC.vocab_size, (B, S + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def _grads(model):
    from ptd.runtime.model.transformer import is_vocab_tensor
    out = {}
    for name, p in model.named_parameters():
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        out[name] = g[:SPEC.vocab_size] if is_vocab_tensor(name) else g
    return out


def _on_2x2_mesh(rank, world):
    """One step's loss and gradients on rank ``rank`` of a 2 x 2 mesh (tp 4, 2d)."""
    from torch.distributed.device_mesh import DeviceMesh
    from ptd.runtime.model.init import materialize
    from ptd.runtime.model.transformer import build_model
    from ptd.runtime.parallel.tp import AlignTPGrads
    from ptd.runtime.parallel.tp2d import Grid, apply_tp2d, loss_sum_2d
    plan = ParallelPlan(tp=4, tp_mode="2d", micro_batch=B, global_batch=B, seq_len=S)
    plan.validate(SPEC, world)
    mesh = DeviceMesh("cpu", torch.arange(4).view(2, 2), mesh_dim_names=("tpr", "tpc"))
    model = build_model(SPEC, tp=plan.tp_split)
    apply_tp2d(model, mesh, plan)
    materialize(model, "cpu", SEED)
    tokens, targets = _batch()
    logits = model(tokens)
    loss = loss_sum_2d(Grid.of(mesh), logits, targets)
    loss.backward()
    AlignTPGrads(list(model.parameters()))()
    placements = {n: (tuple(map(str, p.placements)), tuple(map(str, p.grad.placements)))
                  for n, p in model.named_parameters()}
    # numpy arrays pickle by value (tensors would go through shared memory that the exiting
    # worker takes with it)
    grads = {n: g.detach().numpy() for n, g in _grads(model).items()}
    return float(loss.detach()), tuple(logits.shape), placements, grads


@pytest.mark.timeout(180)
def test_one_step_on_a_2x2_mesh_equals_one_process(tmp_path):
    from ptd.runtime.model.init import materialize
    from ptd.runtime.model.transformer import build_model, lm_loss_sum
    # the reference: one process, no collectives, the vocabulary padded as for tp 1 (200 -> 256)
    ref = build_model(SPEC, tp=1)
    materialize(ref, "cpu", SEED)
    tokens, targets = _batch()
    ref_loss = lm_loss_sum(ref(tokens), targets)
    ref_loss.backward()
    want = _grads(ref)
    assert SPEC.padded_vocab(2) == SPEC.padded_vocab(1) == 256  # the padding is column 1's

    out = helpers.spawn_world(_on_2x2_mesh, 4, tmp_path / "store", timeout=150)
    for rank, (loss, shape, placements, grads) in out.items():
        assert loss == pytest.approx(float(ref_loss.detach()), rel=1e-6), rank  # the same on every rank
        assert shape == (B // 2, S, 256 // 2)  # logits block: half the batch, half the vocabulary
        assert set(grads) == set(want)
        for name, g in grads.items():
            torch.testing.assert_close(torch.from_numpy(g), want[name], rtol=1e-4, atol=1e-6, msg=f"{rank} {name}")
        # gradients placed as their parameters: blocks, or hidden-split vectors summed over rows
        assert all(p == gp for p, gp in placements.values()), placements
        assert placements["layers.0.attention.wq.weight"][0] == ("S(1)", "S(0)")
        assert placements["layers.0.ffn_norm.bias"][0] == ("R", "S(0)")
        assert placements["pos_embeddings.weight"][0] == ("R", "S(1)")


# ------------------------------------------------------------------ checkpoints 2d <-> 1d
COMMON = ["--model", "tiny", "--steps", "6", "--global-batch", "8", "--seq-len", "64",
          "--warmup", "2", "--timeout", "60", "--profile-steps", "0", "--memory-step", "0"]
RUN_TIMEOUT = 150
train = functools.partial(helpers.ptd_train, common=COMMON, timeout=RUN_TIMEOUT)


@pytest.mark.dist
@pytest.mark.timeout(4 * RUN_TIMEOUT)
def test_checkpoints_move_between_2d_and_1d(tmp_path):
    """tp 4 as 2 x 2 at step 3 -> tp 2 (1d), its step 4 -> tp 4 as 2 x 2 again to step 6:
    the losses and final parameters of the uninterrupted 2-D run. (Every run keeps
    ``--steps 6``: the learning-rate schedule follows it.) With full recompute, which the
    resumed runs inherit: 2-D blocks recomputed in the backward (their collectives run
    again) must give the gradients the 1-D run computes."""
    home = tmp_path / "home"
    tp2d = ["--nproc", "4", "--tp", "4", "--tp-mode", "2d", "--micro-batch", "4"]
    src = tmp_path / "src"  # uninterrupted
    ok(train(src, *tp2d, "--recompute", "full", "--checkpoint-every", "3", home=home,
             dump_params=True))
    mid = tmp_path / "mid"  # 2d -> 1d
    r = ok(train(mid, "--resume", str(src / "checkpoints" / "step_00000003"), "--nproc", "2",
                 "--tp", "2", "--tp-mode", "1d", "--checkpoint-every", "1", "--checkpoint-keep", "3",
                 home=home))
    assert re.search(r"resumed from \S+step_00000003 at step 3 ", r.stderr), r.stderr[-2000:]
    end = tmp_path / "end"  # 1d -> 2d
    r = ok(train(end, "--resume", str(mid / "checkpoints" / "step_00000004"), *tp2d, home=home,
                 dump_params=True))
    assert re.search(r"resumed from \S+step_00000004 at step 4 ", r.stderr), r.stderr[-2000:]
    a, m, e = losses(src), losses(mid), losses(end)
    assert len(a) == len(m) == len(e) == 6
    assert m[:3] == a[:3] and e[:4] == m[:4]  # replayed from the checkpoints' metrics
    # trained again after a reshard: split sums in another order, hence 1e-4
    assert m[3:] == pytest.approx(a[3:], rel=1e-4)
    assert e[4:] == pytest.approx(a[4:], rel=1e-4)
    assert a[-1] < a[0] - 0.3
    pe, pa = helpers.params(end), helpers.params(src)
    assert set(pe) == set(pa)
    for k in pa:
        torch.testing.assert_close(pe[k], pa[k], rtol=1e-4, atol=1e-6, msg=k)


# ------------------------------------------------------------------ refusals (no worker)
@pytest.mark.parametrize("flags,match", [
    (["--nproc", "2", "--tp", "2", "--tp-mode", "2d"], r"tp = q\*q with q >= 2 .* got tp 2$"),
    (["--nproc", "8", "--tp", "8", "--tp-mode", "2d"], r"tp = q\*q .* got tp 8$"),
    (["--nproc", "4", "--tp", "4", "--tp-mode", "2d", "--micro-batch", "1"],
     "micro_batch 1 is not divisible by q = 2"),
    (["--nproc", "4", "--tp", "4", "--tp-mode", "2d", "--micro-batch", "2", "--sp"], "drop --sp"),
    (["--nproc", "8", "--tp", "4", "--cp", "2", "--tp-mode", "2d", "--micro-batch", "2"],
     "context parallel"),
    (["--nproc", "8", "--tp", "4", "--dp", "2", "--zero", "1", "--tp-mode", "2d", "--micro-batch", "2"],
     "ZeRO/FSDP"),
    (["--nproc", "8", "--tp", "4", "--pp", "2", "--tp-mode", "2d", "--micro-batch", "2"],
     "pipeline parallel"),
    (["--model", "tiny-gpt", "--nproc", "4", "--tp", "4", "--tp-mode", "2d", "--micro-batch", "2"],
     "tied embeddings"),
    (["--model", "tiny-moe", "--nproc", "4", "--tp", "4", "--tp-mode", "2d", "--micro-batch", "2"],
     "mixture-of-experts"),
    (["--nproc", "4", "--tp", "4", "--tp-mode", "2d", "--micro-batch", "2", "--compile"],
     "--compile"),
])
def test_refused_before_any_worker(ptd_cli, no_workers, tmp_path, flags, match):
    out = tmp_path / "out"
    rc, _, err = ptd_cli("train", "--model", "tiny", "--seq-len", "64", "--global-batch", "8",
                         *flags, "--out", str(out))
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("ptd train: error:"), err
    assert re.search(match, err.strip()), err
    assert not out.exists()


def test_plan_checks_and_the_one_validator():
    from ptd.errors import PtdError
    from ptd.runtime.launch.limits import plan_problem
    tiny = get_preset("tiny")
    p = ParallelPlan(tp=4, tp_mode="2d", micro_batch=2, global_batch=8, seq_len=64)
    p.validate(tiny, 4)
    assert plan_problem(tiny, p) is None
    assert p.tp_split == 2 and "tp-2d" in p.describe()
    # 2d splits heads over q = 2 columns only: 6 heads run at tp 4 as 2 x 2 (not as 1d)
    six = tiny.replace(name="six-heads", n_heads=6, n_kv_heads=2)
    p.validate(six, 4)
    with pytest.raises(PtdError, match="6 attention heads are not divisible by tp 4"):
        p.replace(tp_mode="1d").validate(six, 4)
    with pytest.raises(PtdError, match="hidden 65 is not divisible by q = 2"):
        p.validate(tiny.replace(hidden=65, n_heads=4, n_kv_heads=2), 4)  # (head_dim 16)
    with pytest.raises(PtdError, match="tp_mode must be one of 1d, 2d"):
        p.replace(tp_mode="3d").validate()
    # exports: only ptd's own format can say 2d; the others would write a 1-D layout
    from ptd.cost.estimate import estimate
    from ptd.planner import export as X
    from ptd.specs import ClusterSpec, load_hardware
    e = estimate(tiny, ClusterSpec(load_hardware("cpu"), 4), p, validate=False)
    from ptd.specs.config import load_config
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "plan.toml"
        path.write_text(X.export(e, "ptd", hardware="cpu", steps=5, out="runs/x"))
        assert load_config(path).plan.tp_mode == "2d"
    for fmt in X.FORMATS:
        if fmt != "ptd":
            with pytest.raises(PtdError, match="no 2d tensor parallelism"):
                X.export(e, fmt, hardware="cpu")


def test_cost_model_prices_the_2d_shards_by_hand():
    # tp 4 as 2 x 2 (q = 2); what runtime/parallel/tp2d.py allocates per rank, by hand:
    # matrices and the token embedding in q x q blocks (/4), norm weights and biases and the
    # learned positions' hidden over the mesh columns (/2), the vocabulary padded per q
    # (256 = 128 x 2: no padding; 1-D tp 4 pads it to 512)
    from ptd.cost import params as P
    from ptd.specs import ParallelPlan, get_preset
    plan = ParallelPlan(tp=4, tp_mode="2d", global_batch=8, micro_batch=4, seq_len=64)
    # tiny (h 64, 8 heads / 4 kv of 8, F 128, SwiGLU, RMSNorm): per block 2 norms 64, q 1024,
    # k + v 1024, o 1024, w1 + w3 4096, w2 2048 = 9,280; 4 blocks, embedding and output 4,096
    # each, final norm 32
    assert P.local_numel(get_preset("tiny"), plan, 0) == 4 * 9280 + 2 * 4096 + 32 == 45_344
    # tiny-gpt untied (h 64, F 256, GELU, LayerNorm, biases, learned positions): per block two
    # LayerNorms 128, four attention matrices 4,096, their biases 128, w1 + w2 8,192, their
    # biases (256 + 64) / 2 = 160 -> 12,704; embedding 4,096, positions 256 x 32 = 8,192,
    # final LayerNorm 64, output 4,096
    gpt = get_preset("tiny-gpt").replace(tied_embeddings=False)
    assert P.local_numel(gpt, plan, 0) == 4 * 12704 + 4096 + 8192 + 64 + 4096 == 67_264
    assert P.local_numel(get_preset("tiny"), plan.replace(tp_mode="1d"), 0) == 53_824

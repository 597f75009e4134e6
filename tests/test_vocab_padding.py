"""The vocabulary padded for tensor parallelism, as Megatron-LM pads it: up to a multiple of
``vocab_multiple x tp`` (128 x tp by default). Expected sizes are worked by hand; the padding
rows must never receive probability or gradient, exports must hold the real vocabulary only,
and checkpoints must move between paddings (tp 1 <-> tp 2 with FSDP) without changing the run.
"""

import json
import math

import pytest
import torch

import helpers
from helpers import assert_same_params, losses
from ptd.cost import params as P
from ptd.errors import PtdError
from ptd.specs import ParallelPlan, get_preset


# ------------------------------------------------------------------ sizes, by hand
@pytest.mark.parametrize("name,tp,rows", [
    ("gpt2", 1, 50304),        # 50257 / 128 = 392.6 -> 393 x 128
    ("gpt2", 8, 51200),        # 50257 / 1024 = 49.1 -> 50 x 1024
    ("llama3-8b", 1, 128256),  # 1002 x 128 exactly: no padding
    ("llama3-8b", 8, 129024),  # 128256 / 1024 = 125.25 -> 126 x 1024
    ("tiny", 2, 256),          # 256 = 1 x 256
    ("tiny", 4, 512),          # 256 < 512: a whole tp shard of padding
])
def test_padded_vocab_by_hand(name, tp, rows):
    assert get_preset(name).padded_vocab(tp) == rows


def test_vocab_multiple_is_configurable_and_checked():
    gpt2 = get_preset("gpt2")
    assert gpt2.replace(vocab_multiple=1).padded_vocab(1) == 50257
    assert gpt2.replace(vocab_multiple=1).padded_vocab(3) == 50259  # 16753 x 3
    assert gpt2.replace(vocab_multiple=64).padded_vocab(2) == 50304  # 393 x 128
    with pytest.raises(PtdError, match="vocab_multiple must be a positive integer"):
        gpt2.replace(vocab_multiple=0)


def test_cost_model_prices_the_padded_rows():
    """The output layer's shard at tp 8 holds 51200 / 8 rows; the embedding likewise."""
    m = get_preset("gpt3-175b")
    out = {p.name: p for p in P.last_stage_params(m, True)}["output.weight"]
    emb = {p.name: p for p in P.first_stage_params(m)}["tok_embeddings.weight"]
    assert out.local_shape(8) == (6400, 12288)
    assert emb.local_shape(8) == (6400, 12288)
    assert out.local_shape(1) == (50304, 12288)
    # a tied model on one stage holds the matrix once: padded rows x h, plus its blocks
    plan = ParallelPlan(tp=8, seq_len=2048, global_batch=8)
    blocks = sum(math.prod(p.local_shape(8)) for p in P.layer_params(m)) * m.n_layers
    norms = sum(math.prod(p.local_shape(8)) for p in P.last_stage_params(m, False))
    pos = 2048 * 12288
    assert P.local_numel(m, plan, 0) == 6400 * 12288 + pos + blocks + norms


def test_estimate_accepts_and_reports_the_padding(ptd_cli):
    rc, out, err = ptd_cli("estimate", "--model", "gpt3-175b", "--hardware", "h100-sxm",
                           "--gpus", "64", "--tp", "8", "--json")
    assert rc == 0, err
    assert json.loads(out)["vocab"] == {"size": 50257, "multiple": 128, "padded": 51200}
    rc, out, err = ptd_cli("estimate", "--model", "gpt3-175b", "--hardware", "h100-sxm",
                           "--gpus", "64", "--tp", "8")
    assert rc == 0, err
    assert "vocabulary: 50257 padded to 51200 (a multiple of 128 x tp 8" in out


def test_planner_searches_tp_on_an_odd_vocabulary():
    from ptd.planner.search import search
    from helpers import cluster
    res = search(get_preset("gpt2"), cluster("h100-sxm", 8), global_batch=64, seq_len=1024)
    # 50257 is odd: without padding only tp 1 could split it; 12 heads rule out tp 8
    assert {e.plan.tp for e in res.ranked} == {1, 2, 4}


# ------------------------------------------------------------------ the runtime model
def _model(vocab_rows, vocab=300, seed=0):
    from ptd.runtime.model.init import materialize
    from ptd.runtime.model.transformer import Transformer
    spec = get_preset("tiny").replace(vocab_size=vocab, name="tiny-v300")
    with torch.device("meta"):
        m = Transformer(spec, vocab_rows)
    return spec, materialize(m, "cpu", seed)


def test_padding_rows_start_at_zero_and_never_learn():
    spec, m = _model(512)
    assert m.output.weight.shape == (512, 64)
    assert torch.count_nonzero(m.output.weight[300:]) == 0
    assert torch.count_nonzero(m.tok_embeddings.weight[300:]) == 0
    tokens = torch.randint(0, 300, (2, 17))
    logits = m(tokens[:, :-1])
    assert torch.isneginf(logits[..., 300:]).all()
    prob = torch.softmax(logits.float(), -1)
    assert torch.count_nonzero(prob[..., 300:]) == 0
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    assert torch.count_nonzero(m.output.weight.grad[300:]) == 0
    assert torch.count_nonzero(m.output.weight.grad[:300]) > 0
    assert torch.count_nonzero(m.tok_embeddings.weight.grad[300:]) == 0


def test_real_rows_do_not_depend_on_the_padding():
    """The same seed gives the same real rows at 384 and 512 rows, hence the same logits."""
    _, a = _model(384)
    _, b = _model(512)
    assert torch.equal(a.output.weight[:300], b.output.weight[:300])
    tokens = torch.randint(0, 300, (2, 16))
    assert torch.equal(a(tokens)[..., :300], b(tokens)[..., :300])


def test_mask_of_a_tp_shard_covers_its_own_padding_columns():
    """The masking on DTensor logits: each rank's slice of 512 / 4 = 128 columns masks the
    global columns >= 300 it holds -- none on ranks 0-1, 84 on rank 2 (300..383), all on 3."""
    from ptd.runtime.model.transformer import _mask_from
    x = torch.zeros(1, 2, 128)
    for rank, masked in [(0, 0), (1, 0), (2, 84), (3, 128)]:
        y = _mask_from(x, 300 - rank * 128)
        assert int(torch.isneginf(y).sum()) == 2 * masked


transformers = pytest.importorskip("transformers")


def test_export_and_import_hold_the_real_vocabulary_only(tmp_path, monkeypatch):
    """A Llama folder with 300 tokens (transformers' own random weights) loaded into a
    512-row model: logits equal transformers' on the real columns, -inf on the padding;
    exporting it back writes 300 rows equal to the folder's."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from ptd.runtime.checkpoint import hf
    from safetensors.torch import load_file
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                                   max_position_embeddings=64, tie_word_embeddings=False)
    theirs = transformers.LlamaForCausalLM(cfg).eval()
    theirs.save_pretrained(tmp_path / "in", safe_serialization=True)
    spec, _ = hf.read_config(tmp_path / "in")
    from ptd.runtime.model.transformer import build_model
    ours = build_model(spec, "cpu", tp=4)  # 300 -> 512 rows
    hf.load_into(ours, tmp_path / "in", spec)
    tokens = torch.randint(0, 300, (2, 16))
    with torch.no_grad():
        mine = ours.eval()(tokens)
        want = theirs(tokens).logits
    assert mine.shape[-1] == 512
    assert torch.allclose(mine[..., :300], want, atol=1e-5, rtol=1e-4)
    assert torch.isneginf(mine[..., 300:]).all()
    hf.save_folder(dict(ours.state_dict()), spec, tmp_path / "out")
    back = load_file(str(tmp_path / "out" / "model.safetensors"))
    orig = load_file(str(tmp_path / "in" / "model.safetensors"))
    for k in ("model.embed_tokens.weight", "lm_head.weight"):
        assert back[k].shape == (300, 64)
        assert torch.equal(back[k], orig[k])


# ------------------------------------------------------------------ runs across paddings
def common(steps=8):  # (one schedule: the LR follows --steps)
    return ["--steps", str(steps), "--global-batch", "8", "--seq-len", "64", "--warmup", "2",
            "--timeout", "60", "--micro-batch", "2", "--profile-steps", "0"]


@pytest.fixture(scope="module")
def v300(tmp_path_factory):
    d = tmp_path_factory.mktemp("v300")
    (d / "v300.toml").write_text('[model]\npreset = "tiny"\nname = "tiny-v300"\nvocab_size = 300\n')
    home = d / "home"
    ref = helpers.trained(d / "ref", "--model", str(d / "v300.toml"), "--nproc", "1",
                          "--checkpoint-every", "3", "--checkpoint-keep", "3", *common(), home=home,
                          dump_params=True)
    return d, home, ref


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_tp4_with_a_shard_of_padding_matches_one_process(v300):
    d, home, ref = v300
    run = helpers.trained(d / "tp4", "--model", str(d / "v300.toml"), "--nproc", "4", "--tp", "4",
                          *common(), home=home, dump_params=True)
    assert losses(run) == pytest.approx(losses(ref), rel=1e-4)
    assert losses(ref)[0] == pytest.approx(math.log(300), rel=0.05)  # not ln 512: padding masked
    s = json.loads((run / "summary.json").read_text())
    assert s["vocab_padding"].startswith("vocabulary: 300 padded to 512 (a multiple of 128 x tp 4")
    assert_same_params(run, ref, rel=1e-4)


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_checkpoints_move_between_paddings(v300):
    """tp 1 (384 rows) at step 3 -> dp 2 x tp 2 with FSDP (512 rows), its step 6 -> tp 1
    again to step 8: the losses of the uninterrupted tp-1 run, and its exported weights."""
    d, home, ref = v300
    model = ["--model", str(d / "v300.toml")]
    mid = helpers.trained(d / "mid", *model, "--nproc", "4", "--tp", "2", "--dp", "2", "--zero", "3",
                          "--resume", str(ref / "checkpoints" / "step_00000003"),
                          "--checkpoint-every", "3", "--checkpoint-keep", "3", *common(), home=home)
    end = helpers.trained(d / "end", *model, "--nproc", "1", "--tp", "1", "--dp", "1", "--zero", "0",
                          "--resume", str(mid / "checkpoints" / "step_00000006"), *common(),
                          home=home, dump_params=True)
    assert losses(mid)[3:] == pytest.approx(losses(ref)[3:], rel=1e-5)
    assert losses(end)[6:] == pytest.approx(losses(ref)[6:], rel=1e-5)
    pe, pr = helpers.params(end), helpers.params(ref)  # (a resumed run's "init" is its resume)
    assert set(pe) == set(pr)
    for k in pr:
        assert torch.allclose(pe[k], pr[k], rtol=1e-4, atol=1e-6), k
    from ptd.cli import main
    from safetensors.torch import load_file
    for run in (ref, mid, end):
        assert main(["export", str(run), "--out", str(run / "hf")]) == 0
    a, b, c = (load_file(str(r / "hf" / "model.safetensors")) for r in (ref, mid, end))
    assert a["lm_head.weight"].shape == b["lm_head.weight"].shape == (300, 64)
    for k in a:
        assert torch.allclose(a[k], c[k], rtol=1e-4, atol=1e-6), k

"""Checkpoint rules left untested by a fresh sample of runtime/checkpoint's mutants (seed
20261201, N 25, issue 21; the method of docs/testing.md, "runtime/parallel and
runtime/checkpoint, sampled"):
the tied embedding's optimizer keys (``state.py:98``), the Mixtral export's router
(``hf.py:125``), a Llama config whose ``attention_bias`` and ``mlp_bias`` differ
(``hf.py:249``: only ``mlp_bias`` true was refused), the "older refused" count
(``restore.py:163``) and an explicit relative ``resume`` path in the launcher's precheck
(``restore.py:176``: ``== "auto"`` as ``>= "auto"`` read ``ckpts`` as ``auto``).

Expected values follow from the documented rules and the file formats, worked by hand in
the comments, or from transformers' own model (the Mixtral logits). Single process."""

from pathlib import Path

import pytest
import torch
from torch import nn

from ptd.errors import PtdError
from test_mut_runtime_checkpoint import LLAMA, folder_with


# ------------------------------------------------------------------ state.py: _alias
def _last_stage_with_tied_copy():
    """A pipeline's last stage as tied_copy sees it: a tied-embedding model whose output
    layer is present and whose embedding is not (another rank holds it)."""
    from types import SimpleNamespace
    m = nn.Module()
    m.spec = SimpleNamespace(tied_embeddings=True)
    m.tok_embeddings = None
    m.output = nn.Linear(4, 6, bias=False)
    return m


def test_tied_copy_optimizer_keys_are_stored_under_the_embeddings_name():
    # TrainState.state_dicts's rule: the copy's AdamW states (state.output.weight.*,
    # param_groups.output.weight.*) are written under tok_embeddings.weight, as a run
    # without the copy names them; every other key as it is.
    from ptd.runtime.checkpoint.state import _alias
    part = _last_stage_with_tied_copy()
    assert _alias("state.output.weight.exp_avg", part) == "state.tok_embeddings.weight.exp_avg"
    assert _alias("state.output.weight.step", part) == "state.tok_embeddings.weight.step"
    assert _alias("param_groups.output.weight.lr", part) == "param_groups.tok_embeddings.weight.lr"
    assert _alias("state.norm.weight.exp_avg", part) == "state.norm.weight.exp_avg"
    # a stage holding the embedding itself (no copy): nothing renamed
    whole = _last_stage_with_tied_copy()
    whole.tok_embeddings = nn.Embedding(6, 4)
    assert _alias("state.output.weight.exp_avg", whole) == "state.output.weight.exp_avg"


def test_tied_copy_state_dict_holds_the_embeddings_moments():
    from ptd.runtime.checkpoint.state import TrainState
    part = _last_stage_with_tied_copy()
    opt = torch.optim.AdamW(part.parameters(), lr=0.1)
    osd = TrainState(part, opt).state_dict()["optim"]
    keys = sorted(k for k in osd if k.startswith("state."))
    # one parameter, AdamW's three states, under the embedding's name
    assert keys == ["state.tok_embeddings.weight.exp_avg", "state.tok_embeddings.weight.exp_avg_sq",
                    "state.tok_embeddings.weight.step"]
    assert osd["state.tok_embeddings.weight.exp_avg"].shape == (6, 4)


# ------------------------------------------------------------------ hf.py: Mixtral export
@pytest.mark.timeout(120)
def test_mixtral_export_gives_transformers_the_same_logits(tmp_path, monkeypatch):
    """A tiny ptd MoE (4 experts, top 2) saved as a Hugging Face folder: transformers'
    MixtralForCausalLM reads it (router, every expert) and gives ptd's logits."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from helpers import hf_logits, ptd_logits
    from ptd.runtime.checkpoint import hf
    from ptd.runtime.model.init import materialize
    from ptd.runtime.model.transformer import build_model
    from ptd.specs import load_model
    spec = load_model({"preset": "tiny", "n_experts": 4, "top_k": 2})
    state = {k: v.detach().clone()
             for k, v in materialize(build_model(spec), "cpu", seed=3).state_dict().items()}
    hf.save_folder(state, spec, tmp_path / "moe")
    tokens = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(2))
    name, theirs = hf_logits(tmp_path / "moe", tokens)
    assert name == "MixtralForCausalLM"
    ours = ptd_logits(spec, state, tokens)
    assert (ours - theirs).abs().max().item() <= 1e-4 * ours.abs().max().item()


# ------------------------------------------------------------------ hf.py: read_config
@pytest.mark.parametrize("attention_bias,mlp_bias", [(True, False), (False, True)])
def test_llama_biases_that_differ_are_refused(tmp_path, attention_bias, mlp_bias):
    # ptd has one bias flag for attention and MLP: a folder with only one of them is refused,
    # whichever it is
    from ptd.runtime.checkpoint.hf import read_config
    d = folder_with(tmp_path, {**LLAMA, "attention_bias": attention_bias, "mlp_bias": mlp_bias})
    with pytest.raises(PtdError, match="attention_bias and mlp_bias differ"):
        read_config(d)


@pytest.mark.parametrize("bias", [True, False])
def test_llama_biases_that_agree_are_read(tmp_path, bias):
    from ptd.runtime.checkpoint.hf import read_config
    spec, _ = read_config(folder_with(tmp_path, {**LLAMA, "attention_bias": bias, "mlp_bias": bias}))
    assert spec.bias is bias


# ------------------------------------------------------------------ restore.py
def test_no_usable_names_the_newest_and_counts_the_older():
    from ptd.runtime.checkpoint.restore import no_usable
    assert no_usable("ck", []) == "resume: no checkpoint in ck"
    assert no_usable("ck", ["step_3: bad"]) == (
        "resume: no usable checkpoint in ck; newest refused: step_3: bad")
    # three refused: the newest named, the 2 others counted
    assert no_usable("ck", ["step_9: a", "step_6: b", "step_3: c"]) == (
        "resume: no usable checkpoint in ck; newest refused: step_9: a (and 2 older refused)")


def test_precheck_of_a_relative_resume_path_looks_there(tmp_path, monkeypatch):
    # resume = "ckpts" (relative, an existing folder holding one step folder without a
    # manifest) is the folder to look in, not the run's own checkpoint folder: the refusal
    # names its candidate. ("ckpts" sorts after "auto": only == "auto" means auto.)
    from ptd.runtime.checkpoint.restore import precheck
    from ptd.specs.config import TrainConfig
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpts" / "step_00000003").mkdir(parents=True)
    cfg = TrainConfig().replace(resume="ckpts", out=str(tmp_path / "run"))
    with pytest.raises(PtdError) as e:
        precheck(cfg)
    assert str(e.value).startswith("resume: no usable checkpoint in ckpts; newest refused: step_00000003: ")
    assert Path("ckpts").is_dir()

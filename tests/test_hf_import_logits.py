"""The Hugging Face *import* (``--init-from``: ``hf.read_folder``) checked
against transformers' own logits, on random weights that transformers initialised and
saved itself -- not against ptd's own export (which a transposed ``wo`` in both directions
would pass). Llama (RMSNorm, RoPE, SwiGLU, grouped-query attention, untied head) and GPT-2
(LayerNorm, learned positions, GELU, biases, tied head)."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from ptd.runtime.checkpoint import hf  # noqa: E402
from ptd.runtime.model.transformer import build_model  # noqa: E402
from ptd.specs import load_model  # noqa: E402


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def _ours(folder, tokens):
    spec = load_model(str(folder))  # the model comes from config.json, as --init-from does
    state = hf.read_folder(folder, spec)
    model = build_model(spec, "cpu")
    model.load_state_dict(state, strict=True)
    model.eval()
    with torch.no_grad():
        return model(tokens)


def _theirs(model, tokens):
    model.eval()
    with torch.no_grad():
        return model(tokens).logits


def _check(model, folder):
    model.save_pretrained(folder, safe_serialization=True)
    tokens = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(3))
    theirs, ours = _theirs(model, tokens), _ours(folder, tokens)
    assert ours.shape == theirs.shape
    # fp32 on both sides; the kernels differ (fused vs unfused attention): ~1e-6 here
    assert (ours - theirs).abs().max().item() <= 1e-4
    # and the check bites: the output projection transposed gives other logits
    spec = load_model(str(folder))
    state = hf.read_folder(folder, spec)
    key = next(k for k in state if k.endswith(("wo.weight", "attention.wo.weight")))
    state[key] = state[key].t().contiguous()
    bad = build_model(spec, "cpu")
    bad.load_state_dict(state)
    with torch.no_grad():
        assert (bad(tokens) - theirs).abs().max().item() > 1e-2


@pytest.mark.timeout(120)
def test_llama_import_matches_transformers_logits(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=8,
                                   num_key_value_heads=4, max_position_embeddings=64,
                                   rms_norm_eps=1e-5, tie_word_embeddings=False)
    _check(transformers.LlamaForCausalLM(cfg).float(), tmp_path / "llama")


@pytest.mark.timeout(120)
def test_gpt2_import_matches_transformers_logits(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    _check(transformers.GPT2LMHeadModel(cfg).float(), tmp_path / "gpt2")

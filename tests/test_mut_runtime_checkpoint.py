"""Checkpoint rules the sampled mutation run of runtime/checkpoint left untested (docs/testing.md,
"runtime/parallel and runtime/checkpoint, sampled"). Expected values follow from the file
formats and the documented rules, worked by hand in the comments."""

import json
import struct

import pytest

from ptd.errors import PtdError
from ptd.runtime.checkpoint.hf import read_config
from ptd.runtime.checkpoint.weights_check import check_header

# A Llama config.json as transformers writes one, by hand: 4 layers of width 64, 8 heads
# of 8 (4 key/value heads), SwiGLU 128, vocabulary 256.
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256,
         "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8, "hidden_act": "silu",
         "max_position_embeddings": 256, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
         "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False}


def folder_with(tmp_path, cfg):
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("rope", [None, {"rope_type": "default", "rope_theta": 10000.0}])
def test_plain_rope_is_accepted(tmp_path, rope):
    cfg = dict(LLAMA, **({"rope_parameters": rope} if rope else {}))
    spec, _ = read_config(folder_with(tmp_path, cfg))
    assert spec.vocab_size == 256


# transformers >= 5 states scaling in rope_parameters (rope_scaling absent): a "llama3" or
# "linear" rope_type is a scaled RoPE, which ptd's model does not implement.
@pytest.mark.parametrize("rope_type", ["llama3", "linear"])
def test_scaled_rope_in_rope_parameters_is_refused(tmp_path, rope_type):
    cfg = dict(LLAMA, rope_parameters={"rope_type": rope_type, "rope_theta": 10000.0, "factor": 8.0})
    with pytest.raises(PtdError, match="RoPE scaling is not implemented"):
        read_config(folder_with(tmp_path, cfg))


def test_padded_safetensors_names_both_sizes(tmp_path):
    # one F32 tensor of shape [2]: 8 bytes of data at offsets 0..8. The header is the JSON
    # below (n bytes); the file is 8 (length field) + n + 8 (data) + 3 (padding) bytes, and
    # the header describes 8 + n + 8 of them.
    h = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    n = len(h)
    p = tmp_path / "model.safetensors"
    p.write_bytes(struct.pack("<Q", n) + h + bytes(8) + bytes(3))
    with pytest.raises(PtdError) as e:
        check_header(p)
    assert f"the file has {8 + n + 8 + 3} bytes, its header describes {8 + n + 8} " in str(e.value)


def test_mixtral_export_has_no_router_jitter():
    # ptd's router adds no noise to its logits, so an exported Mixtral config must not ask
    # transformers for any (router_jitter_noise multiplies the logits by U(1-j, 1+j) in
    # training: only j = 0 is ptd's router); experts and top-k are the model's own.
    from ptd.runtime.checkpoint.hf import hf_config
    from ptd.specs import load_model
    cfg = hf_config(load_model({"preset": "tiny", "n_experts": 4, "top_k": 2}))
    assert cfg["model_type"] == "mixtral"
    assert cfg["router_jitter_noise"] == 0.0
    assert (cfg["num_local_experts"], cfg["num_experts_per_tok"]) == (4, 2)


# --- survivors of the sampled run named in docs/testing.md (state.py:82, restore.py:231) ---

def _two_layer():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))


def test_resume_keeps_the_runs_hyperparameters_and_loads_the_states():
    # TrainState.load's rule (its docstring): the optimizer's moments come from the
    # checkpoint, its hyperparameters stay the run's config. The saved run used lr 0.1,
    # weight decay 0.0; the resuming run is configured with lr 0.5, weight decay 0.25.
    import torch
    from ptd.runtime.checkpoint.state import TrainState
    saved_model = _two_layer()
    saved_opt = torch.optim.AdamW(saved_model.parameters(), lr=0.1, weight_decay=0.0)
    saved_model(torch.ones(4, 3)).sum().backward()
    saved_opt.step()
    loaded = TrainState(saved_model, saved_opt).state_dict()

    model = _two_layer()
    opt = torch.optim.AdamW(model.parameters(), lr=0.5, weight_decay=0.25)
    state = TrainState(model, opt)
    state.load(loaded, state.state_dicts())
    assert [(g["lr"], g["weight_decay"]) for g in opt.param_groups] == [(0.5, 0.25)]
    # the moments are the saved ones: one step, exp_avg = (1 - 0.9) * grad
    for p, q in zip(model.parameters(), saved_model.parameters()):
        assert torch.equal(opt.state[p]["exp_avg"], 0.1 * q.grad)
        assert torch.equal(p, q)


@pytest.mark.parametrize("saved_rows,swapped", [(10, True), (20, True), (16, False)])
def test_vocab_tensor_saved_with_another_padding_is_swapped(tmp_path, saved_rows, swapped):
    # _vocab_repadding's rule: a vocabulary tensor whose saved shape differs from the run's
    # in its rows only (fewer rows: a smaller padding; more: a larger one) is swapped for a
    # zero tensor of the saved shape; an equal shape is left to DCP.
    import types
    import torch
    import torch.distributed.checkpoint as dcp
    from ptd.runtime.checkpoint.restore import _vocab_repadding
    path = tmp_path / "ckpt"
    dcp.save({"model": {"tok_embeddings.weight": torch.ones(saved_rows, 4)}},
             checkpoint_id=str(path), no_dist=True)
    mine = torch.full((16, 4), 7.0)
    target = {"model": {"tok_embeddings.weight": mine}, "optim": {}}
    swaps = _vocab_repadding(target, types.SimpleNamespace(path=path))
    if swapped:
        assert [(s, k, t is mine) for s, k, t in swaps] == [("model", "tok_embeddings.weight", True)]
        assert torch.equal(target["model"]["tok_embeddings.weight"], torch.zeros(saved_rows, 4))
    else:
        assert swaps == []
        assert target["model"]["tok_embeddings.weight"] is mine

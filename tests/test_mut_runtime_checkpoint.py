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

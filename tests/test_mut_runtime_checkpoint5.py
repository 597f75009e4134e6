"""runtime/checkpoint: single-process tests for the real survivors of the fresh sample of
seed 20261208 (docs/testing.md, seventh session). Expected values by hand."""

from __future__ import annotations

import pytest
import torch

from ptd.errors import PtdError
from ptd.runtime.checkpoint import hf, store
from ptd.runtime.checkpoint.restore import expected_params
from ptd.specs import get_preset, load_model


def test_prune_keeps_the_highest_step_not_the_last_name(tmp_path):
    # step_name pads to 8 digits, so step 10**8 is "step_100000000", which sorts before
    # "step_99999999" as a name; prune must order by the step number: keep=1 keeps 10**8
    # and deletes 99,999,999 (and a leftover temporary folder).
    old = tmp_path / store.step_name(99_999_999)
    new = tmp_path / store.step_name(100_000_000)
    assert (old.name, new.name) == ("step_99999999", "step_100000000")
    tmp = tmp_path / (store.TMP_PREFIX + store.step_name(100_000_001))
    for d in (old, new, tmp):
        d.mkdir()
    for d in (old, new):
        (d / store.MARKER).write_text("")
    deleted = store.prune(tmp_path, keep=1)
    assert sorted(p.name for p in deleted) == [tmp.name, old.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_100000000"]


def test_mixtral_export_does_not_ask_for_the_router_logits():
    # Mixtral's own config.json has output_router_logits = false: with true, transformers
    # returns every layer's router logits from each forward and adds router_aux_loss_coef
    # times its load-balancing loss to the loss it computes from labels. The exported
    # config gives the coefficient (ptd's) but leaves the switch off.
    spec = load_model({"preset": "tiny", "n_experts": 4, "top_k": 2})
    cfg = hf.hf_config(spec)
    assert cfg["output_router_logits"] is False
    assert cfg["router_aux_loss_coef"] == spec.aux_loss_coef


def test_a_weight_larger_than_the_model_is_refused(tmp_path):
    # tiny: hidden 64; a down_proj with one row more, (65, ffn), is not the (64, ffn) the run
    # expects. Tuples compare element by element, so (65, ffn) > (64, ffn): only `!=`
    # refuses a tensor larger than expected as well as a smaller one.
    from safetensors.torch import load_file, save_file
    spec = get_preset("tiny")
    g = torch.Generator().manual_seed(0)
    state = {k: torch.randn(s, generator=g) * 0.02 for k, s in expected_params(spec).items()}
    out = tmp_path / "hf"
    hf.save_folder(state, spec, out)
    t = load_file(str(out / "model.safetensors"))
    key = "model.layers.0.mlp.down_proj.weight"
    assert tuple(t[key].shape) == (spec.hidden, spec.ffn_hidden) == (64, spec.ffn_hidden)
    t[key] = torch.cat([t[key], torch.zeros(1, spec.ffn_hidden)]).contiguous()
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(PtdError, match=rf"has shape \(65, {spec.ffn_hidden}\), "
                                       rf"expected \(64, {spec.ffn_hidden}\)"):
        hf.read_folder(out, spec)

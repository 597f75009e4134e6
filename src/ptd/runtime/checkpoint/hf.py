"""Hugging Face checkpoints: export ptd weights as a ``transformers`` folder, import one.

A folder is ``config.json`` plus ``model.safetensors`` (or shards listed in
``model.safetensors.index.json`` when importing). Two architectures map one-to-one:

* **Llama** (``LlamaForCausalLM``): ptd's RMSNorm + RoPE + SwiGLU models. ``wq/wk/wv/wo`` ->
  ``self_attn.{q,k,v,o}_proj``, ``w1/w3/w2`` -> ``mlp.{gate,up,down}_proj``, norms ->
  ``input_layernorm``/``post_attention_layernorm``/``model.norm``, ``output`` -> ``lm_head``.
  ptd's RoPE already uses the rotate-half layout of these checkpoints, so q/k rows are not
  permuted. Biases map to ``attention_bias`` and ``mlp_bias`` (ptd has one ``bias`` flag:
  a folder where the two differ is refused).
* **GPT-2** (``GPT2LMHeadModel``): LayerNorm + learned positions + GELU(tanh) models with
  biases and ``n_kv_heads == n_heads``. q/k/v are fused into ``attn.c_attn`` and every
  linear weight is transposed (GPT-2's ``Conv1D`` stores ``(in, out)``).

* **Mixtral** (``MixtralForCausalLM``, export only): Llama-shaped mixture-of-experts models
  without biases or shared experts. Written in the per-expert layout of the published
  Mixtral checkpoints (``block_sparse_moe.gate`` and ``block_sparse_moe.experts.{e}.w1/w3/w2``,
  ``nn.Linear`` ``(out, in)``: ptd's stacked ``(E, in, out)`` weights transposed), which
  ``transformers`` converts on load. Its router takes the top-k of the softmax over all
  experts and renormalises them: the softmax over the chosen logits, as ptd's.

Anything else (mixture of experts with biases or shared experts, a GELU model with RMSNorm or RoPE, SwiGLU with
LayerNorm, GPT-2 without biases, RoPE scaling) is refused with the reason: there is no
``transformers`` class with exactly that function. Weights are written in fp32.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ...errors import PtdError
from ...specs import ModelSpec
from ..model.transformer import fit_vocab_rows, is_vocab_tensor


# ----------------------------------------------------------------- architecture
def architecture(spec: ModelSpec) -> str:
    """``llama`` or ``gpt2``, or :class:`PtdError` saying why neither fits."""
    if spec.is_moe:
        if spec.bias or spec.n_shared_experts or spec.mlp != "swiglu" or spec.norm != "rmsnorm" \
                or spec.position != "rope":
            raise PtdError(f"{spec.name}: only Mixtral-shaped mixture-of-experts models (SwiGLU, "
                           f"RMSNorm, RoPE, no biases, no shared experts) map to a Hugging Face class")
        return "mixtral"
    if spec.mlp == "swiglu" and spec.norm == "rmsnorm" and spec.position == "rope":
        return "llama"
    if spec.mlp == "gelu" and spec.norm == "layernorm" and spec.position == "learned":
        if not spec.bias:
            raise PtdError(f"{spec.name}: a GPT-2 style model without biases has no Hugging Face "
                           f"class (GPT2LMHeadModel always has biases)")
        if spec.n_kv_heads != spec.n_heads or spec.head_dim * spec.n_heads != spec.hidden:
            raise PtdError(f"{spec.name}: GPT2LMHeadModel needs n_kv_heads == n_heads and "
                           f"head_dim * n_heads == hidden")
        return "gpt2"
    raise PtdError(f"{spec.name}: no Hugging Face class has mlp={spec.mlp}, norm={spec.norm}, "
                   f"position={spec.position} (export supports Llama: swiglu+rmsnorm+rope, and "
                   f"GPT-2: gelu+layernorm+learned)")


def hf_config(spec: ModelSpec) -> dict[str, Any]:
    arch = architecture(spec)
    if arch == "mixtral":
        llama = hf_config(spec.replace(n_experts=0, top_k=0))
        for k in ("attention_bias", "mlp_bias"):
            llama.pop(k)
        return llama | {
            "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
            "num_local_experts": spec.n_experts, "num_experts_per_tok": spec.top_k,
            "router_aux_loss_coef": spec.aux_loss_coef, "output_router_logits": False,
            "router_jitter_noise": 0.0, "sliding_window": None}
    if arch == "llama":
        return {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": spec.vocab_size, "hidden_size": spec.hidden,
            "intermediate_size": spec.ffn_hidden, "num_hidden_layers": spec.n_layers,
            "num_attention_heads": spec.n_heads, "num_key_value_heads": spec.n_kv_heads,
            "head_dim": spec.head_dim, "hidden_act": "silu",
            "max_position_embeddings": spec.max_seq_len, "rms_norm_eps": spec.norm_eps,
            "rope_theta": spec.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta},
            "rope_scaling": None, "attention_bias": spec.bias, "mlp_bias": spec.bias,
            "attention_dropout": spec.dropout, "tie_word_embeddings": spec.tied_embeddings,
            "initializer_range": spec.init_std, "torch_dtype": "float32", "dtype": "float32",
            "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "use_cache": True,
        }
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": spec.vocab_size, "n_embd": spec.hidden, "n_layer": spec.n_layers,
        "n_head": spec.n_heads, "n_inner": spec.ffn_hidden, "n_positions": spec.max_seq_len,
        "n_ctx": spec.max_seq_len, "layer_norm_epsilon": spec.norm_eps,
        "activation_function": "gelu_new", "resid_pdrop": spec.dropout, "embd_pdrop": spec.dropout,
        "attn_pdrop": spec.dropout, "scale_attn_weights": True,
        "tie_word_embeddings": spec.tied_embeddings, "initializer_range": spec.init_std,
        "torch_dtype": "float32", "dtype": "float32", "bos_token_id": None, "eos_token_id": None,
        "use_cache": True,
    }


# ----------------------------------------------------------------- name mapping
_LLAMA_BLOCK = {
    "attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj", "attention.wo": "self_attn.o_proj",
    "feed_forward.w1": "mlp.gate_proj", "feed_forward.w3": "mlp.up_proj",
    "feed_forward.w2": "mlp.down_proj",
    "attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}


def to_hf(state: dict[str, torch.Tensor], spec: ModelSpec) -> dict[str, torch.Tensor]:
    """ptd parameter names -> the Hugging Face layout of :func:`architecture`. The
    vocabulary's padding rows (:meth:`ModelSpec.padded_vocab`) are left out."""
    arch = architecture(spec)
    state = {k: v[:spec.vocab_size] if is_vocab_tensor(k) else v for k, v in state.items()}
    out: dict[str, torch.Tensor] = {}
    if arch == "mixtral":
        out = to_hf({k: v for k, v in state.items() if ".feed_forward." not in k},
                    spec.replace(n_experts=0, top_k=0))
        for i in range(spec.n_layers):
            p, h = f"layers.{i}.feed_forward.", f"model.layers.{i}.block_sparse_moe."
            out[h + "gate.weight"] = state[p + "router.weight"]
            for e in range(spec.n_experts):
                for w in ("w1", "w2", "w3"):
                    out[h + f"experts.{e}.{w}.weight"] = state[p + f"experts.{w}"][e].t()
    elif arch == "llama":
        out["model.embed_tokens.weight"] = state["tok_embeddings.weight"]
        out["model.norm.weight"] = state["norm.weight"]
        if not spec.tied_embeddings:
            out["lm_head.weight"] = state["output.weight"]
        for i in range(spec.n_layers):
            for ours, theirs in _LLAMA_BLOCK.items():
                for leaf in ("weight", "bias"):
                    key = f"layers.{i}.{ours}.{leaf}"
                    if key in state:
                        out[f"model.layers.{i}.{theirs}.{leaf}"] = state[key]
    else:
        t = "transformer."
        out[t + "wte.weight"] = state["tok_embeddings.weight"]
        out[t + "wpe.weight"] = state["pos_embeddings.weight"]
        out[t + "ln_f.weight"], out[t + "ln_f.bias"] = state["norm.weight"], state["norm.bias"]
        if not spec.tied_embeddings:
            out["lm_head.weight"] = state["output.weight"]
        for i in range(spec.n_layers):
            p, h = f"layers.{i}.", f"{t}h.{i}."
            for ours, theirs in (("attention_norm", "ln_1"), ("ffn_norm", "ln_2")):
                out[h + theirs + ".weight"] = state[p + ours + ".weight"]
                out[h + theirs + ".bias"] = state[p + ours + ".bias"]
            qkv = [p + f"attention.{w}" for w in ("wq", "wk", "wv")]
            out[h + "attn.c_attn.weight"] = torch.cat([state[k + ".weight"] for k in qkv], 0).t()
            out[h + "attn.c_attn.bias"] = torch.cat([state[k + ".bias"] for k in qkv], 0)
            for ours, theirs in (("attention.wo", "attn.c_proj"), ("feed_forward.w1", "mlp.c_fc"),
                                 ("feed_forward.w2", "mlp.c_proj")):
                out[h + theirs + ".weight"] = state[p + ours + ".weight"].t()
                out[h + theirs + ".bias"] = state[p + ours + ".bias"]
    return {k: v.detach().to(torch.float32).contiguous() for k, v in out.items()}


def from_hf(tensors: dict[str, torch.Tensor], spec: ModelSpec) -> dict[str, torch.Tensor]:
    """The inverse of :func:`to_hf` (``transformer.``/``model.`` prefixes optional)."""
    arch = architecture(spec)
    out: dict[str, torch.Tensor] = {}

    def get(*names: str) -> torch.Tensor:
        for n in names:
            if n in tensors:
                return tensors[n]
        raise PtdError(f"Hugging Face weights lack {names[0]!r}")

    if arch == "llama":
        out["tok_embeddings.weight"] = get("model.embed_tokens.weight", "embed_tokens.weight")
        out["norm.weight"] = get("model.norm.weight", "norm.weight")
        if not spec.tied_embeddings:
            out["output.weight"] = get("lm_head.weight")
        for i in range(spec.n_layers):
            for ours, theirs in _LLAMA_BLOCK.items():
                leaves = ("weight", "bias") if spec.bias and "norm" not in ours else ("weight",)
                for leaf in leaves:
                    out[f"layers.{i}.{ours}.{leaf}"] = get(f"model.layers.{i}.{theirs}.{leaf}",
                                                           f"layers.{i}.{theirs}.{leaf}")
    else:
        def g(name: str) -> torch.Tensor:
            return get("transformer." + name, name)
        out["tok_embeddings.weight"] = g("wte.weight")
        out["pos_embeddings.weight"] = g("wpe.weight")
        out["norm.weight"], out["norm.bias"] = g("ln_f.weight"), g("ln_f.bias")
        if not spec.tied_embeddings:
            out["output.weight"] = get("lm_head.weight")
        q, kv = spec.q_dim, spec.kv_dim
        for i in range(spec.n_layers):
            p, h = f"layers.{i}.", f"h.{i}."
            for ours, theirs in (("attention_norm", "ln_1"), ("ffn_norm", "ln_2")):
                out[p + ours + ".weight"] = g(h + theirs + ".weight")
                out[p + ours + ".bias"] = g(h + theirs + ".bias")
            w, b = g(h + "attn.c_attn.weight"), g(h + "attn.c_attn.bias")
            # fused q, k, v: checked whole, since the slices below would drop extra columns
            want = (spec.hidden, q + 2 * kv)
            if tuple(w.shape) != want or tuple(b.shape) != want[1:]:
                raise PtdError(f"Hugging Face weights: {h}attn.c_attn has shape "
                               f"{tuple(w.shape)} (bias {tuple(b.shape)}), expected {want} "
                               f"(bias {want[1:]})")
            w = w.t()
            for name, lo, hi in (("wq", 0, q), ("wk", q, q + kv), ("wv", q + kv, q + 2 * kv)):
                out[p + f"attention.{name}.weight"] = w[lo:hi]
                out[p + f"attention.{name}.bias"] = b[lo:hi]
            for ours, theirs in (("attention.wo", "attn.c_proj"), ("feed_forward.w1", "mlp.c_fc"),
                                 ("feed_forward.w2", "mlp.c_proj")):
                out[p + ours + ".weight"] = g(h + theirs + ".weight").t()
                out[p + ours + ".bias"] = g(h + theirs + ".bias")
    if spec.tied_embeddings:
        out["output.weight"] = out["tok_embeddings.weight"]
    return {k: v.to(torch.float32).contiguous() for k, v in out.items()}


# ----------------------------------------------------------------- folders
def save_folder(state: dict[str, torch.Tensor], spec: ModelSpec, out: Path,
                provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``config.json`` and ``model.safetensors``; returns the config."""
    from safetensors.torch import save_file
    config = hf_config(spec)
    tensors = to_hf(state, spec)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if provenance:
        (out / "ptd_export.json").write_text(json.dumps(provenance, indent=2) + "\n")
    return config


def read_config(folder: str | Path) -> tuple[ModelSpec, dict[str, Any]]:
    """The :class:`ModelSpec` of a Hugging Face folder, or :class:`PtdError`."""
    from ...specs.model import _from_hf_config
    folder = Path(folder)
    path = folder / "config.json"
    if not folder.is_dir():
        raise PtdError(f"init_from: {folder} is not a folder")
    if not path.is_file():
        raise PtdError(f"init_from: {folder} has no config.json")
    try:
        cfg = json.loads(path.read_text())
    except ValueError as e:
        raise PtdError(f"init_from: cannot parse {path}: {e}") from None
    if not isinstance(cfg, dict):
        raise PtdError(f"init_from: {path} is not a JSON object")
    kind = cfg.get("model_type")
    if kind not in ("llama", "gpt2"):
        raise PtdError(f"init_from: model_type {kind!r} is not supported (llama, gpt2)")
    if kind == "llama":
        if cfg.get("rope_scaling") or (cfg.get("rope_parameters") or {}).get("rope_type", "default") != "default":
            raise PtdError("init_from: RoPE scaling is not implemented in ptd's model")
        if cfg.get("hidden_act", "silu") != "silu":
            raise PtdError(f"init_from: hidden_act {cfg.get('hidden_act')!r} (ptd's Llama uses silu)")
        if bool(cfg.get("attention_bias", False)) != bool(cfg.get("mlp_bias", False)):
            raise PtdError("init_from: attention_bias and mlp_bias differ (ptd has one bias flag)")
    if kind == "gpt2" and cfg.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise PtdError(f"init_from: activation {cfg.get('activation_function')!r} (ptd uses tanh GELU)")
    spec = _from_hf_config(cfg, folder.name)
    architecture(spec)
    return spec, cfg


def weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError) as e:
            raise PtdError(f"init_from: bad {index.name}: {e}") from None
        files = [folder / n for n in names]
    else:
        files = [folder / "model.safetensors"]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise PtdError(f"init_from: {folder} lacks {', '.join(missing)}")
    return files


def check_matches(hf_spec: ModelSpec, run: ModelSpec, seq_len: int, where: str) -> None:
    from .store import model_differences
    diffs = model_differences(hf_spec, run)
    if diffs:
        raise PtdError(f"init_from: {where} holds another model than this run's "
                       f"{run.name} ({', '.join(diffs)})")
    if seq_len > hf_spec.max_seq_len:
        raise PtdError(f"init_from: seq_len {seq_len} exceeds {where}'s max positions {hf_spec.max_seq_len}")


def precheck(folder: str | Path, run: ModelSpec, seq_len: int) -> None:
    """Refuse (one line) before any worker starts: no folder, no weights, another model."""
    spec, _ = read_config(folder)
    from .weights_check import check_header
    for f in weight_files(Path(folder)):
        check_header(f)  # a damaged file is refused before any worker starts
    check_matches(spec, run, seq_len, str(folder))
    read_folder(folder, run)  # shapes, dtypes and finite values of every tensor


def read_folder(folder: str | Path, run: ModelSpec) -> dict[str, torch.Tensor]:
    """ptd-named full tensors for ``run`` from a Hugging Face folder."""
    from safetensors.torch import load_file
    folder = Path(folder)
    spec, _ = read_config(folder)
    check_matches(spec, run, 1, str(folder))
    tensors: dict[str, torch.Tensor] = {}
    for f in weight_files(folder):
        try:
            tensors.update(load_file(str(f)))
        except Exception as e:  # noqa: BLE001 - a damaged file is bad input
            raise PtdError(f"init_from: cannot read {f}: {str(e)[:120]}") from None
    from .weights_check import check_tensors
    check_tensors(tensors, str(folder))
    state = from_hf(tensors, run)
    from .restore import expected_params
    for name, shape in expected_params(run).items():
        if is_vocab_tensor(name):  # the folder's rows are the real vocabulary, unpadded
            shape = (run.vocab_size, *shape[1:])
        if tuple(state[name].shape) != shape:
            raise PtdError(f"init_from: {name} has shape {tuple(state[name].shape)}, expected {shape}")
    return state


@torch.no_grad()
def load_into(model: torch.nn.Module | list[torch.nn.Module], folder: str | Path, run: ModelSpec) -> int:
    """Copy a Hugging Face folder's weights into a (possibly sharded, possibly partial)
    model: each rank reads the full tensors and keeps its shard (``set_model_state_dict``
    with ``full_state_dict``). Returns the number of tensors loaded."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    state = read_folder(folder, run)
    n = 0
    for part in (model if isinstance(model, list) else [model]):
        from torch.distributed.checkpoint.state_dict import get_model_state_dict
        mine = get_model_state_dict(part)
        sub = {k: fit_vocab_rows(state[k], v.shape[0], run.vocab_size) if is_vocab_tensor(k) else state[k]
               for k, v in mine.items()}
        set_model_state_dict(part, sub, options=StateDictOptions(full_state_dict=True))
        n += len(sub)
    return n


def export(ckpt_path: Path, out: Path) -> tuple[dict[str, Any], int, int]:
    """Consolidate the model of a checkpoint (any layout) into a Hugging Face folder in this
    process. Returns ``(config, tensors, parameters)``."""
    import warnings

    import torch.distributed.checkpoint as dcp

    from . import store
    from .restore import expected_params
    ckpt = store.read(ckpt_path)
    spec = ckpt.config.model
    architecture(spec)
    shapes = expected_params(spec, ckpt.config.plan.tp_split)
    target = {"model": {k: torch.empty(s, dtype=torch.float32) for k, s in shapes.items()}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ... single process"
        dcp.load(target, checkpoint_id=str(ckpt.path), no_dist=True)
    state = dict(target["model"])
    if spec.tied_embeddings:
        state["output.weight"] = state["tok_embeddings.weight"]
    provenance = {"source": str(ckpt.path), "step": ckpt.step, "model": spec.to_dict(),
                  "tokens": ckpt.manifest.get("tokens")}
    config = save_folder(state, spec, out, provenance)
    n_params = sum(t[:spec.vocab_size].numel() if is_vocab_tensor(k) else t.numel()
                   for k, t in target["model"].items())
    return config, len(to_hf(state, spec)), n_params

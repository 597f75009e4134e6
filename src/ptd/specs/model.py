"""ModelSpec: the shape of a decoder-only transformer, and nothing else.

The same spec builds the runtime model (``ptd.runtime.model.transformer``) and feeds the cost model
(``ptd.cost``), so the parameter count here is exact: it is tested against published counts
and against the runtime model's ``numel()``.

Parameter layout (what :meth:`ModelSpec.param_counts` counts):

* token embedding ``V*h``; learned positions ``S_max*h`` when ``position == "learned"``;
* per layer: Q ``h*H*d``, K and V ``h*K*d`` each, output ``H*d*h`` (biases when ``bias``);
  MLP ``2*h*F`` for GELU, ``3*h*F`` for SwiGLU (times ``n_experts`` plus a ``h*E`` router
  for mixture-of-experts); two norms of ``h`` (``2h`` for LayerNorm, which has a bias);
* final norm; output layer ``V*h`` unless tied to the embedding.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..errors import PtdError
from .typecheck import check_instance, read_text_file

MODEL_CAPS = {"n_layers": 100_000, "hidden": 2**20, "n_heads": 2**16, "n_kv_heads": 2**16,
              "ffn_hidden": 2**22, "vocab_size": 2**24, "max_seq_len": 2**27, "head_dim": 2**16,
              "n_experts": 2**16, "top_k": 2**16, "vocab_multiple": 2**16}
"""Sizes no real model reaches (the largest published: ~200 layers, hidden 25,600, vocab
~256k, 10M context): beyond them an input is a typo (``n_layers = 1000000000``) that would
otherwise exhaust memory in the cost model before any check on memory runs."""

MlpKind = Literal["gelu", "swiglu"]
NormKind = Literal["layernorm", "rmsnorm"]
PositionKind = Literal["rope", "learned"]


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer language model."""

    name: str
    """Preset or user name; only used for display."""
    n_layers: int
    """Number of transformer blocks (L)."""
    hidden: int
    """Model width (h)."""
    n_heads: int
    """Query heads (a)."""
    n_kv_heads: int
    """Key/value heads; fewer than ``n_heads`` is grouped-query attention (GQA)."""
    ffn_hidden: int
    """Inner width of the MLP (F); 4h for GPT, about 8h/3 for SwiGLU models."""
    vocab_size: int
    """Vocabulary size (V)."""
    max_seq_len: int
    """Longest sequence the model accepts (size of the learned position table)."""
    mlp: MlpKind = "swiglu"
    """``gelu``: two matrices (GPT); ``swiglu``: gate, up and down matrices (Llama)."""
    norm: NormKind = "rmsnorm"
    """``layernorm`` (weight and bias) or ``rmsnorm`` (weight only)."""
    position: PositionKind = "rope"
    """``rope``: rotary, no parameters; ``learned``: an absolute position table."""
    tied_embeddings: bool = False
    """Output layer shares the token-embedding matrix (GPT-2, GPT-3)."""
    bias: bool = False
    """Linear layers carry biases (GPT-2/3 do, Llama does not)."""
    head_dim: int = 0
    """Per-head width (d); 0 means ``hidden // n_heads``."""
    norm_eps: float = 1e-5
    """Epsilon of every norm."""
    rope_theta: float = 10000.0
    """RoPE base frequency (only used with ``position == "rope"``)."""
    n_experts: int = 0
    """Mixture-of-experts: experts per MLP; 0 is a dense model."""
    top_k: int = 0
    """Mixture-of-experts: experts each token is routed to."""
    n_shared_experts: int = 0
    """Mixture-of-experts: experts every token also passes through (DeepSeek-MoE), each an
    MLP of ``ffn_hidden``; their outputs are added to the routed ones."""
    capacity_factor: float = 0.0
    """Mixture-of-experts: 0 is dropless; ``c > 0`` caps each expert at
    ``ceil(c * tokens * top_k / n_experts)`` of a micro-batch's assignments on a rank
    (GShard's per-group capacity); assignments past it are dropped and counted."""
    aux_loss_coef: float = 0.01
    """Mixture-of-experts: weight of the load-balancing loss (Switch Transformer, eq. 4)."""
    z_loss_coef: float = 0.001
    """Mixture-of-experts: weight of the router z-loss (ST-MoE, Zoph et al. 2022, eq. 5)."""
    dropout: float = 0.0
    """Dropout probability; changes activation memory (masks) and numerics."""
    init_std: float = 0.02
    """Standard deviation of the normal initialisation of weight matrices."""
    vocab_multiple: int = 128
    """The runtime pads the vocabulary to a multiple of ``vocab_multiple x tp`` (Megatron-LM's
    ``--make-vocab-size-divisible-by``, same default), so that any vocabulary splits evenly over
    tensor parallelism and the output GEMM has an aligned width. Padding rows start at zero,
    are never looked up, and their logits are masked to -inf: they receive no probability and
    no gradient, and exports and parameter counts leave them out. 1 pads to a multiple of tp
    only."""

    def __post_init__(self) -> None:
        if self.head_dim == 0 and all(isinstance(getattr(self, f), int) and not isinstance(
                getattr(self, f), bool) for f in ("hidden", "n_heads")):
            object.__setattr__(self, "head_dim", self.hidden // max(self.n_heads, 1))
        self.validate()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Raise :class:`PtdError` with one sentence when the shape is impossible."""
        check_instance(self, f"model {self.name}: ")
        for f, cap in MODEL_CAPS.items():
            if isinstance(getattr(self, f), int) and getattr(self, f) > cap:
                raise PtdError(f"model {self.name}: {f} = {getattr(self, f)} is beyond any real "
                               f"model (at most {cap})")
        for f in ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab_size",
                  "max_seq_len", "head_dim", "vocab_multiple"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise PtdError(f"model {self.name}: {f} must be a positive integer, got {v!r}")
        if self.mlp not in ("gelu", "swiglu"):
            raise PtdError(f"model {self.name}: mlp must be 'gelu' or 'swiglu', got {self.mlp!r}")
        if self.norm not in ("layernorm", "rmsnorm"):
            raise PtdError(f"model {self.name}: norm must be 'layernorm' or 'rmsnorm', got {self.norm!r}")
        if self.position not in ("rope", "learned"):
            raise PtdError(f"model {self.name}: position must be 'rope' or 'learned', got {self.position!r}")
        if self.n_heads % self.n_kv_heads:
            raise PtdError(f"model {self.name}: n_heads ({self.n_heads}) must be a multiple of "
                           f"n_kv_heads ({self.n_kv_heads})")
        if self.position == "rope" and self.head_dim % 2:
            raise PtdError(f"model {self.name}: rotary embeddings need an even head_dim, got {self.head_dim}")
        if self.n_experts < 0 or self.top_k < 0 or (self.n_experts > 0) != (self.top_k > 0):
            raise PtdError(f"model {self.name}: n_experts and top_k must both be 0 (dense) or both positive")
        if self.top_k > self.n_experts:
            raise PtdError(f"model {self.name}: top_k ({self.top_k}) exceeds n_experts ({self.n_experts})")
        if self.n_shared_experts < 0 or (self.n_shared_experts and not self.n_experts):
            raise PtdError(f"model {self.name}: n_shared_experts needs a mixture-of-experts model")
        if self.capacity_factor < 0 or self.aux_loss_coef < 0 or self.z_loss_coef < 0:
            raise PtdError(f"model {self.name}: capacity_factor, aux_loss_coef and z_loss_coef "
                           f"must not be negative (capacity_factor 0 is dropless)")
        if not 0.0 <= self.dropout < 1.0:
            raise PtdError(f"model {self.name}: dropout must be in [0, 1), got {self.dropout}")
        if not all(math.isfinite(v) and v > 0 for v in (self.norm_eps, self.rope_theta, self.init_std)):
            raise PtdError(f"model {self.name}: norm_eps, rope_theta and init_std must be positive")
        # beyond these the run would only train on noise (an epsilon that swamps the variance,
        # weights whose activations overflow, an auxiliary loss that outweighs the model's)
        for f, cap in (("norm_eps", 0.1), ("init_std", 1.0), ("rope_theta", 1e12),
                       ("aux_loss_coef", 10.0), ("z_loss_coef", 10.0)):
            if getattr(self, f) > cap:
                raise PtdError(f"model {self.name}: {f} = {getattr(self, f):g} is beyond any real "
                               f"model (at most {cap:g})")
        if self.capacity_factor and not self.n_experts:
            raise PtdError(f"model {self.name}: capacity_factor needs a mixture-of-experts model")
        if self.n_experts and self.capacity_factor > self.n_experts / self.top_k:
            # each expert takes a token at most once: at n_experts / top_k no token is dropped
            raise PtdError(f"model {self.name}: capacity_factor {self.capacity_factor:g} is past "
                           f"n_experts / top_k = {self.n_experts / self.top_k:g}, where no token "
                           "is dropped (0 means dropless)")

    # ------------------------------------------------------------- counting
    @property
    def q_dim(self) -> int:
        """Width of all query heads together (H*d)."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of all key (or value) heads together (K*d)."""
        return self.n_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    def expert_params(self) -> int:
        """Parameters of one MLP (one expert)."""
        h, f = self.hidden, self.ffn_hidden
        if self.mlp == "gelu":
            return 2 * h * f + ((f + h) if self.bias else 0)
        return 3 * h * f + ((2 * f + h) if self.bias else 0)

    def norm_params(self) -> int:
        return self.hidden * (2 if self.norm == "layernorm" else 1)

    def param_counts(self) -> dict[str, int]:
        """Exact parameter counts by part. ``layer`` is one transformer block."""
        h, v = self.hidden, self.vocab_size
        attn = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        if self.bias:
            attn += self.q_dim + 2 * self.kv_dim + h
        if self.is_moe:
            mlp = ((self.n_experts + self.n_shared_experts) * self.expert_params()
                   + h * self.n_experts)
        else:
            mlp = self.expert_params()
        counts = {
            "embedding": v * h,
            "position": self.max_seq_len * h if self.position == "learned" else 0,
            "attention": attn,
            "mlp": mlp,
            "layer_norms": 2 * self.norm_params(),
            "final_norm": self.norm_params(),
            "output": 0 if self.tied_embeddings else v * h,
        }
        counts["layer"] = counts["attention"] + counts["mlp"] + counts["layer_norms"]
        return counts

    def param_count(self) -> int:
        """Total parameters of the model, as the runtime allocates them less the vocabulary's
        padding rows (:meth:`padded_vocab`: zero, never used, not the model's)."""
        c = self.param_counts()
        return (c["embedding"] + c["position"] + self.n_layers * c["layer"] + c["final_norm"]
                + c["output"])

    def matmul_params_per_layer(self, active: bool = True) -> int:
        """Weights of one block that multiply every token (biases and norms excluded).

        With ``active`` and mixture-of-experts, only the ``top_k`` experts a token visits
        (plus the router) count: that is the work per token.
        """
        h = self.hidden
        attn = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        mult = 2 if self.mlp == "gelu" else 3
        one_mlp = mult * h * self.ffn_hidden
        if self.is_moe:
            routed = self.top_k if active else self.n_experts
            mlp = (routed + self.n_shared_experts) * one_mlp + h * self.n_experts
        else:
            mlp = one_mlp
        return attn + mlp

    def matmul_params(self, active: bool = True) -> int:
        """All weights used in a matmul per token: the blocks plus the output layer.

        The embedding lookup is a gather (no FLOPs); the output layer is a matmul whether or
        not it is tied to the embedding. This is the N of the 6N FLOP convention.
        """
        return self.n_layers * self.matmul_params_per_layer(active) + self.vocab_size * self.hidden

    def padded_vocab(self, tp: int = 1) -> int:
        """Rows of the embedding and output matrices the runtime allocates at tensor
        parallelism ``tp``: ``vocab_size`` rounded up to a multiple of ``vocab_multiple * tp``."""
        m = self.vocab_multiple * tp
        return -(-self.vocab_size // m) * m

    def padding_note(self, tp: int = 1) -> str | None:
        """One line saying how the vocabulary is padded at ``tp``, or None without padding."""
        rows = self.padded_vocab(tp)
        if rows == self.vocab_size:
            return None
        times = f" x tp {tp}" if tp > 1 else ""
        return (f"vocabulary: {self.vocab_size} padded to {rows} (a multiple of "
                f"{self.vocab_multiple}{times}; the {rows - self.vocab_size} padding rows are "
                f"masked out of the logits and left out of exports)")

    # --------------------------------------------------------------- helpers
    def replace(self, **changes: Any) -> "ModelSpec":
        """A copy with some fields changed (validated again)."""
        if "hidden" in changes or "n_heads" in changes:
            changes.setdefault("head_dim", 0)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------- presets
def _gpt2(name: str, layers: int, hidden: int, heads: int, seq: int = 1024,
          vocab: int = 50257) -> ModelSpec:
    return ModelSpec(name=name, n_layers=layers, hidden=hidden, n_heads=heads, n_kv_heads=heads,
                     ffn_hidden=4 * hidden, vocab_size=vocab, max_seq_len=seq, mlp="gelu",
                     norm="layernorm", position="learned", tied_embeddings=True, bias=True)


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int,
           seq: int, theta: float, eps: float) -> ModelSpec:
    return ModelSpec(name=name, n_layers=layers, hidden=hidden, n_heads=heads, n_kv_heads=kv,
                     ffn_hidden=ffn, vocab_size=vocab, max_seq_len=seq, rope_theta=theta,
                     norm_eps=eps)


PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        # GPT-2 (Radford et al. 2019): tied embeddings, learned positions, biases.
        _gpt2("gpt2", 12, 768, 12),
        _gpt2("gpt2-355m", 24, 1024, 16),
        _gpt2("gpt2-774m", 36, 1280, 20),
        _gpt2("gpt2-1.5b", 48, 1600, 25),
        # GPT-3 175B (Brown et al. 2020, Table 2.1).
        _gpt2("gpt3-175b", 96, 12288, 96, seq=2048),
        # Llama 2 (Touvron et al. 2023) and Llama 3 / 3.1 (Dubey et al. 2024), from the
        # published config.json files.
        _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, 1e4, 1e-5),
        _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096, 1e4, 1e-5),
        _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, 1e4, 1e-5),
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, 5e5, 1e-5),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, 5e5, 1e-5),
        _llama("llama3.1-405b", 126, 16384, 128, 8, 53248, 128256, 131072, 5e5, 1e-5),
        # Mixtral 8x7B (Jiang et al. 2024): 8 SwiGLU experts, 2 per token.
        dataclasses.replace(
            _llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 32768, 1e6, 1e-5),
            n_experts=8, top_k=2),
        # Tiny models for CPU work: byte-level vocabulary, small enough for 8 gloo workers on
        # 2 cores. heads/kv heads divisible by 4 and layers by 4 so that tp, pp and vpp up to
        # 4 (and pp*vpp = 4) are all valid layouts.
        ModelSpec(name="tiny", n_layers=4, hidden=64, n_heads=8, n_kv_heads=4, ffn_hidden=128,
                  vocab_size=256, max_seq_len=256),
        # Mixtral-shaped tiny model for CPU work on mixture-of-experts and expert
        # parallelism: 8 SwiGLU experts, 2 per token; 8 experts split over ep 1, 2, 4 or 8.
        ModelSpec(name="tiny-moe", n_layers=4, hidden=64, n_heads=8, n_kv_heads=4,
                  ffn_hidden=64, vocab_size=256, max_seq_len=256, n_experts=8, top_k=2),
        ModelSpec(name="small", n_layers=4, hidden=256, n_heads=8, n_kv_heads=4,
                  ffn_hidden=704, vocab_size=256, max_seq_len=512),
        ModelSpec(name="tiny-gpt", n_layers=4, hidden=64, n_heads=4, n_kv_heads=4,
                  ffn_hidden=256, vocab_size=256, max_seq_len=256, mlp="gelu",
                  norm="layernorm", position="learned", tied_embeddings=True, bias=True),
    ]
}


# --------------------------------------------------------------- loading
def _from_hf_config(cfg: dict[str, Any], name: str) -> ModelSpec:
    """Map a Hugging Face ``config.json`` (Llama/Mistral/Mixtral- or GPT-2-style keys)."""
    try:
        if "n_embd" in cfg or cfg.get("model_type") == "gpt2":
            hidden = cfg["n_embd"]
            return ModelSpec(
                name=name, n_layers=cfg["n_layer"], hidden=hidden, n_heads=cfg["n_head"],
                n_kv_heads=cfg["n_head"], ffn_hidden=cfg.get("n_inner") or 4 * hidden,
                vocab_size=cfg["vocab_size"], max_seq_len=cfg.get("n_positions", 1024),
                mlp="gelu", norm="layernorm", position="learned",
                tied_embeddings=cfg.get("tie_word_embeddings", True), bias=True,
                norm_eps=cfg.get("layer_norm_epsilon", 1e-5),
                dropout=float(cfg.get("resid_pdrop", 0.0)))
        heads = cfg["num_attention_heads"]
        rope = cfg.get("rope_parameters") or {}
        return ModelSpec(
            name=name, n_layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"],
            n_heads=heads, n_kv_heads=cfg.get("num_key_value_heads") or heads,
            ffn_hidden=cfg["intermediate_size"], vocab_size=cfg["vocab_size"],
            max_seq_len=cfg.get("max_position_embeddings", 4096),
            mlp="swiglu", norm="rmsnorm", position="rope",
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            bias=bool(cfg.get("attention_bias", False)),
            head_dim=cfg.get("head_dim") or 0,
            norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0))),
            n_experts=cfg.get("num_local_experts", 0) or 0,
            top_k=cfg.get("num_experts_per_tok", 0) if cfg.get("num_local_experts") else 0)
    except KeyError as e:
        raise PtdError(f"{name}: Hugging Face config lacks key {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:  # a value of the wrong type, e.g. "rope_theta": "x"
        raise PtdError(f"{name}: Hugging Face config has a value of the wrong type ({e})") from None


def _from_mapping(d: dict[str, Any], name: str) -> ModelSpec:
    """A ptd model table: either ``preset = "..."`` plus overrides, or every field."""
    d = dict(d)
    base = d.pop("preset", None)
    from .typecheck import from_table, refuse_unknown
    refuse_unknown(ModelSpec, d, name, "model")
    return from_table(ModelSpec, d, name, base, get_preset, "model")


def get_preset(name: str) -> ModelSpec:
    try:
        return PRESETS[name]
    except KeyError:
        raise PtdError(f"unknown model preset {name!r}; choose from {', '.join(PRESETS)}") from None


def load_model(ref: str | dict[str, Any] | ModelSpec) -> ModelSpec:
    """Resolve a preset name, a ``.toml`` file, a Hugging Face ``config.json`` (or a folder
    holding one), or an already-parsed table into a :class:`ModelSpec`."""
    if isinstance(ref, ModelSpec):
        return ref
    if isinstance(ref, dict):
        return _from_mapping(ref, str(ref.get("name", "custom")))
    if ref in PRESETS:
        return PRESETS[ref]
    if not ref.strip():  # (Path("") is the working folder: its config.json is not what was meant)
        return get_preset(ref)  # raises with the list of presets
    path = Path(ref)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix in (".toml", ".json") or path.exists():
        text = read_text_file(path, "model")
        try:
            if path.suffix == ".toml":
                data = tomllib.loads(text)
                return _from_mapping(data.get("model", data), path.stem)
            data = json.loads(text)
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
            raise PtdError(f"cannot parse {path}: {e}") from None
        if not isinstance(data, dict):
            raise PtdError(f"{path}: expected a JSON object")
        # a Hugging Face folder's name (``config.json`` given from inside it: the cwd's)
        name = (path.absolute().parent.name or "config") if path.name == "config.json" else path.stem
        if "n_layers" in data or "preset" in data:
            return _from_mapping(data, name)
        return _from_hf_config(data, name)
    return get_preset(ref)  # raises with the list of presets

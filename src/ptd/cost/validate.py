"""Hold the cost model against published training runs (``ptd validate``).

A cases file (schema: ``ptd/data/published_cases.yaml``, a copy of the team's
``shared/published/cases.yaml``) lists runs with the model, the hardware, the parallel plan
and what was measured. Each case is priced by :func:`ptd.cost.estimate.choose` and compared
with its published figure. **The cases are for validation only**: nothing here, nor anywhere
in ``ptd.cost``, recognises a case, a source or a model by name; every case is read by the
same general rules, stated below, and a case that cannot be priced is an error row with the
reason, never skipped.

**Rules for what a case leaves unsaid.**

* *Architecture.* The schema gives layers, hidden, heads, FFN width, vocabulary and the
  parameter count ``params_b``, not the block's kind. Of the candidates {GELU MLP with
  LayerNorm and learned positions (GPT), SwiGLU with RMSNorm and RoPE (Llama)} x {every
  key/value head count dividing ``heads``}, the one whose parameter count is nearest to
  ``params_b`` is used (optional fields ``mlp`` and ``kv_heads`` override it). Dropout is
  priced only where the optional ``dropout`` field states it (a probability), else none.
  A mixture of experts names ``experts`` and ``top_k`` (both, whole numbers); its plan may
  name ``ep`` (null: 1), priced as ptd's runtime places experts (:mod:`ptd.cost.moe`).
* *Hardware.* The ``gpu`` text names the preset (``H100`` -> ``h100-sxm``, ``A100`` ->
  ``a100-80g``, or ``a100-40g`` when it says 40GB); ``gpus_per_node`` sets the node size. A
  network rate in the text (``8x200Gb/s ... per node``, ``800Gbps inter-node``, ``400 Gb/s
  ... per GPU``) sets the inter-node bandwidth: per GPU when the text says so, otherwise per
  node (``N x rate`` summed), shared by the node's GPUs.
* *Plan.* ``zero``: a number, or a text starting with one, is that stage; a text naming a
  "distributed optimizer" is stage 1 (Megatron-LM's distributed optimizer shards optimizer
  states, ZeRO-1); otherwise 0. ``recompute``: ``full``, ``selective`` or ``none`` when the
  text starts with one of them, else unstated; ``selective (op)`` and ``selective (layer)``
  name which of torchtitan's policies ran (:data:`ptd.cost.compute.SELECTIVE`; otherwise the
  stack's). ``micro_batch``, ``vpp``, ``recompute``,
  ``sequence_parallel`` left null or unstated are chosen by the cost model as
  ``ptd estimate`` chooses them (the fastest that fits). ``cp`` (null: 1) is context
  parallelism as ptd prices it (:mod:`ptd.cost.context`: zig-zag chunks, K/V around a
  ring); ``tp x pp x dp x cp`` must be the case's GPUs. Precision: fp16 when the notes say
  fp16, else bf16 (the same peak on these GPUs).
* *Stack.* An optional ``stack`` field, else from the ``source`` text (or, when the source
  names no project, the ``notes``): a Megatron-LM paper or
  Megatron-DeepSpeed run of 2022 or earlier -> ``megatron-2021``; Megatron-LM / Megatron-Core
  later -> ``megatron-core`` where the source or notes name Megatron-Core, Transformer Engine,
  flash attention or one of the overlap options, or date it 2025 or later (or not at all);
  a Megatron-LM run of 2023-24 naming none of them ran Megatron-LM's defaults of that time,
  the 2021 kernels (local attention until 2024-04; no gradient-reduction overlap by default)
  -> ``megatron-2021``; torchtitan -> ``torchtitan``; DeepSpeed (Megatron-DeepSpeed
  included, checked first) -> ``deepspeed``, or ``deepspeed-2021`` when every year in the
  source is 2021 or earlier; otherwise ``ptd`` (PyTorch FSDP/DDP). Megatron-LM had no ZeRO
  stage before 2022, so a ``megatron-2021`` case of 2022 or earlier whose plan has a ZeRO
  stage takes the stack its notes name, if they name one. See :mod:`ptd.cost.stacks`.
* *Pipeline split.* Layers that the stages do not divide are split unevenly by cost (as
  Megatron-LM states first- and last-stage layer counts).
* *The published figure.* What was measured, where the case gives it: ``tokens_per_s`` (per
  GPU, compared with ptd's), else ``iter_time_s`` (the step time; the error is
  ``T_measured / T_predicted - 1``, positive when the model is too fast, like the rates').
  Otherwise a rate derived from the step time through the source's FLOP count: ``mfu``
  (compared with ptd's MFU), else ``hfu`` (ptd's HFU, recomputation counted) -- both over
  the case's ``peak_tflops`` where it gives one (the published figure's denominator; else
  the preset's peak) -- else
  ``tflops_per_gpu`` (ptd's hardware FLOP rate: for GPT-shaped models ptd's count is exactly
  Narayanan et al. 2021 eq. 3, the convention of the sources that give bare TFLOP/s). A FLOP
  rate compares step times only where the source counted FLOPs as ptd does; sources differ
  (torchtitan's MFU counts the embedding's parameters in ``6N``, ptd's does not: 6.5% more
  FLOPs for Llama 3 8B), which is why a measured time or throughput is preferred.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import PtdError
from ..specs.hardware import ClusterSpec, get_hardware_preset
from ..specs.model import ModelSpec
from ..specs.plan import ParallelPlan
from .estimate import FREE_KNOBS, Estimate, choose
from .stacks import STACKS, stack_options

SHIPPED = Path(__file__).resolve().parent.parent / "data" / "published_cases.yaml"
_REQUIRED = {"model": ("layers", "hidden", "heads", "ffn_hidden", "vocab", "seq_len"),
             "hardware": ("gpu", "gpus_total"),
             "plan": ("tp", "pp", "dp", "global_batch"),
             "measured": ()}
FIGURES = ("tokens_per_s", "iter_time_s", "mfu", "hfu", "tflops_per_gpu")
"""Published figures in the order compared: measurements first, then FLOP rates."""


@dataclass
class CaseResult:
    """One row of the validation table."""

    id: str
    source: str
    metric: str = ""
    """``tokens_per_s``, ``iter_time_s``, ``mfu``, ``hfu`` or ``tflops_per_gpu``: the
    published figure compared."""
    published: float | None = None
    predicted: float | None = None
    stack: str = ""
    plan: str = ""
    chosen: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    """Why the case could not be priced (empty when it was)."""

    @property
    def rel_error(self) -> float | None:
        """predicted / published - 1 for a rate, published / predicted - 1 for a step time
        (positive: the model is optimistic)."""
        if self.published is None or self.predicted is None:
            return None
        if self.metric == "iter_time_s":
            return self.published / self.predicted - 1.0
        return self.predicted / self.published - 1.0

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "source": self.source, "stack": self.stack, "plan": self.plan,
                "chosen": self.chosen, "metric": self.metric, "published": self.published,
                "predicted": self.predicted, "rel_error": self.rel_error,
                "error": self.error or None}


def load_cases(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The cases of a file (default: the shipped copy), checked for the fields the rules
    need; a malformed file is one PtdError naming the problem."""
    import yaml

    p = Path(path) if path else SHIPPED
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise PtdError(f"cases file {str(p)!r}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise PtdError(f"cases file {str(p)!r} is not UTF-8 text") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PtdError(f"cases file {str(p)!r} is not valid YAML: {str(e).splitlines()[0]}") from None
    cases = data.get("cases") if isinstance(data, dict) else None
    if not isinstance(cases, list) or not cases:
        raise PtdError(f"cases file {str(p)!r} has no 'cases' list")
    for i, c in enumerate(cases):
        where = f"cases file {str(p)!r}, case {i + 1}"
        if not isinstance(c, dict) or not isinstance(c.get("id"), str):
            raise PtdError(f"{where}: each case needs an 'id' string")
        for part, keys in _REQUIRED.items():
            sub = c.get(part)
            if not isinstance(sub, dict):
                raise PtdError(f"{where} ({c['id']}): '{part}' must be a mapping")
            for k in keys:
                if k not in sub:
                    raise PtdError(f"{where} ({c['id']}): '{part}.{k}' is missing")
        if not any(isinstance(c["measured"].get(k), (int, float)) for k in FIGURES):
            raise PtdError(f"{where} ({c['id']}): 'measured' needs one of {', '.join(FIGURES)}")
        stack = c.get("stack")
        if stack is not None and stack not in STACKS:
            raise PtdError(f"{where} ({c['id']}): unknown stack {stack!r}; "
                           f"known: {', '.join(STACKS)}")
    return cases


def _int(v: Any, what: str) -> int:
    if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
            or v != int(v) or v < 1):
        raise PtdError(f"{what} must be a positive whole number, got {v!r}")
    return int(v)


def case_model(c: dict[str, Any]) -> ModelSpec:
    """The model, its block kind and key/value heads by the parameter-count rule."""
    m = c["model"]
    layers, h, heads = (_int(m[k], f"model.{k}") for k in ("layers", "hidden", "heads"))
    ffn, vocab, seq = (_int(m[k], f"model.{k}") for k in ("ffn_hidden", "vocab", "seq_len"))
    kinds = [m["mlp"]] if m.get("mlp") else ["gelu", "swiglu"]
    kvs = [_int(m["kv_heads"], "model.kv_heads")] if m.get("kv_heads") else \
        [k for k in range(1, heads + 1) if heads % k == 0]
    experts = {}
    if m.get("experts") is not None or m.get("top_k") is not None:
        # a mixture of experts: every block's MLP is `experts` of them, `top_k` per token
        experts = dict(n_experts=_int(m.get("experts"), "model.experts"),
                       top_k=_int(m.get("top_k"), "model.top_k"))
        if experts["top_k"] > experts["n_experts"]:
            raise PtdError(f"model.top_k {experts['top_k']} is more than model.experts "
                           f"{experts['n_experts']}")
    target = m.get("params_b")
    if not isinstance(target, (int, float)):
        kvs = kvs[-1:]  # no count to match: multi-head (heads itself, the largest divisor)
    best: tuple[float, ModelSpec] | None = None
    for kind in kinds:
        for kv in kvs:
            spec = ModelSpec(
                name=str(c["id"]), n_layers=layers, hidden=h, n_heads=heads, n_kv_heads=kv,
                ffn_hidden=ffn, vocab_size=vocab, max_seq_len=seq, mlp=kind,
                norm="layernorm" if kind == "gelu" else "rmsnorm",
                position="learned" if kind == "gelu" else "rope",
                tied_embeddings=False, bias=kind == "gelu", **experts)
            if not isinstance(target, (int, float)):
                # no count to match: the first candidate (GPT, multi-head)
                return _with_dropout(spec, m)
            gap = abs(spec.param_count() - target * 1e9)
            if best is None or gap < best[0]:
                best = (gap, spec)
    assert best is not None
    return _with_dropout(best[1], m)


def _with_dropout(spec: ModelSpec, m: dict[str, Any]) -> ModelSpec:
    p = m.get("dropout")
    if p is None:
        return spec
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
        raise PtdError(f"model.dropout must be a probability in [0, 1), got {p!r}")
    return dataclasses.replace(spec, dropout=float(p))


def case_cluster(c: dict[str, Any]) -> ClusterSpec:
    hw = c["hardware"]
    text = str(hw["gpu"])
    if "H100" in text:
        preset = "h100-sxm"
    elif "A100" in text:
        preset = "a100-40g" if re.search(r"40\s*GB", text) else "a100-80g"
    else:
        raise PtdError(f"no hardware preset for {text!r} (known: A100, H100)")
    n = _int(hw["gpus_total"], "hardware.gpus_total")
    per = _int(hw.get("gpus_per_node") or 8, "hardware.gpus_per_node")
    device = get_hardware_preset(preset)
    nic = network_per_gpu(text, per)
    if nic is not None:
        device = dataclasses.replace(device, inter_node=dataclasses.replace(device.inter_node,
                                                                            bandwidth=nic))
    return ClusterSpec(device, n, min(per, n))


def network_per_gpu(text: str, gpus_per_node: int) -> float | None:
    """Inter-node bytes/s per GPU stated in a hardware description, or None."""
    m = re.search(r"(?:(\d+)\s*[x\u00d7]\s*)?(\d+(?:\.\d+)?)\s*G(?:b/s|bps|b\b|\b)", text)
    if not m:
        return None
    count, rate = int(m.group(1) or 1), float(m.group(2)) * 1e9 / 8
    if re.search(r"per\s+(gpu|device)", text[m.start():], re.I):
        return count * rate
    return count * rate / gpus_per_node


def _zero(v: Any) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    text = str(v or "").strip().lower()
    if re.match(r"\d", text):
        return int(text[0])
    return 1 if "distributed optimizer" in text else 0


def _recompute(v: Any) -> str | None:
    text = str(v or "").strip().lower()
    for kind in ("full", "selective", "none"):
        if text.startswith(kind):
            return kind
    return None


def _selective_policy(v: Any) -> str | None:
    """``selective (op)`` / ``selective (layer)``: torchtitan's two policies, where the case
    names one; None leaves the stack's own."""
    m = re.match(r"\s*selective\s*\((op|layer)\)", str(v or ""), re.I)
    return m.group(1).lower() if m else None


def case_plan(c: dict[str, Any], model: ModelSpec) -> tuple[ParallelPlan, list[str]]:
    """The published plan and the knobs left for the cost model to choose."""
    p = c["plan"]
    free = ["schedule"]
    kw: dict[str, Any] = dict(
        tp=_int(p["tp"], "plan.tp"), pp=_int(p["pp"], "plan.pp"), dp=_int(p["dp"], "plan.dp"),
        cp=1 if p.get("cp") is None else _int(p["cp"], "plan.cp"),
        ep=1 if p.get("ep") is None else _int(p["ep"], "plan.ep"),
        global_batch=_int(p["global_batch"], "plan.global_batch"), seq_len=model.max_seq_len,
        zero=_zero(p.get("zero")),
        dtype="fp16" if re.search(r"\bfp16\b|float16", str(c.get("notes", ""))) else "bf16")
    for key, value in (("micro_batch", p.get("micro_batch")), ("vpp", p.get("vpp"))):
        if value is None:
            free.append(key)
        else:
            kw[key] = _int(value, f"plan.{key}")
    rc = _recompute(p.get("recompute"))
    if rc is None:
        free.append("recompute")
    else:
        kw["recompute"] = rc
    sp = p.get("sequence_parallel")
    if isinstance(sp, bool):
        kw["sp"] = sp and kw["tp"] > 1
    else:
        free.append("sp")
    kw["uneven_stages"] = model.n_layers % kw["pp"] != 0
    if kw.get("vpp", 1) > 1:
        kw["schedule"] = "interleaved-1f1b"
        free.remove("schedule")
    n = c["hardware"]["gpus_total"]
    ranks = kw["tp"] * kw["pp"] * kw["dp"] * kw["cp"]
    if ranks != n:
        cp = " x cp" if kw["cp"] > 1 else ""
        raise PtdError(f"tp x pp x dp{cp} = {ranks} is not the {n} GPUs of the case")
    return ParallelPlan(**kw), [k for k in FREE_KNOBS if k in free]


def case_stack(c: dict[str, Any]) -> str:
    """The stack a case ran on: its ``stack`` field, or the rule on its ``source`` text."""
    if c.get("stack"):
        return str(c["stack"])
    src, notes = str(c.get("source", "")), str(c.get("notes", ""))
    years = [int(y) for y in re.findall(r"\b(20\d\d)\b", src)]
    text = src if re.search(r"megatron|torchtitan|deepspeed", src, re.I) else notes
    stack = _named_stack(text, years, f"{src} {notes}")
    # Megatron-LM had no ZeRO stage before its distributed optimizer (2022): a ZeRO case
    # from a paper of that era ran on the engine its notes name (a later Megatron-LM run
    # with the 2021 kernels had the distributed optimizer itself)
    zero = str((c.get("plan") or {}).get("zero", "0")).strip()
    if stack == "megatron-2021" and zero[:1] in ("1", "2", "3") and years and min(years) <= 2022:
        other = _named_stack(notes, years, f"{src} {notes}")
        if other != "ptd":
            return other
    return stack


# What marks a Megatron-LM run as using the options the ``megatron-core`` stack prices:
# none of them was on by default before April 2024 (NVIDIA/Megatron-LM: ``--use-flash-attn``
# a store_true flag from 285068c8, 2023-01-11; ``--overlap-grad-reduce`` from 2d5220a424,
# 2023-09-05, off by default; ``--transformer-impl`` defaulting to ``local`` until
# e7b74a4b7e, 2024-04-03, which made Transformer Engine the default)
_CORE_EVIDENCE = re.compile(r"megatron[- ]core|\bmcore\b|transformer[- ]engine|flash[- ]?att|"
                            r"--overlap-grad-reduce|--overlap-param-gather|--tp-comm-overlap", re.I)


def _named_stack(text: str, years: list[int], evidence: str = "") -> str:
    if re.search(r"deepspeed", text, re.I):  # Megatron-DeepSpeed runs on DeepSpeed's engine
        return "deepspeed-2021" if years and max(years) <= 2021 else "deepspeed"
    if re.search(r"megatron", text, re.I):
        if years and min(years) <= 2022:
            return "megatron-2021"
        if _CORE_EVIDENCE.search(evidence or text) or not years or max(years) >= 2025:
            return "megatron-core"
        return "megatron-2021"  # Megatron-LM's defaults of 2023-24: the 2021 kernels
    if re.search(r"torchtitan", text, re.I):
        return "torchtitan"
    return "ptd"


def price(c: dict[str, Any], stack: str | None = None) -> CaseResult:
    """One case priced, or its error row."""
    r = CaseResult(id=str(c.get("id")), source=source_key(c))
    try:
        r.stack = stack or case_stack(c)
        model = case_model(c)
        cluster = case_cluster(c)
        peak = case_peak(c)
        plan, free = case_plan(c, model)
        options = stack_options(r.stack, cluster.hardware)
        policy = _selective_policy(c["plan"].get("recompute"))
        if policy:
            options = dataclasses.replace(options, selective=policy)
        est = choose(model, cluster, plan, free, options=options)
    except PtdError as e:
        r.error = str(e)
        return r
    r.plan, r.chosen = est.plan.describe(), dict(est.chosen)
    if not est.memory.fits:
        r.error = (f"does not fit: {est.memory.total / 2**30:.1f} GiB per device needed "
                   f"with the least-memory choice")
        return r
    r.metric, r.published, r.predicted = _compare(c["measured"], est, peak)
    return r


def case_peak(c: dict[str, Any]) -> float | None:
    """The case's ``hardware.peak_tflops`` in FLOP/s (the denominator of its published MFU
    and HFU), or None where it gives none."""
    v = c["hardware"].get("peak_tflops")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1e6:
        raise PtdError(f"hardware.peak_tflops must be a positive number of TFLOP/s, got {v!r}")
    return float(v) * 1e12


def _compare(measured: dict[str, Any], est: Estimate,
             peak: float | None = None) -> tuple[str, float, float]:
    """(metric, published, predicted): a measurement where the case gives one, else a FLOP
    rate (module docstring, "The published figure"). ``peak``: the case's peak FLOP/s, over
    which its MFU and HFU were taken (ptd's own peak where None)."""
    scale = est.peak / peak if peak else 1.0
    for key in FIGURES:
        v = measured.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            if key == "tokens_per_s":
                return key, float(v), est.tokens_per_s / est.n_devices
            if key == "iter_time_s":
                return key, float(v), est.step.total
            if key == "mfu":
                return key, float(v), est.mfu * scale
            if key == "hfu":
                return key, float(v), est.hfu * scale
            return key, float(v), est.hfu * est.peak / 1e12
    raise PtdError("no published figure")  # load_cases checked this


def source_key(c: dict[str, Any]) -> str:
    """A short name for the case's source: its text up to the first comma or colon."""
    src = str(c.get("source", "unknown")).strip().strip("'\"")
    return re.split(r"[,:(]", src, maxsplit=1)[0].strip()[:40] or "unknown"


def summarize(rows: list[CaseResult]) -> dict[str, dict[str, Any]]:
    """Median, p90 and max |error| overall and per source (priced rows only)."""
    groups: dict[str, list[float]] = {"overall": []}
    for r in rows:
        e = r.rel_error
        if e is not None:
            groups["overall"].append(abs(e))
            groups.setdefault(r.source, []).append(abs(e))
    out = {}
    for name, errs in groups.items():
        errs.sort()
        out[name] = {"cases": len(errs), "median": _quantile(errs, 0.5),
                     "p90": _quantile(errs, 0.9), "max": errs[-1] if errs else None}
    out["overall"]["errors"] = sum(1 for r in rows if r.error)
    return out


def _quantile(xs: list[float], q: float) -> float | None:
    """Linear interpolation between order statistics (numpy's default)."""
    if not xs:
        return None
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

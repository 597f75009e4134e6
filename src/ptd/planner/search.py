"""The search: every plan for a model on a cluster, pruned with reasons, priced, ranked.

The space, for ``N`` devices, a global batch and a sequence length:

* every layout ``(dp, tp, pp)`` with ``dp * tp * pp = N``; ``tp`` divides the devices of a
  node (tensor-parallel peers are consecutive ranks, see :mod:`ptd.specs.layout`) unless
  tensor parallelism may cross nodes, and divides the heads, key/value heads, MLP width and
  vocabulary; ``pp`` at most the layer count; ``dp`` divides the global batch;
* per layout, every pipeline schedule (``pp > 1``): GPipe and 1F1B with one stage per rank,
  zero-bubble ZB-V (two stages per rank), interleaved 1F1B and interleaved zero-bubble with
  ``vpp`` virtual stages per rank -- every ``vpp`` dividing the layers per rank, and when the
  layers do not divide, uneven stages (``uneven_stages``, split by cost) for ``vpp`` up to
  :data:`MAX_UNEVEN_VPP` (Llama 3 405B's 126 layers on 16 stages is such a split);
* every micro-batch dividing the per-replica batch, ZeRO stage 0-3 (only 0 at dp 1, where
  there is nothing to shard), sequence parallelism on and off when ``tp > 1``, and
  recomputation none / selective / full.

Anything a ``fixed`` mapping names (``--fix tp=8,zero=1``) is held at that value.

Pruning is cheap first: a layout or a schedule that cannot be valid removes its whole
subtree with one reason (the checks mirror :meth:`ParallelPlan.validate`, which still has the
final word on every plan that fits); then memory (cheaper than step time) removes what does
not fit; step time is priced only for what fits. Every removed plan is counted by reason.
Prices come
from :mod:`ptd.cost` (memory, step time and FLOPs exactly as :func:`ptd.cost.estimate.estimate`
composes them; a test checks they agree), whose sub-results are memoised by the fields they
depend on, so the same layout under many micro-batch, ZeRO and recompute settings costs
little.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence

from ..cost.estimate import (CostOptions, Estimate, divisors, dp_overlap, plan_memory,
                             stack_refuses, zero_stages)
from ..cost.flops import flops_per_token
from ..cost.step import step_time
from ..errors import PtdError
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.plan import GRAD_COMPRESSION, RECOMPUTE, SCHEDULES, TRAIN_DTYPES, ParallelPlan

OBJECTIVES = ("throughput", "memory", "time-to-train")
MAX_UNEVEN_VPP = 8
"""Largest ``vpp`` tried with uneven stages (with even stages every divisor is tried)."""

DIMENSIONS = ("dp", "tp", "pp", "zero", "sp", "schedule", "micro_batch", "recompute")
"""The dimensions :mod:`ptd.planner.explain` accounts for, in display order."""

# Rejection reasons (the keys of the counts). Layout reasons remove a whole (dp, tp, pp).
TP_CROSSES_NODES = "tp crosses nodes"
TP_HEADS = "tp does not divide the attention heads"
TP_KV_HEADS = "tp does not divide the key/value heads"
TP_FFN = "tp does not divide the MLP width"
PP_LAYERS = "more pipeline stages than layers"
DP_BATCH = "dp does not divide the global batch"
UNEVEN = "layers not divisible by pp*vpp (uneven stages not allowed)"
SP_SEQ = "sequence parallel needs seq_len divisible by tp"
FEW_MICROBATCHES = "fewer micro-batches than pipeline stages"
OFFLOAD_ZERO = "offload needs ZeRO 3"
COMPRESSION_ZERO = "gradient compression needs ZeRO 0"
ZERO_DP1 = "ZeRO shards over dp: nothing to shard at dp 1"
NO_FIT = "does not fit in memory"
CP_SEQ = "cp needs seq_len divisible by 2*cp (zig-zag chunks)"
CP_DEVICES = "cp does not divide the devices"

# --fix: field names and their short forms
FIX_ALIASES = {"mb": "micro_batch", "micro-batch": "micro_batch", "rc": "recompute",
               "uneven": "uneven_stages", "uneven-stages": "uneven_stages",
               "grad-compression": "grad_compression"}
FIX_FIELDS = ("dp", "tp", "pp", "ep", "cp", "vpp", "zero", "sp", "micro_batch", "recompute", "schedule",
              "offload", "uneven_stages", "grad_compression")
_INT_FIELDS = ("dp", "tp", "pp", "ep", "cp", "vpp", "zero", "micro_batch")
_BOOL_FIELDS = ("sp", "offload", "uneven_stages")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


ZEROS = [0, 1, 2, 3]


def parse_fix(specs: Iterable[str]) -> dict[str, Any]:
    """``["tp=8,pp=16", "zero=1"]`` -> ``{"tp": 8, "pp": 16, "zero": 1}``, validated."""
    out: dict[str, Any] = {}
    for spec in specs:
        for item in spec.split(","):
            item = item.strip()
            if not item:
                continue
            key, sep, raw = item.partition("=")
            key, raw = FIX_ALIASES.get(key.strip(), key.strip()), raw.strip()
            if not sep or not raw:
                raise PtdError(f"--fix: expected FIELD=VALUE, got {item!r}")
            if key not in FIX_FIELDS:
                raise PtdError(f"--fix: unknown field {key!r}; choose from {', '.join(FIX_FIELDS)}")
            out[key] = _fix_value(key, raw)
    return out


def _fix_value(key: str, raw: str) -> Any:
    if key in _INT_FIELDS:
        try:
            v = int(raw)
        except ValueError:
            raise PtdError(f"--fix: {key} must be an integer, got {raw!r}") from None
        if v < (0 if key == "zero" else 1) or (key == "zero" and v > 3):
            raise PtdError(f"--fix: {key}={raw} is out of range")
        return v
    if key in _BOOL_FIELDS:
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise PtdError(f"--fix: {key} must be true or false, got {raw!r}")
    choices = {"recompute": RECOMPUTE, "schedule": SCHEDULES, "grad_compression": GRAD_COMPRESSION}[key]
    if raw not in choices:
        raise PtdError(f"--fix: {key} must be one of {', '.join(choices)}, got {raw!r}")
    return raw


def schedule_label(plan: ParallelPlan) -> str:
    """The value of the ``schedule`` dimension: schedule and virtual stages together."""
    return _label(plan.pp, plan.schedule, plan.vpp, plan.n_stages)


def dimension_values(plan: ParallelPlan) -> dict[str, Any]:
    return {"dp": plan.dp, "tp": plan.tp, "pp": plan.pp, "zero": plan.zero, "sp": plan.sp,
            "schedule": schedule_label(plan), "micro_batch": plan.micro_batch,
            "recompute": plan.recompute, **({"ep": plan.ep} if plan.ep > 1 else {})}


@dataclass
class SearchResult:
    """Everything the search found. ``ranked`` holds every plan that fits, best first."""

    model: ModelSpec
    cluster: ClusterSpec
    global_batch: int
    seq_len: int
    dtype: str
    objective: str
    tokens: float | None
    options: CostOptions
    fixed: dict[str, Any]
    ranked: list[Estimate] = field(default_factory=list)
    layouts_considered: int = 0
    layouts_rejected: Counter = field(default_factory=Counter)
    plans_considered: int = 0
    plans_rejected: Counter = field(default_factory=Counter)
    elapsed_s: float = 0.0
    best_by: dict[tuple[str, Any], Estimate] = field(default_factory=dict)
    """Best fitting plan (by the objective) for each (dimension, value)."""
    reasons_by: dict[tuple[str, Any], Counter] = field(default_factory=dict)
    """Why plans with a (dimension, value) were removed."""
    least_memory_by: dict[tuple[str, Any], float] = field(default_factory=dict)
    """Least memory per device among priced plans with a (dimension, value), fitting or not."""
    least_memory: tuple[float, ParallelPlan] | None = None
    """The priced plan needing the least memory (whether or not it fits)."""

    @property
    def plans_fit(self) -> int:
        return len(self.ranked)

    @property
    def best(self) -> Estimate:
        if not self.ranked:
            raise PtdError(self.no_fit_message())
        return self.ranked[0]

    def top(self, k: int) -> list[Estimate]:
        return self.ranked[:k]

    def key(self, e: Estimate) -> tuple:
        return objective_key(self.objective, e)

    def no_fit_message(self) -> str:
        cap = self.cluster.hardware.usable_memory
        parts = [f"no plan fits: {self.plans_considered} plans in {self.layouts_considered} "
                 f"layouts considered"]
        if self.least_memory is not None:
            need, plan = self.least_memory
            parts.append(f"the least memory is {need / 2**30:.1f} GiB per device "
                         f"({plan.describe()}) of {cap / 2**30:.0f} GiB")
        reasons = self.plans_rejected + self.layouts_rejected
        if reasons:
            parts.append("rejected: " + ", ".join(f"{r} ({n})" for r, n in reasons.most_common(3)))
        return "; ".join(parts)


def objective_key(objective: str, e: Estimate) -> tuple:
    """Sort key: smaller is better. Ties go to the other quantity, then to a stable order."""
    p = e.plan
    tie = (p.dp, p.tp, p.pp, p.vpp, p.schedule, p.zero, p.sp, p.micro_batch,
           RECOMPUTE.index(p.recompute), p.ep)
    if objective == "memory":
        return (e.memory.total, e.step.total, tie)
    return (e.step.total, e.memory.total, tie)


class _Pricer:
    """Memory first, step time only for what fits; FLOPs per token by recompute kind."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, options: CostOptions,
                 tokens: float | None, seq_len: int):
        self.model, self.cluster, self.options = model, cluster, options
        self.tokens = float(tokens) if tokens else 20.0 * model.param_count()
        self.flops = {rc: flops_per_token(model, seq_len, rc, options.recompute_early_stop,
                                          options.selective) for rc in RECOMPUTE}

    def memory(self, plan: ParallelPlan):
        return plan_memory(self.model, plan, self.cluster.hardware, self.options)

    def estimate(self, plan: ParallelPlan, mem) -> Estimate:
        o = self.options
        st = step_time(self.model, plan, self.cluster, o.attention, dp_overlap(o, plan),
                       o.recompute_early_stop, o.tp_grad_per_linear, o.moe_imbalance,
                       o.ps_servers, o.zero3_gather, o.elementwise, o.fsdp_copy_out,
                       o.selective, o.expert_tp)
        return Estimate(self.model, self.cluster, plan, self.flops[plan.recompute], mem, st,
                        self.tokens)


def search(model: ModelSpec, cluster: ClusterSpec, global_batch: int, seq_len: int, *,
           dtype: str = "bf16", fixed: Mapping[str, Any] | None = None,
           objective: str = "throughput", tokens: float | None = None,
           options: CostOptions = CostOptions(), allow_tp_across_nodes: bool = False,
           max_uneven_vpp: int = MAX_UNEVEN_VPP, cp_values: Sequence[int] = (1,)) -> SearchResult:
    """Search every plan (see the module docstring); the result ranks those that fit.
    ``cp_values``: the context-parallel degrees to search (``fixed["cp"]`` overrides)."""
    t0 = time.perf_counter()
    fixed = dict(fixed or {})
    _check_inputs(model, cluster, global_batch, seq_len, dtype, fixed, objective)
    res = SearchResult(model, cluster, global_batch, seq_len, dtype, objective, tokens, options,
                       fixed)
    walk = _Walk(res, allow_tp_across_nodes, max_uneven_vpp, cp_values)
    pricer = _Pricer(model, cluster, options, tokens, seq_len)
    best_keys: dict[tuple[str, Any], tuple] = {}
    keyed: list[tuple[tuple, Estimate]] = []
    for plan, dims in walk.plans():
        mem = pricer.memory(plan)
        need = mem.total
        if res.least_memory is None or need < res.least_memory[0]:
            res.least_memory = (need, plan)
        for kv in dims.items():
            if need < res.least_memory_by.get(kv, float("inf")):
                res.least_memory_by[kv] = need
        if not mem.fits:
            walk.reject(NO_FIT, 1, dims)
            continue
        try:  # the final word: the checks of the walk mirror it
            plan.validate(model, cluster.n_devices)
            runtime_refuses(model, plan)  # what ptd train refuses
            no = stack_refuses(model, plan, options)  # what the priced stack refuses
            if no:
                raise PtdError(no)
        except PtdError as err:
            walk.reject(f"invalid: {err}", 1, dims)
            continue
        e = pricer.estimate(plan, mem)
        k = objective_key(objective, e)
        keyed.append((k, e))
        for kv in dims.items():
            cur = best_keys.get(kv)
            if cur is None or k < cur:
                best_keys[kv] = k
                res.best_by[kv] = e
    if res.layouts_considered == 0:
        held = [f"{k}={fixed[k]}" for k in ("dp", "tp", "pp", "cp") if k in fixed]
        searched_cp = "cp" not in fixed and list(cp_values) != [1]
        if searched_cp:
            held.append("cp in " + ",".join(map(str, cp_values)))
        what = "dp*tp*pp*cp" if searched_cp or "cp" in fixed else "dp*tp*pp"
        raise PtdError(f"no layout {what} = {cluster.n_devices} has {', '.join(held) or 'these settings'}")
    keyed.sort(key=lambda ke: ke[0])
    res.ranked = [e for _, e in keyed]
    res.elapsed_s = time.perf_counter() - t0
    return res


def _check_inputs(model: ModelSpec, cluster: ClusterSpec, global_batch: int, seq_len: int,
                  dtype: str, fixed: Mapping[str, Any], objective: str) -> None:
    if objective not in OBJECTIVES:
        raise PtdError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if dtype not in TRAIN_DTYPES:
        raise PtdError(f"dtype must be one of {', '.join(TRAIN_DTYPES)}, got {dtype!r}")
    if global_batch < 1 or seq_len < 1:
        raise PtdError("global batch and seq_len must be positive")
    if seq_len > model.max_seq_len:
        raise PtdError(f"seq_len {seq_len} exceeds {model.name}'s max_seq_len {model.max_seq_len}")
    unknown = set(fixed) - set(FIX_FIELDS)
    if unknown:
        raise PtdError(f"cannot fix {', '.join(sorted(unknown))}; choose from {', '.join(FIX_FIELDS)}")
    _check_fixed_together(fixed)
    cluster.hardware.peak(dtype)  # raises if the hardware has no peak for this dtype


def _check_fixed_together(fixed: Mapping[str, Any]) -> None:
    """Fixed fields that contradict each other: one line naming both, rather than a search
    that rejects every plan for an unrelated reason or keeps a setting that does nothing."""
    if fixed.get("pp") == 1:
        moot = [k for k in ("schedule", "uneven_stages") if k in fixed]
        moot += ["vpp"] if fixed.get("vpp", 1) > 1 else []
        if moot:
            raise PtdError(f"--fix pp=1 leaves no pipeline: {', '.join(moot)} would do nothing; "
                           "drop it or let pp vary")
    schedule, vpp = fixed.get("schedule"), fixed.get("vpp", 1)
    if schedule in ("gpipe", "1f1b") and vpp > 1:
        raise PtdError(f"--fix schedule={schedule} runs one stage per rank; vpp={vpp} needs "
                       "interleaved-1f1b or zero-bubble")
    if schedule == "interleaved-1f1b" and fixed.get("vpp") == 1:
        raise PtdError("--fix schedule=interleaved-1f1b needs vpp > 1")
    if schedule == "zero-bubble" and vpp == 2:  # _schedules lists the V shape once, as vpp 1
        raise PtdError("--fix schedule=zero-bubble: its V schedule (two chunks a rank) is "
                       "vpp=1 here; vpp=2 names the same plan")
    if fixed.get("offload") and fixed.get("zero", 3) != 3:
        raise PtdError(f"--fix offload=true needs zero=3, not zero={fixed['zero']}")
    if fixed.get("grad_compression", "none") != "none" and fixed.get("zero", 0) != 0:
        raise PtdError(f"--fix grad_compression={fixed['grad_compression']} needs zero=0, "
                       f"not zero={fixed['zero']}")


class _Walk:
    """The candidate plans of a search, generated level by level (layout, schedule,
    micro-batch, sequence parallelism, ZeRO, recompute and ep); a level that cannot work
    rejects everything under it at once, with its reason and count, through :meth:`reject`."""

    def __init__(self, res: SearchResult, allow_tp_across_nodes: bool, max_uneven_vpp: int,
                 cp_values: Sequence[int]) -> None:
        self.res, self.fixed = res, res.fixed
        self.allow_tp_across_nodes, self.max_uneven_vpp = allow_tp_across_nodes, max_uneven_vpp
        self.cp_values = list(cp_values)

    def opts(self, name: str, values: list) -> list:
        return [self.fixed[name]] if name in self.fixed else values

    def reject(self, reason: str, count: int, dims: dict[str, Any], layout: bool = False) -> None:
        """``count`` plans (or one layout) with ``dims`` removed for ``reason``."""
        (self.res.layouts_rejected if layout else self.res.plans_rejected)[reason] += count
        for kv in dims.items():
            c = self.res.reasons_by.get(kv)
            if c is None:
                c = self.res.reasons_by[kv] = Counter()
            c[reason] += count

    def layouts(self) -> Iterator[dict[str, int]]:
        """``{dp, tp, pp[, cp]}`` of every layout worth pricing."""
        res, n = self.res, self.res.cluster.n_devices
        model, node = res.model, res.cluster.devices_per_node
        for cp in self.opts("cp", self.cp_values):
            reason = CP_DEVICES if n % cp else CP_SEQ if cp > 1 and res.seq_len % (2 * cp) else None
            if reason:
                self.reject(reason, 1, {"cp": cp}, layout=True)
                continue
            for tp in self.opts("tp", divisors(n // cp)):
                for pp in self.opts("pp", divisors(n // cp // tp) if n % (cp * tp) == 0 else []):
                    if n % (cp * tp * pp):
                        continue
                    dp = n // (cp * tp * pp)
                    if "dp" in self.fixed and self.fixed["dp"] != dp:
                        continue
                    res.layouts_considered += 1
                    layout = {"dp": dp, "tp": tp, "pp": pp, **({"cp": cp} if cp > 1 else {})}
                    reason = _layout_reason(model, dp, tp, pp, node, res.global_batch,
                                            self.allow_tp_across_nodes)
                    if reason:
                        self.reject(reason, 1, layout, layout=True)
                        continue
                    yield layout

    def plans(self) -> Iterator[tuple[ParallelPlan, dict[str, Any]]]:
        """Every candidate plan, with its dimensions (for the per-dimension tables)."""
        res, fixed = self.res, self.fixed
        L = res.model.n_layers
        for layout in self.layouts():
            dp, tp, pp = layout["dp"], layout["tp"], layout["pp"]
            scheds = _schedules(L, pp, fixed, fixed.get("uneven_stages", True), self.max_uneven_vpp)
            scheds = [o for o in scheds if o[0] in res.options.schedules]  # the stack's
            mbs = self.opts("micro_batch", divisors(res.global_batch // dp))
            sps = self.opts("sp", [False, True] if tp > 1 else [False])
            inner = len(self.opts("zero", ZEROS)) * len(sps) * len(self._rc_ep(dp))
            res.plans_considered += len(scheds) * len(mbs) * inner
            for sched, vpp, stages in scheds:
                sdims = dict(layout, schedule=_label(pp, sched, vpp, stages))
                why = (PP_LAYERS if stages > L else UNEVEN
                       if L % stages and not fixed.get("uneven_stages", True) else None)
                if why:
                    self.reject(why, len(mbs) * inner, sdims)
                    continue
                for mb in mbs:
                    yield from self._micro_batch_plans(layout, sched, vpp, stages, mb, sps, sdims)

    def _rc_ep(self, dp: int) -> list[tuple[str, int]]:
        """(recompute, ep) pairs; ep over every degree dividing dp and the experts."""
        model = self.res.model
        eps = self.opts("ep", [d for d in divisors(dp)
                               if model.is_moe and model.n_experts % d == 0] or [1])
        return [(rc, ep) for rc in self.opts("recompute", list(RECOMPUTE)) for ep in eps]

    def _micro_batch_plans(self, layout: dict[str, int], sched: str, vpp: int, stages: int,
                           mb: int, sps: list[bool], sdims: dict[str, Any]
                           ) -> Iterator[tuple[ParallelPlan, dict[str, Any]]]:
        res, fixed = self.res, self.fixed
        dp, tp, pp = layout["dp"], layout["tp"], layout["pp"]
        zeros, rces = self.opts("zero", ZEROS), self._rc_ep(dp)
        gb = res.global_batch
        m = gb // (mb * dp) if gb % (mb * dp) == 0 else 0
        mdims = dict(sdims, micro_batch=mb)
        why = DP_BATCH if m == 0 else (FEW_MICROBATCHES if pp > 1 and sched != "gpipe" and m < pp
                                       else None)
        if why:
            self.reject(why, len(zeros) * len(sps) * len(rces), mdims)
            return
        offload = fixed.get("offload", False)
        compression = fixed.get("grad_compression", "none")
        for sp in sps:
            if sp and res.seq_len % tp:
                self.reject(SP_SEQ, len(zeros) * len(rces), dict(mdims, sp=sp))
                continue
            for zero in zeros:
                why = (OFFLOAD_ZERO if offload and zero < 3 else COMPRESSION_ZERO
                       if compression != "none" and zero != 0 else None)
                # (copies of one plan in the table otherwise; estimate's rule)
                if why is None and "zero" not in fixed and zero not in zero_stages(dp, offload):
                    why = ZERO_DP1
                if why:
                    self.reject(why, len(rces), dict(mdims, sp=sp, zero=zero))
                    continue
                for rc, ep in rces:
                    plan = ParallelPlan(
                        dp=dp, tp=tp, pp=pp, cp=layout.get("cp", 1), vpp=vpp, zero=zero, sp=sp,
                        micro_batch=mb, global_batch=gb, seq_len=res.seq_len, recompute=rc,
                        schedule=sched, dtype=res.dtype, offload=offload,  # type: ignore[arg-type]
                        grad_compression=compression, uneven_stages=res.model.n_layers % stages != 0,
                        ep=ep)
                    yield plan, dict(mdims, sp=sp, zero=zero, recompute=rc,
                                     **({"ep": ep} if res.model.is_moe else {}))


def runtime_refuses(model: ModelSpec, plan: ParallelPlan) -> None:
    """Raise what ``ptd train`` would refuse (:func:`ptd.runtime.launch.limits.plan_problem`; that
    module imports no torch), so that a plan ptd prints is one it trains."""
    from ..runtime.launch.limits import plan_problem
    why = plan_problem(model, plan)
    if why:
        raise PtdError(f"ptd train refuses it: {why}")


def ranked_plans(model: ModelSpec, cluster: ClusterSpec, global_batch: int, seq_len: int,
                 **kwargs: Any) -> list[Estimate]:
    """Every plan that fits, best first (what a test that runs the candidates iterates)."""
    return search(model, cluster, global_batch, seq_len, **kwargs).ranked


def _layout_reason(model: ModelSpec, dp: int, tp: int, pp: int, node: int, global_batch: int,
                   allow_tp_across_nodes: bool) -> str | None:
    if not allow_tp_across_nodes and (tp > node or node % tp):
        return TP_CROSSES_NODES
    if model.n_heads % tp:
        return TP_HEADS
    if model.n_kv_heads % tp:
        return TP_KV_HEADS
    if model.ffn_hidden % tp:
        return TP_FFN
    if pp > model.n_layers:
        return PP_LAYERS
    if global_batch % dp:
        return DP_BATCH
    return None


def _schedules(L: int, pp: int, fixed: Mapping[str, Any], allow_uneven: bool,
               max_uneven_vpp: int) -> list[tuple[str, int, int]]:
    """``(schedule, vpp, stages)`` options of one layout (``stages`` = pp * chunks per rank)."""
    if pp == 1:
        out = [("1f1b", 1, 1)]
        if fixed.get("vpp", 1) != 1:
            return []
        if "schedule" in fixed:  # the schedule is ignored without a pipeline: keep the name
            out = [(fixed["schedule"], 1, 1)]
        return out
    vpps = [v for v in range(2, L // pp + 1)
            if L % (pp * v) == 0 or (allow_uneven and v <= max_uneven_vpp)]
    if "vpp" in fixed:
        vpps = [fixed["vpp"]] if fixed["vpp"] > 1 else []
    one = "vpp" not in fixed or fixed["vpp"] == 1
    out: list[tuple[str, int, int]] = []
    if one:
        out += [("gpipe", 1, pp), ("1f1b", 1, pp), ("zero-bubble", 1, 2 * pp)]
    out += [("interleaved-1f1b", v, pp * v) for v in vpps]
    out += [("zero-bubble", v, pp * v) for v in vpps if v > 2]  # vpp 2 is ZB-V, as vpp 1
    if "schedule" in fixed:
        out = [o for o in out if o[0] == fixed["schedule"]]
    return out


def _label(pp: int, sched: str, vpp: int, stages: int) -> str:
    if pp == 1:
        return "none"
    if sched == "interleaved-1f1b":
        return f"interleaved-1f1b vpp{vpp}"
    if sched == "zero-bubble":
        return "zero-bubble ZB-V" if stages == 2 * pp else f"zero-bubble vpp{vpp}"
    return sched

"""Predicted vs measured: the cost model for the run's own model, plan and hardware, beside
what the probe measured, part by part, with their ratio (measured / predicted).

Pure Python apart from what it is handed (no torch), so ``ptd report`` and ``ptd bench``
use it on saved results too.

**The prediction** is :func:`ptd.cost.estimate.estimate` for the resolved plan on the run's
hardware (resolved by the runtime: :func:`ptd.runtime.calibrate.first_run.resolve_hardware`)
with as many devices as the run has workers, and per rank
:func:`ptd.cost.memory.model_state_elements` and
:func:`ptd.cost.memory.activation_bytes` for that rank's pipeline stage.

**The measured side in the cost model's terms** (the ``critical`` rank, the one with the
most compute, stands for the step as the cost model's slowest pipeline rank does):

==================  ====================================================================
cost-model part     measured as
==================  ====================================================================
compute             forward + backward (+ zero-bubble weight pass) + recompute
tp_comm             exposed collectives inside forward/backward when tp > 1 (all-reduce,
                    and all-gather/reduce-scatter unless FSDP shards over dp)
pp_comm             exposed sends (and receive launches) of the pipeline
ep_comm             exposed all-to-alls inside forward/backward when ep > 1 (the
                    experts' token dispatch and combine)
cp_comm             exposed sends and receives inside forward/backward when cp > 1 and
                    pp is 1 (the ring's K/V steps; with a pipeline they are not told
                    apart from its transfers, and count as pp_comm)
dp_comm_exposed     exposed collectives of the gradient reduction: DDP's bucket
                    all-reduces, FSDP's all-gathers and reduce-scatters, the runner's
                    explicit gradient average (with its packing copies) and a tied
                    embedding's gradient sum over pipeline stages
bubble              pipeline time waiting for a neighbour (receives) or between actions,
                    and on a pipeline the wait in the step's loss all-reduce: a stage
                    that has finished waits there for the others to drain
optimizer           gradient norm and clipping, AdamW, ZeRO-1's broadcast
(not modelled)      data wait, the loss all-reduce without a pipeline, ``other``
==================  ====================================================================
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from ..cost import metrics as M
from ..fmt import duration, gib, pct, si, table

STEP_PARTS = ("compute", "forward", "backward", "recompute", "tp_comm", "pp_comm", "ep_comm",
              "cp_comm", "dp_comm_exposed", "bubble", "optimizer")


def predict(model: Any, plan: Any, hardware: Any) -> Any:
    from ..cost.estimate import estimate
    from ..specs import ClusterSpec
    return estimate(model, ClusterSpec(hardware, plan.world_size), plan)


def predicted_rank_memory(model: Any, plan: Any, pp_rank: int, dp_rank: int,
                          hardware: Any = None) -> dict[str, float]:
    from ..cost.estimate import CostOptions, autocast, fused_norm
    from ..cost.memory import (activation_bytes, autocast_weight_copies, model_state_elements,
                               state_bytes_per_param)
    from ..specs.hardware import DTYPE_BYTES
    e = model_state_elements(model, plan, pp_rank, dp_rank)
    pb, gb, ob = state_bytes_per_param(plan.dtype, "ptd")
    d = {"params": e.params * pb, "grads": e.grads * gb, "optimizer": e.optimizer * ob}
    d["total"] = d["params"] + d["grads"] + d["optimizer"]
    ptd = CostOptions()  # the defaults are ptd's runtime
    fused = fused_norm(ptd, hardware) if hardware is not None else True
    # fp32 weights under autocast in bf16/fp16 with ZeRO-0; under ZeRO-1/2/3 FSDP casts the
    # parameters and the forward runs in the compute dtype (cost.eager.for_plan)
    ac = autocast(ptd, plan)
    d["activations"] = activation_bytes(model, plan, pp_rank=pp_rank, fused_norm=fused,
                                        autocast=ac, sp_gathered=True)
    ab = DTYPE_BYTES[plan.dtype]
    if ab < 4 and ac:  # autocast's weight copies lie under the measured peak
        d["activations"] += ab * autocast_weight_copies(model, plan, pp_rank)
    return d


def cost_view(parts: dict[str, float], by_phase: dict[str, dict[str, float]], plan: Any
              ) -> dict[str, float]:
    """A measured breakdown (:class:`~.timeline.MeasuredStep` parts) in the cost model's
    parts (see the module docstring)."""
    g = parts.get
    out = {k: 0.0 for k in STEP_PARTS}
    out.update(data=g("data", 0.0), other=g("other", 0.0) + g("loss", 0.0) + g("schedule", 0.0))
    out["forward"] = g("forward", 0.0)
    out["backward"] = g("backward", 0.0) + g("backward_w", 0.0)
    out["recompute"] = g("recompute", 0.0)
    out["compute"] = out["forward"] + out["backward"] + out["recompute"]
    out["bubble"] = g("bubble", 0.0)
    out["optimizer"] = g("optimizer", 0.0)
    out["dp_comm_exposed"] = g("grad_sync", 0.0)
    for phase, kinds in by_phase.items():
        for kind, t in kinds.items():
            if phase in ("forward", "backward", "backward_w", "recompute", "schedule"):
                if kind in ("send", "recv"):
                    dest = "cp_comm" if plan.cp > 1 and plan.pp == 1 else "pp_comm"
                elif kind == "all_to_all" and plan.ep > 1:
                    dest = "ep_comm"
                elif kind in ("all_gather", "reduce_scatter"):
                    dest = "dp_comm_exposed" if plan.zero >= 1 else "tp_comm"  # FSDP's
                elif kind in ("all_reduce", "wait"):
                    dest = "tp_comm" if plan.tp > 1 else "dp_comm_exposed"
                else:
                    dest = "dp_comm_exposed"
            elif phase == "grad_sync":
                dest = "dp_comm_exposed"
            elif phase == "optimizer":
                dest = "optimizer"
            elif phase == "loss" and plan.pp > 1:
                # The step's loss all-reduce is the first call after the schedule that every
                # stage makes: one that has finished (1F1B: the last stage) idles there
                # while the first still runs its last backwards -- the drain of its bubble.
                dest = "bubble"
            else:
                dest = "other"
            out[dest] += t
    return out


def ratio(m: float | None, p: float | None) -> float | None:
    """measured / predicted; None where either is missing, zero or not finite."""
    if m is None or p is None or not p or not math.isfinite(m):
        return None
    return m / p


def build_report(cfg: Any, ranks: Sequence[dict[str, Any]], clean_steps: Sequence[int],
                 hw: Any, hw_src: str) -> dict[str, Any]:
    """``measured``, ``predicted``, ``ratio`` (and ``per_rank``, ``hardware``, ``notes``)
    for ``summary.json`` from every rank's :meth:`Probe.local_result`, the prediction made
    for hardware ``hw`` (found at ``hw_src``)."""
    from ..cost.flops import flops_per_token
    plan, model = cfg.plan, cfg.model
    est = predict(model, plan, hw)
    times = ranks[0]["step_times"]
    clean = [times[s] for s in clean_steps if s in times] or list(times.values())
    step_s = sum(clean) / len(clean)
    fl = flops_per_token(model, plan.seq_len, plan.recompute)
    peak = hw.peak(plan.dtype)
    measured = {**_rates(plan, fl, peak, step_s, plan.tokens_per_step / step_s,
                         plan.global_batch / step_s),
                "clean_steps": list(clean_steps)}
    predicted = _rates(plan, fl, peak, est.step.total, est.tokens_per_s, est.samples_per_s)
    predicted["mfu"], predicted["hfu"] = est.mfu, est.hfu  # the estimate's own
    per_rank = [_rank_row(r, model, plan, hw) for r in ranks]
    measured.update(_measured_breakdown(per_rank, plan))
    predicted["breakdown"] = {k: getattr(est.step, k) for k in STEP_PARTS}
    predicted["breakdown"]["dp_comm_total"] = est.step.dp_comm_total
    _memory(per_rank, measured, predicted)
    return {"measured": measured, "predicted": predicted,
            "ratio": _ratios(measured, predicted), "per_rank": per_rank,
            "prediction": {"hardware": hw.name, "hardware_source": hw_src,
                           "peak_flops": peak, "flops_per_token": {"model": fl.model,
                                                                   "hardware": fl.hardware},
                           "estimate": est.to_json()}}


def _rates(plan: Any, fl: Any, peak: float, step_s: float, tokens_per_s: float,
           samples_per_s: float) -> dict[str, Any]:
    """Throughput, FLOP rates, MFU and HFU of a step time, whole job and per device."""
    n = plan.world_size
    return {"step_time_s": step_s,
            "tokens_per_s": tokens_per_s,
            "tokens_per_s_per_device": tokens_per_s / n,
            "samples_per_s": samples_per_s,
            "samples_per_s_per_device": samples_per_s / n,
            "tflops_per_device": fl.model * tokens_per_s / n / 1e12,
            "hardware_tflops_per_device": fl.hardware * tokens_per_s / n / 1e12,
            "mfu": M.mfu(fl.model, tokens_per_s, peak, n),
            "hfu": M.hfu(fl.hardware, tokens_per_s, peak, n)}


def _rank_row(r: dict[str, Any], model: Any, plan: Any, hw: Any) -> dict[str, Any]:
    """One rank's memory beside its prediction, its breakdown in the cost model's terms."""
    c = r["coords"]
    row: dict[str, Any] = {"rank": r["rank"], "coords": c, "memory": r["memory"],
                           "predicted_memory": predicted_rank_memory(model, plan, c["pp"],
                                                                     c["dp"], hw)}
    b = r["breakdown"]
    if b is not None:
        row["breakdown"] = b
        row["cost_view"] = cost_view(b["parts"], b["comm_exposed_by_phase"], plan)
    if r.get("timeline"):
        row["timeline"] = r["timeline"]  # (label, start ms, end ms) of the last profiled step
    return row


def _measured_breakdown(per_rank: list[dict[str, Any]], plan: Any) -> dict[str, Any]:
    """The critical rank's (most compute) breakdown, and every stage's bubble with pp."""
    with_b = [r for r in per_rank if "cost_view" in r]
    if not with_b:
        return {}
    crit = max(with_b, key=lambda r: r["cost_view"]["compute"])
    cv, b = crit["cost_view"], crit["breakdown"]
    out: dict[str, Any] = {
        "breakdown_rank": crit["rank"],
        "profiled_step_time_s": b["step"],
        "breakdown": {k: cv[k] for k in (*STEP_PARTS, "data", "other")},
        "breakdown_parts": b["parts"],
        "breakdown_sum_s": sum(v for k, v in cv.items()
                               if k not in ("forward", "backward", "recompute")),
        "comm_total_s": b["comm_total"],
        "comm_exposed_s": {k[5:]: v for k, v in b["parts"].items() if k.startswith("comm:")}}
    if plan.pp > 1:
        out["bubble_per_rank_s"] = {str(r["rank"]): r["cost_view"]["bubble"] for r in with_b}
    return out


def _memory(per_rank: list[dict[str, Any]], measured: dict[str, Any],
            predicted: dict[str, Any]) -> None:
    """Memory, the max over ranks (the cost model's "most loaded device"), measured and
    predicted; and whether every rank's model states equal their prediction."""
    rows = [r for r in per_rank if r["memory"].get("model_states")]
    if not rows:
        return

    def mx(get: Any) -> float:
        return max(get(r) for r in rows)
    states = ("params", "grads", "optimizer")
    measured["memory"] = {
        **{k: mx(lambda r, k=k: r["memory"]["model_states"][k]) for k in states},
        "model_states": mx(lambda r: r["memory"]["model_states"]["total"]),
        "optimizer_step_counters": mx(lambda r: r["memory"]["model_states"]["optimizer_step_counters"]),
        "activations": mx(lambda r: r["memory"].get("activations", 0))}
    predicted["memory"] = {
        **{k: mx(lambda r, k=k: r["predicted_memory"][k]) for k in states},
        "model_states": mx(lambda r: r["predicted_memory"]["total"]),
        "activations": mx(lambda r: r["predicted_memory"]["activations"])}
    measured["memory"]["model_states_equal_per_rank"] = all(
        r["memory"]["model_states"][k] == r["predicted_memory"][k] for r in rows for k in states)


def _ratios(measured: dict[str, Any], predicted: dict[str, Any]) -> dict[str, Any]:
    """measured / predicted for every headline figure, breakdown part and memory part."""
    out: dict[str, Any] = {
        k: ratio(measured.get(k), predicted.get(k))
        for k in ("step_time_s", "tokens_per_s", "tokens_per_s_per_device", "samples_per_s",
                  "tflops_per_device", "mfu", "hfu")}
    if "breakdown" in measured:
        out["breakdown"] = {k: ratio(measured["breakdown"][k], predicted["breakdown"][k])
                            for k in STEP_PARTS}
    if "memory" in measured:
        out["memory"] = {k: ratio(measured["memory"][k], predicted["memory"][k])
                         for k in predicted["memory"]}
    return out


def _f(x: Any, fmt: Any) -> str:
    return "-" if x is None else fmt(x)


PROFILER_INFLATION = 1.15
"""A profiled step longer than this times the clean steps gets a note under the table."""


def comparison_table(s: dict[str, Any]) -> str:
    """The predicted-vs-measured table printed at the end of ``ptd train``."""
    m, p = s["measured"], s["predicted"]
    rows: list[tuple[str, str, str, str]] = []

    def add(label: str, mv: Any, pv: Any, fmt: Any, rv: Any = "auto") -> None:
        if rv == "auto":
            rv = ratio(mv, pv)
        rows.append((label, _f(mv, fmt), _f(pv, fmt), "-" if rv is None else f"{rv:.2f}"))

    add("step time", m["step_time_s"], p["step_time_s"], duration)
    mb, pb = m.get("breakdown"), p.get("breakdown", {})
    if mb:
        for k in STEP_PARTS:
            if k in ("ep_comm", "cp_comm") and not (mb.get(k) or pb.get(k)):
                continue  # dimensions the run does not use
            label = ("  " if k in ("forward", "backward", "recompute") else "") + "  " + k
            add(label, mb[k], pb.get(k), duration)
        add("  data wait", mb["data"], None, duration, None)
        add("  other (loss, python)", mb["other"], None, duration, None)
        add(f"  (profiled step, rank {m['breakdown_rank']})", m["profiled_step_time_s"], None,
            duration, None)
    add("tokens/s", m["tokens_per_s"], p["tokens_per_s"], lambda x: si(x))
    add("tokens/s per device", m["tokens_per_s_per_device"], p["tokens_per_s_per_device"], si)
    add("TFLOP/s per device", m["tflops_per_device"], p["tflops_per_device"], lambda x: f"{x:.4f}")
    add("MFU", m["mfu"], p["mfu"], pct)
    add("HFU", m["hfu"], p["hfu"], pct)
    mm, pm = m.get("memory"), p.get("memory")
    if mm and pm:
        for k in ("params", "grads", "optimizer", "model_states", "activations"):
            add(f"{k} (max rank)", mm[k], pm[k], lambda x: gib(x, 4))
    lines = [f"ptd: measured vs predicted ({s['prediction']['hardware']}: "
             f"{s['prediction']['hardware_source']})",
             table(rows, header=("", "measured", "predicted", "ratio"), align="lrrr")]
    prof, clean = m.get("profiled_step_time_s"), m.get("step_time_s")
    if mb and prof and clean and prof > PROFILER_INFLATION * clean:
        # torch.profiler records every operator on the host: where the host issues the
        # work (a GPU) a thin model's profiled step can take a third longer than a clean one
        # (GPT-2 1.5B on an H200: 283-332 against 238-256 ms, docs/gpu-h100.md)
        lines.append(f"ptd: the profiled step took {prof / clean:.2f}x the clean steps: its parts "
                     "above carry the profiler's own cost; the step time is the clean steps'")
    if mm:
        lines.append("ptd: model states equal the prediction on every rank: "
                     + ("yes" if mm.get("model_states_equal_per_rank") else "NO"))
    est = s["prediction"].get("estimate", {})
    if mm and pm and est.get("plan", {}).get("zero", 0) >= 1:
        # the tracker follows every storage the step creates; FSDP's gathers and unreduced
        # gradients are among them, the cost model's buffers (docs/measuring.md)
        buffers = est.get("memory_per_device_bytes", {}).get("buffers")
        lines.append("ptd: under ZeRO the measured activation peak also holds FSDP's gathered "
                     "parameters and unreduced gradients, which the prediction counts apart as "
                     f"buffers ({gib(buffers, 4) if buffers else '-'} on the most loaded rank)")
    ce = m.get("comm_exposed_s")
    if ce is not None:
        tot = m.get("comm_total_s", {})
        kinds = sorted(set(ce) | set(tot))
        lines.append("ptd: communication per kind on rank %d (exposed / total): " % m["breakdown_rank"]
                     + (", ".join(f"{k} {duration(ce.get(k, 0.0))} / {duration(tot.get(k, 0.0))}"
                                  for k in kinds) or "none"))
    return "\n".join(lines)


def write_json(path: Path, obj: Any) -> None:
    from ..safeio import atomic_write_text, dumps_strict
    atomic_write_text(path, dumps_strict(obj, indent=2, default=str) + "\n")

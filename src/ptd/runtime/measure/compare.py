"""Predicted vs measured: the cost model for the run's own model, plan and hardware, beside
what the probe measured, part by part, with their ratio (measured / predicted).

Pure Python apart from what it is handed (no torch), so ``ptd report`` and ``ptd bench``
use it on saved results too.

**The prediction** is :func:`ptd.cost.estimate.estimate` for the resolved plan on the run's
hardware (``TrainConfig.hardware``; ``auto``: this machine's profile,
:func:`ptd.runtime.calibrate.first_run.machine_profile`, else the one ``ptd calibrate``
wrote, ``$PTD_HOME/hardware/calibrated.toml``, else the device's preset) with as
many devices as the run has workers, and per rank
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
dp_comm_exposed     exposed collectives of the gradient reduction: DDP's bucket
                    all-reduces, FSDP's all-gathers and reduce-scatters, the runner's
                    explicit gradient average (with its packing copies)
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

from ...cost import metrics as M
from ...fmt import duration, gib, pct, si, table

STEP_PARTS = ("compute", "forward", "backward", "recompute", "tp_comm", "pp_comm",
              "dp_comm_exposed", "bubble", "optimizer")


def resolve_hardware(name: str, device: str = "cpu") -> tuple[Any, str]:
    """(HardwareSpec, where it came from) for a ``TrainConfig.hardware`` value."""
    from ...specs.hardware import hardware_home, load_hardware
    if name in ("auto", ""):
        from ..calibrate.first_run import machine_profile
        for prof in (machine_profile(), hardware_home() / "calibrated.toml"):
            if prof.is_file():
                return load_hardware(str(prof)), str(prof)
        name = "cpu" if device == "cpu" else "h100-sxm"
        return load_hardware(name), f"preset {name} (no calibrated profile in {hardware_home()})"
    hw = load_hardware(name)
    path = hardware_home() / f"{name}.toml"
    return hw, (str(path) if path.is_file() and name == hw.name else f"preset {name}")


def predict(model: Any, plan: Any, hardware: Any) -> Any:
    from ...cost.estimate import estimate
    from ...specs import ClusterSpec
    return estimate(model, ClusterSpec(hardware, plan.world_size), plan)


def predicted_rank_memory(model: Any, plan: Any, pp_rank: int, dp_rank: int,
                          hardware: Any = None) -> dict[str, float]:
    from ...cost.estimate import CostOptions, fused_norm
    from ...cost.memory import activation_bytes, model_state_elements, state_bytes_per_param
    e = model_state_elements(model, plan, pp_rank, dp_rank)
    pb, gb, ob = state_bytes_per_param(plan.dtype, "ptd")
    d = {"params": e.params * pb, "grads": e.grads * gb, "optimizer": e.optimizer * ob}
    d["total"] = d["params"] + d["grads"] + d["optimizer"]
    fused = fused_norm(CostOptions(), hardware) if hardware is not None else True
    d["activations"] = activation_bytes(model, plan, pp_rank=pp_rank, fused_norm=fused)
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
                    dest = "pp_comm"
                elif kind in ("all_gather", "reduce_scatter"):
                    dest = "dp_comm_exposed" if plan.zero >= 3 else "tp_comm"
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


def _ratio(m: float | None, p: float | None) -> float | None:
    if m is None or p is None or not p or not math.isfinite(m):
        return None
    return m / p


def build_report(cfg: Any, ranks: Sequence[dict[str, Any]], clean_steps: Sequence[int],
                 summary: dict[str, Any]) -> dict[str, Any]:
    """``measured``, ``predicted``, ``ratio`` (and ``per_rank``, ``hardware``, ``notes``)
    for ``summary.json`` from every rank's :meth:`Probe.local_result`."""
    from ...cost.flops import flops_per_token
    plan, model = cfg.plan, cfg.model
    hw, hw_src = resolve_hardware(cfg.hardware, str(summary.get("device", "cpu")).split(":")[0])
    est = predict(model, plan, hw)
    n = plan.world_size
    r0 = ranks[0]
    times = r0["step_times"]
    clean = [times[s] for s in clean_steps if s in times] or list(times.values())
    step_s = sum(clean) / len(clean)
    tokens_per_s = plan.tokens_per_step / step_s
    fl = flops_per_token(model, plan.seq_len, plan.recompute)
    peak = hw.peak(plan.dtype)

    measured: dict[str, Any] = {
        "step_time_s": step_s,
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_device": tokens_per_s / n,
        "samples_per_s": plan.global_batch / step_s,
        "samples_per_s_per_device": plan.global_batch / step_s / n,
        "tflops_per_device": fl.model * tokens_per_s / n / 1e12,
        "hardware_tflops_per_device": fl.hardware * tokens_per_s / n / 1e12,
        "mfu": M.mfu(fl.model, tokens_per_s, peak, n),
        "hfu": M.hfu(fl.hardware, tokens_per_s, peak, n),
        "clean_steps": list(clean_steps),
    }
    predicted: dict[str, Any] = {
        "step_time_s": est.step.total,
        "tokens_per_s": est.tokens_per_s,
        "tokens_per_s_per_device": est.tokens_per_s / n,
        "samples_per_s": est.samples_per_s,
        "samples_per_s_per_device": est.samples_per_s / n,
        "tflops_per_device": fl.model * est.tokens_per_s / n / 1e12,
        "hardware_tflops_per_device": fl.hardware * est.tokens_per_s / n / 1e12,
        "mfu": est.mfu,
        "hfu": est.hfu,
    }

    # --- breakdown: every rank, then the critical one in the cost model's terms
    per_rank = []
    for r in ranks:
        c = r["coords"]
        pm = predicted_rank_memory(model, plan, c["pp"], c["dp"], hw)
        row: dict[str, Any] = {"rank": r["rank"], "coords": c, "memory": r["memory"],
                               "predicted_memory": pm}
        b = r["breakdown"]
        if b is not None:
            row["breakdown"] = b
            row["cost_view"] = cost_view(b["parts"], b["comm_exposed_by_phase"], plan)
        if r.get("timeline"):
            row["timeline"] = r["timeline"]  # (label, start ms, end ms) of the last profiled step
        per_rank.append(row)
    with_b = [r for r in per_rank if "cost_view" in r]
    if with_b:
        crit = max(with_b, key=lambda r: r["cost_view"]["compute"])
        cv = crit["cost_view"]
        prof_step = crit["breakdown"]["step"]
        measured["breakdown_rank"] = crit["rank"]
        measured["profiled_step_time_s"] = prof_step
        measured["breakdown"] = {k: cv[k] for k in (*STEP_PARTS, "data", "other")}
        measured["breakdown_parts"] = crit["breakdown"]["parts"]
        measured["breakdown_sum_s"] = sum(v for k, v in cv.items()
                                          if k not in ("forward", "backward", "recompute"))
        measured["comm_total_s"] = crit["breakdown"]["comm_total"]
        measured["comm_exposed_s"] = {k[5:]: v for k, v in crit["breakdown"]["parts"].items()
                                      if k.startswith("comm:")}
        if plan.pp > 1:
            measured["bubble_per_rank_s"] = {str(r["rank"]): r["cost_view"]["bubble"]
                                             for r in with_b}
    st = est.step
    predicted["breakdown"] = {k: getattr(st, k) for k in STEP_PARTS}
    predicted["breakdown"]["dp_comm_total"] = st.dp_comm_total

    # --- memory: max over ranks (the cost model's "most loaded device"), and per rank
    mem_rows = [r for r in per_rank if r["memory"].get("model_states")]
    if mem_rows:
        def mx(get: Any) -> float:
            return max(get(r) for r in mem_rows)
        measured["memory"] = {
            "params": mx(lambda r: r["memory"]["model_states"]["params"]),
            "grads": mx(lambda r: r["memory"]["model_states"]["grads"]),
            "optimizer": mx(lambda r: r["memory"]["model_states"]["optimizer"]),
            "model_states": mx(lambda r: r["memory"]["model_states"]["total"]),
            "optimizer_step_counters": mx(lambda r: r["memory"]["model_states"]["optimizer_step_counters"]),
            "activations": mx(lambda r: r["memory"].get("activations", 0)),
        }
        predicted["memory"] = {
            "params": mx(lambda r: r["predicted_memory"]["params"]),
            "grads": mx(lambda r: r["predicted_memory"]["grads"]),
            "optimizer": mx(lambda r: r["predicted_memory"]["optimizer"]),
            "model_states": mx(lambda r: r["predicted_memory"]["total"]),
            "activations": mx(lambda r: r["predicted_memory"]["activations"]),
        }
        measured["memory"]["model_states_equal_per_rank"] = all(
            r["memory"]["model_states"][k] == r["predicted_memory"][k]
            for r in mem_rows for k in ("params", "grads", "optimizer"))

    ratio: dict[str, Any] = {}
    for k in ("step_time_s", "tokens_per_s", "tokens_per_s_per_device", "samples_per_s",
              "tflops_per_device", "mfu", "hfu"):
        ratio[k] = _ratio(measured.get(k), predicted.get(k))
    if "breakdown" in measured:
        ratio["breakdown"] = {k: _ratio(measured["breakdown"][k], predicted["breakdown"][k])
                              for k in STEP_PARTS}
    if "memory" in measured:
        ratio["memory"] = {k: _ratio(measured["memory"][k], predicted["memory"][k])
                           for k in predicted["memory"]}
    return {"measured": measured, "predicted": predicted, "ratio": ratio,
            "per_rank": per_rank,
            "prediction": {"hardware": hw.name, "hardware_source": hw_src,
                           "peak_flops": peak, "flops_per_token": {"model": fl.model,
                                                                   "hardware": fl.hardware},
                           "estimate": est.to_json()}}


def _f(x: Any, fmt: Any) -> str:
    return "-" if x is None else fmt(x)


def comparison_table(s: dict[str, Any]) -> str:
    """The predicted-vs-measured table printed at the end of ``ptd train``."""
    m, p = s["measured"], s["predicted"]
    rows: list[tuple[str, str, str, str]] = []

    def add(label: str, mv: Any, pv: Any, fmt: Any, rv: Any = "auto") -> None:
        if rv == "auto":
            rv = _ratio(mv, pv)
        rows.append((label, _f(mv, fmt), _f(pv, fmt), "-" if rv is None else f"{rv:.2f}"))

    add("step time", m["step_time_s"], p["step_time_s"], duration)
    mb, pb = m.get("breakdown"), p.get("breakdown", {})
    if mb:
        for k in ("compute", "forward", "backward", "recompute", "tp_comm", "pp_comm",
                  "dp_comm_exposed", "bubble", "optimizer"):
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
    if mm:
        lines.append("ptd: model states equal the prediction on every rank: "
                     + ("yes" if mm.get("model_states_equal_per_rank") else "NO"))
    ce = m.get("comm_exposed_s")
    if ce is not None:
        tot = m.get("comm_total_s", {})
        kinds = sorted(set(ce) | set(tot))
        lines.append("ptd: communication per kind on rank %d (exposed / total): " % m["breakdown_rank"]
                     + (", ".join(f"{k} {duration(ce.get(k, 0.0))} / {duration(tot.get(k, 0.0))}"
                                  for k in kinds) or "none"))
    return "\n".join(lines)


def write_json(path: Path, obj: Any) -> None:
    from ...safeio import atomic_write_text, dumps_strict
    atomic_write_text(path, dumps_strict(obj, indent=2, default=str) + "\n")

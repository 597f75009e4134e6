"""From raw worker timings to fits and a hardware profile (pure Python, no torch).

* matmul: each timed call is the three products of a linear layer's training step on
  ``s x s`` matrices (``X W^T``, ``dY W``, ``dY^T X``: ``3 x 2 s^3`` FLOPs); per worker,
  ``t = 3 c + 6 s^3 / R`` over the sizes (relative-error least squares, :mod:`.fit`), ``c``
  the per-product overhead; ``R`` averaged over the workers that ran at once.
* matmul shapes: each timed call is a linear layer's three products with forward
  ``(m, n, k)``; its rate over ``R``, after the drift between the fit and the sweep is taken
  out (the fit's largest square call, timed again around the sweep: :func:`.bench.gemm_shapes`).
* memory: bytes read + written per second of a large copy (2 passes) and add (3 passes);
  the profile keeps their mean.
* operator overhead: seconds per call of a 1-element add, a view, and an add that records
  autograd history; the profile keeps their mean (the cost model's operator counts mix
  all three kinds).
* attention: causal SDPA forward + backward counted at ``3.5 x 0.5 x 4 b h s^2 d`` FLOPs (two
  products forward, 2.5 backward, half of them masked), over the matmul rate ``R`` of the
  same dtype and worker count; the median of the default shapes is ``attention_efficiency``,
  and every shape measured at the smallest worker count (a model's own with ``--model``)
  goes to ``attention_shapes_measured``.
* collectives: ``t = alpha + bus_factor(kind, g) M / busbw`` with ``bus_factor`` from
  :mod:`ptd.cost.comm`, so the fit means what the cost model reads.
* blocking collectives (CPU): per workers at once, ``(chunk, wait)`` points -- the mean
  time of an all-reduce after a chunk of matmuls less what the all-reduce fit charges for it.
* blocking collectives in one group of all the workers (CPU, more than 2): the same, keyed
  by the group's size, less that size's all-reduce fit.
* DTensor all-reduce (CPU): per workers at once, ``(bytes, extra)`` points -- what reducing
  a ``Partial`` DTensor costs beyond the plain all-reduce and beyond the same call on a
  one-rank mesh, the mean over the active ranks.
* tp collectives in place (CPU): per workers at once, ``(bytes, residual)`` points -- what
  each all-reduce of the calibration's tp model costs beyond the three parts above, as
  the cost model adds them (:func:`tp_residual`).
* ZeRO-3 in place (CPU): per workers at once, ``(bytes, residual)`` points -- what each
  gather of the calibration's model under ZeRO-3 costs beyond everything the cost model
  prices it at (:func:`fsdp_residual`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from ...cost.comm import bus_factor, collective_time, latency_steps
from ...specs.hardware import ClusterSpec, HardwareSpec, hardware_from_dict
from ...specs.plan import ParallelPlan
from .fit import LinearFit, fit_linear, mean, median


MEMORY_PASSES = {"copy": 2, "add": 3}
"""Buffers each timed memory pass moves (a copy reads one and writes one; an add reads two,
writes one): a pass's bandwidth is that many buffers over its seconds, and the profile's
memory bandwidth is the passes' mean (``ptd bench``'s drift probe reads it the same way)."""


def memory_bandwidth(seconds: dict[str, float], nbytes: int) -> float:
    """The mean over :data:`MEMORY_PASSES` of each pass's bytes per second (``seconds``:
    each pass's time on buffers of ``nbytes``)."""
    return mean([b * nbytes / seconds[k] for k, b in MEMORY_PASSES.items()])


def moments_mean(points: list[dict[str, float]]) -> dict[str, float]:
    """Each memory pass's seconds at the calibration's moments, averaged: the time a run
    that meets each moment's machine as often takes -- the mean of the seconds, not of the
    bandwidths (a pass of B bytes at 1 s and at 3 s prices 2 s, B/2 a second, where the
    bandwidths' mean would give 2B/3 a second)."""
    return {k: mean([p[k] for p in points]) for k in points[0]}


BLOCKING_SIDE = 256
"""The blocking-wait loop's matmuls are this many squared, fp32 (``bench.blocking_curve``
times them, :func:`_blocking_curves` prices them at the measured rate)."""


def _gemm_flops(size: str) -> float:
    """FLOPs of one timed matmul call: three ``s x s x s`` products."""
    return 3 * 2.0 * int(size) ** 3


def attention_flops(shape: str) -> float:
    b, h, s, d = map(int, shape.split("x"))
    return 3.5 * 0.5 * 4.0 * b * h * s * s * d


def _fit_dict(f: LinearFit) -> dict[str, Any]:
    return {"rms_rel_err": f.rms_rel_err, "max_rel_err": f.max_rel_err, "clamped": f.clamped}


def summarize(plan: dict, results: list[dict]) -> dict[str, Any]:
    """Fits and tables from every rank's raw timings (see :func:`launch.run_workers`)."""
    gemm: dict[str, dict[int, dict]] = {}
    memory: dict[int, dict] = {}
    overhead: dict[int, dict] = {}
    framework: dict[str, dict[int, float]] = {}
    moe_layer: dict[str, dict[int, list[list[float]]]] = {}
    attention: dict[str, dict[int, dict]] = {}
    for n in plan["workers"]:
        per = [r["compute"][str(n)] for r in results if str(n) in r["compute"]]
        for dt in plan["dtypes"]:
            fits = []
            for p in per:
                pts = p["gemm"][dt]
                fits.append(fit_linear([_gemm_flops(s) for s in pts], list(pts.values())))
            sizes = per[0]["gemm"][dt].keys()
            rate = mean([1.0 / f.slope for f in fits])
            by_size = {int(s): mean([_gemm_flops(s) / p["gemm"][dt][s] for p in per])
                       for s in sizes}
            if plan.get("device") == "cuda":
                # A GPU's small products are bound by their launch from Python, and the fit's
                # slope then overshoots (1021 TFLOP/s on an H200 of 989 peak, a quick
                # calibration, 2026-11-27): the best rate measured stands instead, and the
                # cost model adds each product's launch (``kernel_launch``) itself.
                rate = max(by_size.values())
            gemm.setdefault(dt, {})[n] = {
                "rate": rate, "call_overhead": mean([f.intercept for f in fits]) / 3,
                "rms_rel_err": max(f.rms_rel_err for f in fits),
                "max_rel_err": max(f.max_rel_err for f in fits),
                "sizes": by_size}
            att = {}
            for shape in per[0]["attention"][dt]:
                r = mean([attention_flops(shape) / p["attention"][dt][shape] for p in per])
                att[shape] = {"flops_per_s": r, "ratio": r / rate}
            attention.setdefault(dt, {})[n] = att
        nbytes = plan["mem_bytes"] // 4 * 4
        # each pass's seconds: the moments' mean (timings of a ptd before 2026-11-29 timed
        # memory once, as "memory")
        secs = [moments_mean(p["memory_points"]) if "memory_points" in p else p["memory"]
                for p in per]
        bw = {k: mean([b * nbytes / t[k] for t in secs]) for k, b in MEMORY_PASSES.items()}
        memory[n] = dict(bw, value=mean(list(bw.values())))
        if "memory_points" in per[0]:  # each moment's bandwidth, the ranks' mean
            memory[n]["moments"] = [mean([memory_bandwidth(p["memory_points"][i], nbytes)
                                          for p in per])
                                    for i in range(len(per[0]["memory_points"]))]
        if "activation" in secs[0]:  # (results of an older ptd have none)
            memory[n]["activation"] = mean([5 * nbytes / t["activation"] for t in secs])
        if "overhead" in per[0]:
            ov = {k: mean([p["overhead"][k] for p in per]) for k in per[0]["overhead"]}
            # ptd's own model's operators where measured (the bare operators' mean priced
            # them about 3x too cheap: bench.model_op_cost), else that mean
            overhead[n] = dict(ov, value=ov["model"] if "model" in ov else mean(list(ov.values())))
        if "framework" in per[0]:
            for k in per[0]["framework"]:
                framework.setdefault(k, {})[n] = mean([p["framework"][k] for p in per])
        for key, pts in per[0].get("moe_layer", {}).items():  # the ranks' mean, point by point
            moe_layer.setdefault(key, {})[n] = [
                [t, mean([p["moe_layer"][key][i][1] for p in per]),
                 mean([p["moe_layer"][key][i][2] for p in per])] for i, (t, _, _) in enumerate(pts)]
    collectives = []
    for key in sorted((k for k in results[0]["collectives"] if ":" in k),
                      key=lambda k: (int(k.split(":")[1]), k)):
        kind, g = key.split(":")[0], int(key.split(":")[1])
        members = [r["collectives"][key] for r in results if key in r["collectives"]]
        sizes = sorted(members[0], key=int)
        ts = [mean([m[s] for m in members]) for s in sizes]
        f = fit_linear([bus_factor(kind, g) * int(s) for s in sizes], ts)
        collectives.append({"kind": kind, "group_size": g, "alpha": f.intercept,
                            "bus_bandwidth": 1.0 / f.slope, **_fit_dict(f),
                            "times": {int(s): t for s, t in zip(sizes, ts)}})
    # pairs' loops by workers at once, and one group of all the workers by its size
    blocking, blocking_group = (
        _blocking_curves(results, collectives, plan.get("blocking_bytes", 0), gemm.get("fp32", {}),
                         plan.get("blocking_side", BLOCKING_SIDE), key)
        for key in ("blocking", "blocking_group"))
    dtensor_reduce = _dtensor_reduce_points(results)
    # FSDP2's per-unit work where a real group timed it (bench.fsdp_unit_group_costs) stands
    # for the one-rank figure, which leaves its collectives' work out; the one-rank one stays
    # where no group could (one worker)
    fsdp_group = _fsdp_group(results)
    for n, costs in fsdp_group.items():
        for k, v in costs.items():
            framework.setdefault(k, {})[n] = v
    missing: dict[str, str] = {}
    for r in results:
        missing.update(r.get("missing", {}))
    primary = plan["dtypes"][0]
    ratios = [a["ratio"] for per_n in attention.get(primary, {}).values() for a in per_n.values()]
    w0 = plan["workers"][0]
    shapes: dict[str, dict[str, list[float]]] = {}
    for r in results:  # the sweep ran on the smallest worker count; its ranks agree on shapes
        comp = r["compute"].get(str(w0), {})
        for dt, t in comp.get("gemm_shapes", {}).items():
            ref = comp["gemm_shapes_ref"][dt]
            # the rate the fit stage measured at the reference size over the rate the sweep
            # measured there: the machine's drift between the two stages, taken out
            drift = ref["seconds"] / comp["gemm"][dt][str(ref["size"])]
            for key, sec in t.items():
                m, n, k = map(int, key.split("x"))  # three products: a linear layer's step
                shapes.setdefault(dt, {}).setdefault(key, []).append(
                    3 * 2.0 * m * n * k / sec * drift)
    # relative to the fitted rate R at the same worker count, which the cost model scales
    # to other worker counts
    attention_shapes: dict[str, dict[str, float]] = {}
    for dt, per_n in attention.items():  # the default shapes at w0, then a model's own
        attention_shapes[dt] = {key: a["ratio"] for key, a in per_n.get(w0, {}).items()}
    model_att: dict[str, dict[str, list[float]]] = {}
    for r in results:
        for dt, t in r["compute"].get(str(w0), {}).get("attention_model", {}).items():
            for key, sec in t.items():
                model_att.setdefault(dt, {}).setdefault(key, []).append(attention_flops(key) / sec)
    for dt, t in model_att.items():
        for key, rates in t.items():
            attention_shapes.setdefault(dt, {})[key] = mean(rates) / gemm[dt][w0]["rate"]
    gemm_shapes = {dt: {key: mean(v) / gemm[dt][w0]["rate"] for key, v in t.items()}
                   for dt, t in shapes.items()}
    return {"gemm": gemm, "gemm_shapes": gemm_shapes, "memory": memory, "overhead": overhead,
            "framework": framework, "moe_layer": moe_layer,
            "attention": attention, "attention_shapes": attention_shapes,
            "attention_ratio": median(ratios) if ratios else None,
            "attention_dtype": primary, "collectives": collectives, "blocking": blocking,
            "blocking_group": blocking_group, "dtensor_reduce": dtensor_reduce,
            "fsdp_group": fsdp_group, "tp_situ": _tp_situ_points(results),
            "fsdp_situ": _fsdp_situ_points(results),
            "missing": missing}


def _blocking_curves(results: list[dict], fits: list[dict], nbytes: int,
                     gemm: dict[int, dict] | None = None, side: int = BLOCKING_SIDE,
                     key: str = "blocking") -> dict[int, list[list[float]]]:
    """Workers at once -> ``[chunk s, wait s, all-reduce s, chunk as timed s(, chunk alone
    s)]`` points, by chunk: the mean over the active ranks of what a chunk of ``k`` matmuls
    and the all-reduce after it cost (``bench.blocking_curve``) less what the cost model
    already charges for them -- the all-reduce's fit (the group-of-2 fit, or where there is
    none the back-to-back call of the same loop) and the chunk, as the same workers computed
    it alone right before the loop (where the results hold that; else the chunk's products
    at the matmul rate measured with as many workers at once). The point stands at the
    chunk as the cost model prices it: its products at that matmul rate (``gemm``: fp32 by
    workers, its ``side`` x ``side`` rate where measured). Why the chunk alone, not the
    chunk as timed in the loop: where workers outnumber cores, a chunk computed with all of
    them busy already holds the time each waits for a core; a peer that was descheduled
    during its chunk arrives late by the same time. (4 workers on 2 cores, 2026-11-28: 8
    matmuls of 256 took 3.9 ms and the all-reduce after them 4.6, where 8 products at the
    4-worker rate cost 5.9: 2.4 ms more than the cost model charges, not 4.3.) Why timed
    alone in the same stage, not priced from the matmul stage: the machine's speed moves
    between stages by more than the wait (docs/measuring.md, "Thirteenth session").
    Without ``gemm``: the chunks as timed, the all-reduce less its fit.
    ``key="blocking_group"``: the loop in one group of ``n`` workers (``n`` all the
    workers), less that group size's fit."""
    curves: dict[int, list[list[float]]] = {}
    per_n = [r["collectives"][key] for r in results if key in r.get("collectives", {})]
    for n in sorted({n for b in per_n for n in b}, key=int):
        size = int(n) if key == "blocking_group" else 2
        fit = next((c for c in fits if c["kind"] == "all_reduce" and c["group_size"] == size),
                   None)
        ranks = [b[n] for b in per_n if n in b]
        # (chunk, all-reduce, chunk alone or None where an older ptd measured none)
        pts = {k: (mean([r[k][0] for r in ranks]), mean([r[k][1] for r in ranks]),
                   mean([r[k][2] for r in ranks]) if len(ranks[0][k]) > 2 else None)
               for k in ranks[0]}
        base = (fit["alpha"] + bus_factor("all_reduce", size) * nbytes / fit["bus_bandwidth"]
                if fit else pts.get("0", (0.0, min(p[1] for p in pts.values())))[1])
        g = (gemm or {}).get(int(n))
        rate = (g["sizes"].get(side, g["rate"]) if g else 0.0)
        out = []
        for k, (c, t, alone) in pts.items():
            priced = int(k) * 2.0 * side**3 / rate if rate else c
            charged = alone if alone is not None and rate else priced
            out.append([priced, max(0.0, c + t - base - charged), t, c]
                       + ([alone] if alone is not None else []))
        curves[int(n)] = sorted(out)
    return curves


def _fsdp_group(results: list[dict]) -> dict[int, dict[str, float]]:
    """Workers at once -> FSDP2's per-unit seconds by key, the mean over the group's ranks
    of ``bench.fsdp_unit_group_costs``."""
    per_n: dict[int, list[dict[str, float]]] = {}
    for r in results:
        for n, costs in r.get("collectives", {}).get("fsdp_group", {}).items():
            per_n.setdefault(int(n), []).append(costs)
    return {n: {k: mean([c[k] for c in cs]) for k in cs[0]} for n, cs in sorted(per_n.items())}


def _dtensor_reduce_points(results: list[dict]) -> dict[int, list[list[float]]]:
    """Workers at once -> ``[bytes, extra s, plain s, DTensor s, one-rank s]`` by size: the
    mean over the active ranks of ``bench.dtensor_reduce_curve``'s medians; the extra is
    not negative (a reduction through DTensor does everything the plain call does)."""
    per_n = [r["collectives"]["dtensor_reduce"] for r in results
             if "dtensor_reduce" in r.get("collectives", {})]
    out: dict[int, list[list[float]]] = {}
    for n in sorted({n for d in per_n for n in d}, key=int):
        ranks = [d[n] for d in per_n if n in d]
        out[int(n)] = [[float(b), max(0.0, mean([r[b][3] for r in ranks])),
                        *(mean([r[b][i] for r in ranks]) for i in range(3))]
                       for b in sorted(ranks[0], key=int)]
    return out


def tp_residual(point: dict[str, Any], hw: HardwareSpec, workers: int) -> float:
    """Seconds each all-reduce of one ``tp_situ.tp_situ`` point cost beyond what the cost
    model charges a tp collective from ``hw``'s other tables: the pair's step less the
    one-rank mesh's (everything the pair's collectives cost, in place), less, for each
    all-reduce, its fit (a group of 2), DTensor's extra (``dtensor_reduce_at``) and the
    blocking wait after the mean chunk of work between two of them (the one-rank step
    over their count), shared equally among them. Negative where those parts charge more
    than the step took."""
    n = sum(c for _, c in point["all_reduces"])
    priced = sum(c * (collective_time("all_reduce", b, 2, hw) + hw.dtensor_reduce_at(b, workers))
                 for b, c in point["all_reduces"])
    priced += n * hw.blocking_wait_at(point["one"] / n, workers, 2)
    return (point["tp"] - point["one"] - priced) / n


def _tp_situ_points(results: list[dict]) -> dict[int, list[dict[str, Any]]]:
    """Workers at once -> ``tp_situ.tp_situ``'s points by micro-batch, their times the mean
    over the active ranks."""
    per_n = [r["collectives"]["tp_situ"] for r in results if "tp_situ" in r.get("collectives", {})]
    out: dict[int, list[dict[str, Any]]] = {}
    for n in sorted({n for d in per_n for n in d}, key=int):
        ranks = [d[n] for d in per_n if n in d]
        out[int(n)] = [dict(p, tp=mean([r[i]["tp"] for r in ranks]),
                            one=mean([r[i]["one"] for r in ranks]))
                       for i, p in enumerate(ranks[0])]
    return out


def fsdp_residual(point: dict[str, Any], hw: HardwareSpec, workers: int) -> float:
    """Seconds each gather of one ``fsdp_situ.fsdp_situ`` point cost beyond what the cost
    model charges ZeRO-3 from ``hw``'s other tables: the ZeRO-3 forward and backward less
    the plain model's (everything FSDP cost, in place), less what ``ptd estimate`` prices
    ZeRO-3 over that pair above the same computation (its forward and backward, which
    hold FSDP's copies and per-unit hooks, and its exposed communication, less the forward
    and backward of the same plan without ZeRO), shared among the gathers: each unit's
    forward and its backward gather it once. Negative where those parts charge more."""
    from ...cost.estimate import estimate
    from .fsdp_situ import SITU_MODEL, SITU_SEQ
    mb = point["tokens"] // SITU_SEQ
    zero3 = ParallelPlan(dp=2, zero=3, seq_len=SITU_SEQ, micro_batch=mb, global_batch=2 * mb)
    cluster = ClusterSpec(hw, workers)
    z = estimate(SITU_MODEL, cluster, zero3).step
    d = estimate(SITU_MODEL, cluster, dataclasses.replace(zero3, zero=0)).step
    priced = z.forward + z.backward + z.dp_comm_exposed - d.forward - d.backward
    return (sum(point["fsdp"]) - sum(point["plain"]) - priced) / (2 * point["units"])


def _fsdp_situ_points(results: list[dict]) -> dict[int, list[dict[str, Any]]]:
    """Workers at once -> ``fsdp_situ.fsdp_situ``'s point (a list of one), its times the
    mean over the active ranks."""
    per_n = [r["collectives"]["fsdp_situ"] for r in results
             if "fsdp_situ" in r.get("collectives", {})]
    out: dict[int, list[dict[str, Any]]] = {}
    for n in sorted({n for d in per_n for n in d}, key=int):
        ranks = [d[n] for d in per_n if n in d]
        out[int(n)] = [dict(ranks[0], **{k: [mean([r[k][i] for r in ranks]) for i in (0, 1)]
                                          for k in ("fsdp", "plain")})]
    return out


def profile_table(summary: dict, base: HardwareSpec, name: str, device: str,
                  memory_bytes: float | None, note: str) -> dict[str, Any]:
    """The ``[hardware]`` table: ``preset = base`` plus what was measured."""
    hw: dict[str, Any] = {"preset": base.name, "name": name}
    if device == "cpu":  # the run queues its workers share (ptd.cost.step._shared_time)
        hw["cpus"] = os.cpu_count() or 0
    gemm = summary["gemm"]
    hw["gemm_flops_measured"] = {dt: {str(n): v["rate"] for n, v in t.items()}
                                 for dt, t in gemm.items()}
    if summary.get("gemm_shapes"):
        hw["gemm_shapes_measured"] = summary["gemm_shapes"]
    mem = summary["memory"]
    hw["memory_bandwidth_measured"] = {str(n): v["value"] for n, v in mem.items()}
    one = mem[min(mem)]
    if "activation" in one:
        # SiLU's share of the bandwidth the cost model prices memory-bound passes at (one
        # worker alone; a CPU's exponential bounds it, not its memory)
        hw["eager_bandwidth_fraction"] = {"activation": min(2.0, one["activation"] / one["value"])}
    if device == "cpu":
        # The cpu preset's "peak" is what one worker alone achieves; keep that meaning.
        peak = dict(base.peak_flops)
        for dt, t in gemm.items():
            one = t[min(t)]
            peak[dt] = max([one["rate"], *one["sizes"].values()])
        hw.update(peak_flops=peak, gemm_efficiency=1.0, memory_efficiency=1.0,
                  memory_bandwidth=mem[min(mem)]["value"])
    if summary["overhead"]:
        ov = summary["overhead"]
        hw["op_overhead_measured"] = {str(n): v["value"] for n, v in ov.items()}
        hw["op_overhead"] = ov[min(ov)]["value"]
    for key, field in (("blocking", "blocking_wait_measured"),
                       ("blocking_group", "blocking_wait_group_measured")):
        if summary.get(key):  # (chunk as priced, wait) of each point
            hw[field] = {str(n): [[p[0], p[1]] for p in pts] for n, pts in summary[key].items()}
    if summary.get("dtensor_reduce"):
        hw["dtensor_reduce_measured"] = {str(n): [[p[0], p[1]] for p in pts]
                                         for n, pts in summary["dtensor_reduce"].items()}
    if summary.get("framework"):
        # seconds a call, kept above 0 (a stored 0 would read as not measured); a share (of
        # the work) may be 0: nothing grew
        hw["overheads_measured"] = {k: {str(n): max(v, 0.0 if k.endswith("_share") else 1e-9)
                                        for n, v in t.items()}
                                    for k, t in summary["framework"].items()}
    if summary.get("moe_layer"):
        hw["moe_layer_measured"] = {k: {str(n): pts for n, pts in t.items()}
                                    for k, t in summary["moe_layer"].items()}
    if summary["attention_ratio"]:
        hw["attention_efficiency"] = min(1.0, summary["attention_ratio"])
    if summary.get("attention_shapes"):
        hw["attention_shapes_measured"] = {dt: t for dt, t in summary["attention_shapes"].items() if t}
    if memory_bytes:
        hw["memory_bytes"] = float(memory_bytes)
    fits = summary["collectives"]
    if fits:
        hw["collectives"] = [{k: c[k] for k in ("kind", "group_size", "alpha", "bus_bandwidth")}
                             for c in fits]
        ar = [c for c in fits if c["kind"] == "all_reduce"]
        if ar:  # the link the cost model falls back to for anything not fitted
            c = max(ar, key=lambda c: c["group_size"])
            steps = min(latency_steps("all_reduce", c["group_size"], a) for a in ("ring", "tree"))
            hw["intra_node"] = {"bandwidth": c["bus_bandwidth"], "efficiency": 1.0,
                                "latency": c["alpha"] / max(steps, 1.0)}
    if summary.get("tp_situ") and hw.get("collectives"):
        # priced from the tables above (the residual is what they leave out), so last
        spec = hardware_from_dict(hw, name)
        hw["tp_situ_measured"] = {
            str(n): [[float(max(b for b, _ in p["all_reduces"])), tp_residual(p, spec, n)]
                     for p in pts]
            for n, pts in summary["tp_situ"].items()}
    if summary.get("fsdp_situ") and hw.get("collectives"):
        spec = hardware_from_dict(hw, name)  # (without this table: the residual is beyond it)
        hw["fsdp_situ_measured"] = {
            str(n): [[float(p["unit_bytes"]), fsdp_residual(p, spec, n)] for p in pts]
            for n, pts in summary["fsdp_situ"].items()}
    fields = sorted(k for k in hw if k not in ("preset", "name"))
    hw["sources"] = {"measured": f"{note}; fields: {', '.join(fields)}",
                     **{f"{base.name}_{k}": v for k, v in base.sources.items()}}
    for k, v in list(hw.items()):
        if isinstance(v, float) and not (math.isfinite(v) and v > 0):
            raise ValueError(f"calibration produced a bad {k}: {v}")
    return hw

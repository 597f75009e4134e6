"""HTML tables of a run's summary: predicted vs measured, memory and time per rank,
communication per kind. Every value goes through :func:`e` (HTML escaping).

The rows follow :func:`ptd.summary.compare.comparison_table` (the table printed at
the end of ``ptd train``), with the ratio (measured / predicted) of each row coloured when
it is off by more than :data:`OFF` either way.
"""

from __future__ import annotations

from html import escape
from typing import Any, Callable

from ..fmt import duration, gib, pct, si, step_ranges
from ..summary.compare import STEP_PARTS, ratio
from .load import num

OFF = 0.25
MEM_PARTS = ("params", "grads", "optimizer", "activations")


def e(x: Any) -> str:
    return escape("" if x is None else str(x), quote=True)


def f(x: Any, fmt: Callable[[float], str]) -> str:
    v = num(x)
    return "-" if v is None else fmt(v)


def ratio_cell(r: float | None) -> str:
    if r is None:
        return '<td class="r">-</td>'
    cls = "r"
    if abs(r - 1) > OFF:
        cls += " hi" if r > 1 else " lo"
    return f'<td class="{cls}" title="measured / predicted">{r:.2f}</td>'


def _table(header: list[str], body: list[str], cls: str = "") -> str:
    th = "".join(f"<th>{e(h)}</th>" for h in header)
    return (f'<table class="{e(cls)}"><thead><tr>{th}</tr></thead><tbody>'
            + "".join(body) + "</tbody></table>")


def _tflops(x: float) -> str:
    return f"{x:.4g}"


def comparison(s: dict[str, Any]) -> str:
    """Predicted vs measured, one row per quantity, with ratios."""
    m, p = s.get("measured") or {}, s.get("predicted") or {}
    if not m and not p:
        return '<p class="empty">no measurement and no prediction in summary.json</p>'
    rows: list[str] = []

    def add(label: str, key: str, mv: Any, pv: Any, fmt: Callable[[float], str],
            depth: int = 0, with_ratio: bool = True) -> None:
        r = ratio(num(mv), num(pv)) if with_ratio else None
        rc = ratio_cell(r)
        if with_ratio and num(pv) == 0 and (num(mv) or 0) > 0:
            rc = '<td class="r hi" title="the cost model predicts none">not predicted</td>'
        rows.append(f'<tr class="d{depth}" data-key="{e(key)}"><td>{e(label)}</td>'
                    f'<td class="r">{e(f(mv, fmt))}</td><td class="r">{e(f(pv, fmt))}</td>'
                    f"{rc}</tr>")

    add("step time", "step_time_s", m.get("step_time_s"), p.get("step_time_s"), duration)
    mb, pb = m.get("breakdown") or {}, p.get("breakdown") or {}
    if mb or pb:
        for k in STEP_PARTS:
            if k in ("ep_comm", "cp_comm") and not (num(mb.get(k)) or num(pb.get(k))):
                continue  # dimensions the run does not use (or a summary from before them)
            depth = 2 if k in ("forward", "backward", "recompute") else 1
            add(k, k, mb.get(k), pb.get(k), duration, depth)
        if mb:
            add("data wait", "data", mb.get("data"), None, duration, 1, False)
            add("other (loss, python)", "other", mb.get("other"), None, duration, 1, False)
            add(f"(profiled step, rank {m.get('breakdown_rank', '?')})", "profiled",
                m.get("profiled_step_time_s"), None, duration, 1, False)
    add("tokens/s", "tokens_per_s", m.get("tokens_per_s"), p.get("tokens_per_s"), si)
    add("tokens/s per device", "tokens_per_s_per_device", m.get("tokens_per_s_per_device"),
        p.get("tokens_per_s_per_device"), si)
    add("TFLOP/s per device", "tflops_per_device", m.get("tflops_per_device"),
        p.get("tflops_per_device"), _tflops)
    add("MFU", "mfu", m.get("mfu"), p.get("mfu"), pct)
    add("HFU", "hfu", m.get("hfu"), p.get("hfu"), pct)
    mm, pm = m.get("memory") or {}, p.get("memory") or {}
    for k in ("params", "grads", "optimizer", "model_states", "activations"):
        if k in mm or k in pm:
            add(f"{k} (max rank)", f"mem_{k}", mm.get(k), pm.get(k), lambda x: gib(x, 4))
    out = _table(["", "measured", "predicted", "ratio"], rows, "cmp")
    notes = []
    if not p:
        notes.append("no prediction in summary.json")
    if not m:
        notes.append("nothing measured: the run did not reach the end of training")
    if mm and "model_states_equal_per_rank" in mm:
        notes.append("model states equal the prediction on every rank: "
                     + ("yes" if mm["model_states_equal_per_rank"] else "NO"))
    if m.get("clean_steps"):
        notes.append("measured step time: mean of steps " + step_ranges(m["clean_steps"])
                     + " (no warm-up, memory or profiled step)")
    pr = s.get("prediction") or {}
    if pr.get("hardware"):
        notes.append(f"prediction for hardware {pr['hardware']} ({pr.get('hardware_source', '?')})")
    return out + "".join(f'<p class="note">{e(n)}</p>' for n in notes)


def per_rank_memory(s: dict[str, Any]) -> str:
    ranks = [r for r in s.get("per_rank") or [] if isinstance(r, dict)]
    if not ranks:
        return '<p class="empty">no per-rank results in summary.json</p>'
    header = ["rank", "pp", "dp", "tp"]
    for k in MEM_PARTS:
        header += [f"{k} measured", "predicted", "ratio"]
    body = []
    for r in ranks:
        c = r.get("coords") or {}
        mem = r.get("memory") or {}
        ms = mem.get("model_states") or {}
        pm = r.get("predicted_memory") or {}
        cells = [f"<td>{e(r.get('rank', '?'))}</td>"]
        cells += [f'<td class="r">{e(c.get(k, "-"))}</td>' for k in ("pp", "dp", "tp")]
        for k in MEM_PARTS:
            mv = mem.get(k) if k == "activations" else ms.get(k)
            pv = pm.get(k)
            cells.append(f'<td class="r">{e(f(mv, lambda x: gib(x, 4)))}</td>'
                         f'<td class="r">{e(f(pv, lambda x: gib(x, 4)))}</td>')
            cells.append(ratio_cell(ratio(num(mv), num(pv))))
        body.append("<tr>" + "".join(cells) + "</tr>")
    return _table(header, body, "mem")


TIME_COLS = ("compute", "tp_comm", "pp_comm", "ep_comm", "cp_comm", "dp_comm_exposed", "bubble", "optimizer",
             "data", "other")


def per_rank_time(s: dict[str, Any]) -> str:
    ranks = [r for r in s.get("per_rank") or [] if isinstance(r, dict) and r.get("cost_view")]
    if not ranks:
        return ""
    crit = (s.get("measured") or {}).get("breakdown_rank")
    body = []
    for r in ranks:
        cv, b = r["cost_view"], r.get("breakdown") or {}
        mark = " (breakdown rank)" if r.get("rank") == crit else ""
        cells = [f"<td>{e(r.get('rank', '?'))}{e(mark)}</td>",
                 f'<td class="r">{e(f(b.get("step"), duration))}</td>']
        cells += [f'<td class="r">{e(f(cv.get(k), duration))}</td>' for k in TIME_COLS]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return _table(["rank", "profiled step", *TIME_COLS], body, "time")


def communication(s: dict[str, Any]) -> str:
    """Collective time per kind, total vs exposed (not hidden behind compute), per rank."""
    m = s.get("measured") or {}
    crit = m.get("breakdown_rank")
    sources = []
    for r in s.get("per_rank") or []:
        b = (r or {}).get("breakdown") or {}
        if b:
            exposed = {k[5:]: v for k, v in (b.get("parts") or {}).items()
                       if k.startswith("comm:")}
            sources.append((r.get("rank"), b.get("comm_total") or {}, exposed))
    if not sources and ("comm_total_s" in m or "comm_exposed_s" in m):
        sources.append((crit, m.get("comm_total_s") or {}, m.get("comm_exposed_s") or {}))
    if not sources:
        return '<p class="empty">no communication measured</p>'
    body = []
    for rank, tot, exp in sources:
        kinds = sorted(set(tot) | set(exp))
        if not kinds:
            body.append(f"<tr><td>{e(rank)}</td><td>none</td><td></td><td></td><td></td></tr>")
        for k in kinds:
            t, x = num(tot.get(k)), num(exp.get(k))
            share = "-" if not t or x is None else f"{100 * x / t:.0f}%"
            mark = " *" if rank == crit else ""
            body.append(f"<tr><td>{e(rank)}{e(mark)}</td><td>{e(k)}</td>"
                        f'<td class="r">{e(f(t, duration))}</td>'
                        f'<td class="r">{e(f(x, duration))}</td><td class="r">{e(share)}</td></tr>')
    note = ('<p class="note">total: busy time of the communication threads (hidden or not); '
            'exposed: main-thread time spent launching or waiting on the collectives, not '
            'overlapped with compute. The two are measured on different threads, so exposed '
            'can exceed total (e.g. a wait whose transfer already ended). Mean over the '
            'profiled steps; * marks the breakdown rank.</p>')
    return _table(["rank", "kind", "total", "exposed", "exposed share"], body, "comm") + note

"""One self-contained HTML page for a run: inline CSS, inline SVG, no script, no URL."""

from __future__ import annotations

import tomllib
from typing import Any

from .. import __version__
from ..fmt import duration, si, step_ranges
from . import tables
from .load import Run, num, series
from .svg import PALETTE, HLine, LineChart, Series, StackedBars
from .tables import e

BAR_PARTS = ["forward", "backward", "recompute", "compute", "tp_comm", "pp_comm", "ep_comm",
             "cp_comm", "dp_comm_exposed", "bubble", "optimizer", "data", "other"]

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;
max-width:1100px;padding:0 16px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;
padding-bottom:3px}.sub{color:#555;margin:0 0 12px}
dl.hdr{display:grid;grid-template-columns:max-content 1fr max-content 1fr;gap:2px 14px;margin:10px 0}
dl.hdr dt{color:#666}dl.hdr dd{margin:0;font-variant-numeric:tabular-nums}
.status{display:inline-block;padding:1px 8px;border-radius:3px;font-weight:600}
.status.ok{background:#e3f4e3;color:#1d6b1d}.status.bad{background:#fde2e2;color:#9b1c1c}
table{border-collapse:collapse;margin:6px 0;font-variant-numeric:tabular-nums}
th,td{padding:2px 9px;border-bottom:1px solid #eee;text-align:left;white-space:nowrap}
th{background:#f6f6f6;font-weight:600}td.r{text-align:right}
tr.d1 td:first-child{padding-left:22px}tr.d2 td:first-child{padding-left:40px;color:#555}
td.hi{background:#fbd5d5;color:#8a1515;font-weight:600}
td.lo{background:#d7e5fb;color:#173f80;font-weight:600}
.note,.empty{color:#555;margin:4px 0}.empty{font-style:italic}
.warn{background:#fff4d6;border-left:4px solid #e0a800;padding:6px 10px;margin:8px 0}
pre{background:#f7f7f7;border:1px solid #e4e4e4;padding:10px;overflow:auto;font-size:12.5px}
svg.chart{display:block;margin:8px 0;max-width:100%;height:auto}
svg .ttl{font-size:13px;font-weight:600;fill:#222}svg .tick{font-size:11px;fill:#444}
svg .lbl{font-size:12px;fill:#333}svg .grid{stroke:#eee}svg .axis{stroke:#888}
svg .frame{fill:none;stroke:#bbb}
.wide{overflow-x:auto}
"""


def _config(run: Run) -> dict[str, Any]:
    if not run.config_text:
        return {}
    try:
        return tomllib.loads(run.config_text)
    except tomllib.TOMLDecodeError:
        return {}


def _facts(run: Run) -> dict[str, Any]:
    """Header values from summary.json, else from config.toml and the metrics."""
    s, cfg, recs = run.summary, _config(run), run.metrics
    plan = s.get("plan") or cfg.get("plan") or {}
    desc = s.get("plan_desc")
    if not desc and plan:
        desc = " ".join(f"{k}{plan[k]}" for k in ("dp", "tp", "pp", "zero") if k in plan)
    last = recs[-1] if recs else {}
    world = s.get("world_size")
    if world is None and plan:
        world = plan.get("dp", 1) * plan.get("tp", 1) * plan.get("pp", 1)
    return {
        "status": s.get("status") or ("unknown (no summary.json)" if not s else "unknown"),
        "model": s.get("model") or (cfg.get("model") or {}).get("name"),
        "params": s.get("param_count"),
        "plan": desc, "world": world, "device": s.get("device"),
        "dtype": s.get("dtype") or plan.get("dtype"), "torch": s.get("torch"),
        "steps": s.get("steps", last.get("step")),
        "planned": cfg.get("steps"),
        "tokens": s.get("tokens", last.get("tokens")),
        "wall": s.get("wall_time_s"),
        "train": s.get("train_time_s", last.get("elapsed_s")),
        "tps": s.get("tokens_per_s"),
        "first": s.get("first_loss", recs[0].get("loss") if recs else None),
        "last": s.get("last_loss", last.get("loss")),
        "val": s.get("val_loss"),
    }


def header(run: Run) -> str:
    x = _facts(run)
    ok = x["status"] == "ok"
    items = [
        ("model", f"{x['model'] or '-'}" + (f" ({si(x['params'])} parameters)"
                                           if num(x["params"]) else "")),
        ("plan", x["plan"] or "-"), ("world size", x["world"]), ("device", x["device"]),
        ("dtype", x["dtype"]), ("torch", x["torch"]),
        ("steps", f"{x['steps']}" + (f" of {x['planned']}" if x["planned"] is not None
                                     and x["planned"] != x["steps"] else "")),
        ("tokens", f"{x['tokens']:,}" if isinstance(x["tokens"], int) else x["tokens"]),
        ("wall time", tables.f(x["wall"], duration) + " (set-up included)"),
        ("train time", tables.f(x["train"], duration)),
        ("tokens/s", tables.f(x["tps"], si) + " (mean after step 1)"),
        ("loss", f"{tables.f(x['first'], lambda v: f'{v:.4f}')} → "
                 f"{tables.f(x['last'], lambda v: f'{v:.4f}')}"
                 + (f", validation {tables.f(x['val'], lambda v: f'{v:.4f}')}"
                    if x["val"] is not None else "")),
    ]
    dl = "".join(f"<dt>{e(k)}</dt><dd>{e('-' if v is None else v)}</dd>" for k, v in items)
    cls = "ok" if ok else "bad"
    title = f"ptd run: {x['model'] or '?'}, {x['plan'] or '?'}"
    warn = "".join(f'<p class="warn">{e(n)}</p>' for n in run.notes)
    if not ok:
        warn = f'<p class="warn">run status: {e(x["status"])}</p>' + warn
    return (f"<h1>{e(title)}</h1><p class=\"sub\">{e(run.path)} · status "
            f'<span class="status {cls}">{e(x["status"])}</span></p>'
            f'<dl class="hdr">{dl}</dl>{warn}')


def loss_chart(run: Run) -> str:
    train = series(run.metrics, "loss")
    if not train:
        train = [(float(p[0]), float(p[1])) for p in run.summary.get("loss_curve") or []
                 if len(p) == 2 and num(p[0]) is not None and num(p[1]) is not None]
    val = series(run.metrics, "val_loss")
    ch = LineChart("loss", [Series("train loss", train, PALETTE[0], dots=len(train) <= 60,
                                   radius=2),
                            Series("validation loss", val, PALETTE[1], radius=3.5)],
                   y_label="loss", y_fmt=lambda v: f"{v:.3g}", tip_fmt=lambda v: f"{v:.4f}")
    bad = [r["step"] for r in run.metrics
           if num(r.get("loss")) is None and isinstance(r.get("step"), int)]
    note = (f'<p class="note">non-finite loss at step(s) {e(step_ranges(bad))}</p>'
            if bad else "")
    return ch.render() + note


def throughput_chart(run: Run) -> str:
    pts = series(run.metrics, "tokens_per_s")
    flags = {r.get("step"): r for r in run.metrics}

    def pick(cond: Any) -> list[tuple[float, float]]:
        return [(x, y) for x, y in pts if cond(flags.get(int(x), {}), x)]

    plain = pick(lambda r, x: x != 1 and not r.get("profiled") and not r.get("memory_tracked"))
    ser = [Series("tokens/s", pts, "#999", dots=False),
           Series("step (clean)", plain, PALETTE[0], line=False),
           Series("step 1 (warm-up)", pick(lambda r, x: x == 1), PALETTE[3], line=False,
                  radius=3.5),
           Series("memory step", pick(lambda r, x: r.get("memory_tracked")), PALETTE[4],
                  line=False, radius=3.5),
           Series("profiled step", pick(lambda r, x: r.get("profiled")), PALETTE[1],
                  line=False, radius=3.5)]
    hl = []
    if num(run.summary.get("tokens_per_s")):
        hl.append(HLine(run.summary["tokens_per_s"], "mean after step 1", PALETTE[2]))
    m, p = run.summary.get("measured") or {}, run.summary.get("predicted") or {}
    if num(m.get("tokens_per_s")):
        hl.append(HLine(m["tokens_per_s"], "measured (clean steps)", PALETTE[0], "2 3"))
    if num(p.get("tokens_per_s")):
        hl.append(HLine(p["tokens_per_s"], "predicted", PALETTE[3]))
    ch = LineChart("throughput per step", ser, hl, y_label="tokens/s", y_fmt=si, y_zero=True,
                   tip_fmt=lambda v: f"{v:,.0f} tokens/s")
    return ch.render()


def breakdown_chart(s: dict[str, Any]) -> str:
    m, p = s.get("measured") or {}, s.get("predicted") or {}
    rows = []
    for label, b in ((f"measured (rank {m.get('breakdown_rank', '?')})", m.get("breakdown")),
                     ("predicted", p.get("breakdown"))):
        if not b:
            continue
        d = {k: num(b.get(k)) or 0.0 for k in BAR_PARTS}
        split = d["forward"] + d["backward"] + d["recompute"]
        d["compute"] = 0.0 if split > 0 else d["compute"]
        rows.append((label, d))
    out = []
    if rows:
        out.append(StackedBars("step time by part (profiled step vs cost model)", rows,
                               BAR_PARTS, duration).render())
    if not m.get("breakdown"):
        out.append('<p class="empty">no measured breakdown (no profiled step in this run)</p>')
    if not p:
        out.append('<p class="empty">no prediction</p>')
    elif m.get("breakdown"):
        out.append('<p class="note">measured: the profiled steps of the rank with the most '
                   'compute, in the cost model\'s parts; data wait and other (loss, Python) are '
                   'not modelled.</p>')
    return "".join(out)


def config_block(run: Run) -> str:
    if run.config_text is None:
        return '<p class="empty">no config.toml in the run folder</p>'
    return (f"<pre>{e(run.config_text)}</pre><p class=\"note\">repeat the run: "
            f"<code>ptd train --config {e(run.path / 'config.toml')}</code></p>")


def text_table(s: dict[str, Any]) -> str:
    """The plain-text table ``ptd train`` printed, for copying into an issue."""
    from ..summary.compare import comparison_table
    try:
        txt = comparison_table(s)
    except (KeyError, TypeError, ValueError, AttributeError):
        return ""
    return f"<details><summary>as printed by ptd train</summary><pre>{e(txt)}</pre></details>"


def render(run: Run) -> str:
    s = run.summary
    x = _facts(run)
    title = f"ptd report: {x['model'] or '?'} {x['plan'] or ''}".strip()
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(title)}</title><style>{CSS}</style></head><body>",
        header(run),
        "<h2>Loss</h2>", loss_chart(run),
        "<h2>Throughput</h2>", throughput_chart(run),
        "<h2>Step time breakdown</h2>", breakdown_chart(s),
        "<h2>Predicted vs measured</h2>",
        '<p class="note">ratio = measured / predicted; <span class="status bad">red</span> '
        'above and <span class="status" style="background:#d7e5fb">blue</span> below the '
        f'prediction by more than {round(tables.OFF * 100)}%.</p>',
        '<div class="wide">', tables.comparison(s), "</div>", text_table(s),
        "<h2>Memory per rank</h2>",
        '<div class="wide">', tables.per_rank_memory(s), "</div>",
    ]
    t = tables.per_rank_time(s)
    if t:
        parts += ["<h2>Time per rank (profiled step)</h2>", '<div class="wide">', t, "</div>"]
    from ..summary.routing import routing_table_html
    if moe := routing_table_html(run.metrics):
        parts += ["<h2>Mixture-of-experts routing</h2>", '<div class="wide">', moe, "</div>"]
    parts += ["<h2>Communication per kind</h2>", '<div class="wide">',
              tables.communication(s), "</div>",
              "<h2>Configuration (config.toml)</h2>", config_block(run),
              f'<p class="note">written by ptd {e(__version__)} report</p>',
              "</body></html>"]
    return "\n".join(parts)

"""Mixture-of-experts routing over a run, from the per-step records (no torch): the summary
``summary.json`` keeps, the end-of-run line of ``ptd train`` and the table of ``ptd report``.

Per step, :func:`ptd.runtime.model.moe.step_metrics` records ``moe_tokens_per_expert``,
``moe_imbalance`` (worst layer's max/mean assignments per expert), ``moe_dropped``,
``moe_dropped_frac``, ``moe_aux_loss`` and ``moe_z_loss``.
"""

from __future__ import annotations

import html
from typing import Any


def routing_summary(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Over the steps: mean and worst imbalance, dropped assignments, first/last aux loss,
    and the assignments per expert summed over all steps. None for a dense model."""
    rs = [r for r in records if "moe_imbalance" in r]
    if not rs:
        return None
    per_expert = [sum(c) for c in zip(*(r["moe_tokens_per_expert"] for r in rs))]
    total = sum(per_expert)
    return {"imbalance_mean": sum(r["moe_imbalance"] for r in rs) / len(rs),
            "imbalance_max": max(r["moe_imbalance"] for r in rs),
            "dropped": sum(r["moe_dropped"] for r in rs),
            "dropped_frac": sum(r["moe_dropped"] for r in rs) / total if total else 0.0,
            "aux_loss_first": rs[0]["moe_aux_loss"], "aux_loss_last": rs[-1]["moe_aux_loss"],
            "z_loss_last": rs[-1]["moe_z_loss"], "tokens_per_expert": per_expert}


def routing_line(m: dict[str, Any]) -> str:
    return (f"ptd: MoE routing: imbalance (worst layer, max/mean per expert) {m['imbalance_mean']:.2f} "
            f"mean, {m['imbalance_max']:.2f} worst step; dropped {m['dropped']:,} assignments "
            f"({m['dropped_frac']:.2%}); aux loss {m['aux_loss_first']:.3f} -> {m['aux_loss_last']:.3f}, "
            f"z-loss {m['z_loss_last']:.3f}; assignments per expert {m['tokens_per_expert']}")


def routing_table_html(records: list[dict[str, Any]]) -> str:
    """One row per recorded step (the report's "Mixture-of-experts routing" section)."""
    rs = [r for r in records if "moe_imbalance" in r]
    if not rs:
        return ""
    head = ["step", "imbalance (max/mean)", "dropped", "aux loss", "z-loss", "assignments per expert"]
    rows = ["<tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for r in rs:
        cells = [r["step"], f"{r['moe_imbalance']:.3f}", f"{r['moe_dropped']:,} ({r['moe_dropped_frac']:.2%})",
                 f"{r['moe_aux_loss']:.4f}", f"{r['moe_z_loss']:.4f}", " ".join(map(str, r["moe_tokens_per_expert"]))]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    return "<table>" + "".join(rows) + "</table>"

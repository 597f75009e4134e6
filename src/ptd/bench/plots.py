"""PNG plots of ``ptd bench scaling`` (matplotlib, Agg backend: no display needed).

Kept small (about 800 x 450 px at 100 dpi) so they can live in the repository.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

COLORS = {"ddp": "#1f77b4", "zero1": "#ff7f0e", "zero2": "#2ca02c", "zero3": "#d62728",
          "tp": "#9467bd", "pp": "#8c564b", "3d": "#e377c2"}
PARTS = ("compute", "tp_comm", "pp_comm", "dp_comm_exposed", "bubble", "optimizer")
PART_COLORS = {"compute": "#4c72b0", "tp_comm": "#dd8452", "pp_comm": "#55a868",
               "dp_comm_exposed": "#c44e52", "bubble": "#8172b3", "optimizer": "#937860",
               "data": "#da8bc3", "other": "#8c8c8c"}


def _plt() -> Any:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def speedup_plot(rows: list[dict], amdahl: list[dict], path: Path, title: str,
                 predicted: bool = True) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ns = sorted({r["n"] for r in rows})
    if not ns:
        plt.close(fig)
        return
    ax.plot(ns, ns, "k--", lw=1, label="ideal (S = N)")
    pfit = {a["strategy"]: a for a in amdahl}
    for strat in dict.fromkeys(r["strategy"] for r in rows):
        pts = sorted((r["n"], r["speedup"]) for r in rows if r["strategy"] == strat)
        c = COLORS.get(strat, None)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=c, label=f"{strat} measured"
                if predicted else strat)
        if predicted:
            pp = sorted((r["n"], r["speedup_pred"]) for r in rows if r["strategy"] == strat)
            ax.plot([p[0] for p in pp], [p[1] for p in pp], "x:", color=c, alpha=0.7)
        P = pfit.get(strat, {}).get("P")
        if P is not None and math.isfinite(P) and predicted:
            xs = [ns[0] + (ns[-1] - ns[0]) * i / 40 for i in range(41)]
            ax.plot(xs, [1 / ((1 - P) + P / x) for x in xs], "-", color=c, alpha=0.25, lw=3)
    ax.set_xlabel("workers N")
    ax.set_ylabel("speedup T(1)/T(N)" if predicted else "speedup")
    ax.set_xticks(ns)
    if not predicted:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if predicted:
        ax.plot([], [], "kx:", label="predicted (cost model)")
        ax.plot([], [], "-", color="gray", alpha=0.3, lw=3, label="Amdahl fit of measured")
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


MEM_KEYS = ("params", "grads", "optimizer", "activations")
MEM_COLORS = {"params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868", "activations": "#c44e52"}


def memory_plot(rows: list[dict], path: Path, title: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    keys, cols = MEM_KEYS, MEM_COLORS
    labels = []
    x = 0.0
    for r in rows:
        for j, suffix in enumerate(("", "_pred")):
            bottom = 0.0
            for k in keys:
                v = (r.get(k + suffix) or 0) / 2**20
                ax.bar(x + j * 0.4, v, 0.38, bottom=bottom, color=cols[k],
                       alpha=1.0 if not suffix else 0.5,
                       label=(k if (not labels and not suffix) else None))
                bottom += v
        labels.append((x + 0.2, f"{r['strategy']}\nN={r['n']}"))
        x += 1.0
    ax.set_xticks([p for p, _ in labels], [t for _, t in labels], fontsize=7)
    ax.set_ylabel("MiB per device (left: measured, right: predicted)")
    _finish(fig, ax, title, path)


def breakdown_plot(rows: list[dict], path: Path, title: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    labels = []
    seen: set[str] = set()
    for i, r in enumerate(rows):
        for j, (side, d) in enumerate((("measured", r["measured"]), ("predicted", r["predicted"]))):
            bottom = 0.0
            parts = list(PARTS) + (["data", "other"] if side == "measured" else [])
            for k in parts:
                v = (d.get(k) or 0.0) * 1e3
                if v <= 0:
                    continue
                ax.bar(i + j * 0.4, v, 0.38, bottom=bottom, color=PART_COLORS[k],
                       alpha=1.0 if side == "measured" else 0.5,
                       label=None if k in seen else k)
                seen.add(k)
                bottom += v
        labels.append((i + 0.2, f"{r['strategy']}\nN={r['n']}"))
    ax.set_xticks([p for p, _ in labels], [t for _, t in labels], fontsize=7)
    ax.set_ylabel("ms per step (left: measured, right: predicted)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


TL_COLORS = {"F": "#4c72b0", "B": "#dd8452", "W": "#e5ae38", "opt": "#937860", "sync": "#c44e52",
             "loss": "#8c8c8c", "data": "#da8bc3"}


def timeline_plot(per_rank: list[dict], path: Path, title: str) -> None:
    """One row per rank: forward/backward (and W) spans of one profiled step, collectives
    below them; the white gaps inside the pipeline schedule are the bubble."""
    plt = _plt()
    n = len(per_rank)
    fig, ax = plt.subplots(figsize=(8, 1.8 + 0.7 * n), dpi=100)
    seen: set[str] = set()
    end = 1.0
    for i, r in enumerate(per_rank):
        y = n - 1 - i
        for label, a, b in r.get("timeline", []):
            if label == "step":
                end = max(end, b)
                continue
            if label.startswith("comm:"):
                ax.broken_barh([(a, b - a)], (y - 0.42, 0.14), color="#2a2a2a",
                               label=None if "comm" in seen else "collective / p2p in flight")
                seen.add("comm")
                continue
            ax.broken_barh([(a, b - a)], (y - 0.25, 0.6), color=TL_COLORS.get(label, "#999"),
                           label=None if label in seen else {"F": "forward", "B": "backward",
                                                             "W": "weight grad", "opt": "optimizer",
                                                             "sync": "grad sync", "loss": "loss",
                                                             "data": "data"}.get(label, label))
            seen.add(label)
        c = r.get("coords", {})
        ax.text(-0.01 * end, y, f"rank {r['rank']} (pp {c.get('pp', 0)})", ha="right", va="center",
                fontsize=7)
    ax.set_yticks([])
    ax.set_xlim(0, end)
    ax.set_xlabel("ms from the step's start (each rank's own clock)")
    ax.set_title(title, fontsize=10)
    fig.legend(fontsize=7, ncol=7, loc="lower center", frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path)
    plt.close(fig)


def cluster_memory_plot(rows: list[dict], path: Path, title: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    keys, cols = MEM_KEYS, MEM_COLORS
    labels = []
    for i, r in enumerate(rows):
        bottom = 0.0
        for k in keys:
            v = r[k] / 2**30
            ax.bar(i, v, 0.7, bottom=bottom, color=cols[k], label=k if i == 0 else None)
            bottom += v
        labels.append(f"{r['strategy']}\nN={r['n']}")
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("GiB per device (predicted)")
    _finish(fig, ax, title, path)


def _finish(fig, ax, title: str, path) -> None:  # type: ignore[no-untyped-def]
    """Title, legend and grid of a bar chart, then write it and free the figure."""
    plt = _plt()
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

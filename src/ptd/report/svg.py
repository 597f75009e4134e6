"""Small inline-SVG charts: lines over steps and stacked horizontal bars.

No dependencies and no script: hovering a point or a segment shows its value through the
SVG ``<title>`` element, which every browser renders as a tooltip. The ``<svg>`` elements
carry no ``xmlns``: inside an HTML page the parser puts them in the SVG namespace itself,
and the page then holds no URL at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape
from typing import Callable, Sequence

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf", "#aec7e8", "#ffbb78"]


def _e(x: object) -> str:
    return escape(str(x), quote=True)


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round values (1, 2, 5 times a power of ten) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    out, t = [], first
    while t <= hi + step * 1e-9:
        out.append(0.0 if abs(t) < step * 1e-9 else t)
        t += step
    return out


def _span(vals: Sequence[float], pad_frac: float = 0.05) -> tuple[float, float]:
    lo, hi = min(vals), max(vals)
    if hi == lo:
        d = abs(lo) * 0.1 or 1.0
        return lo - d, hi + d
    pad = (hi - lo) * pad_frac
    return lo - pad, hi + pad


def _num(x: float) -> str:
    return f"{x:.4g}"


@dataclass
class Series:
    name: str
    points: list[tuple[float, float]]
    color: str = PALETTE[0]
    line: bool = True
    dots: bool = True
    dash: str = ""
    radius: float = 2.5


@dataclass
class HLine:
    y: float
    label: str
    color: str = "#555"
    dash: str = "6 4"


@dataclass
class LineChart:
    title: str
    series: list[Series]
    hlines: list[HLine] = field(default_factory=list)
    x_label: str = "step"
    y_label: str = ""
    y_fmt: Callable[[float], str] = _num
    tip_fmt: Callable[[float], str] | None = None
    y_zero: bool = False
    width: int = 720
    height: int = 300

    def render(self) -> str:
        pts = [p for s in self.series for p in s.points]
        if not pts:
            return f'<p class="empty">{_e(self.title)}: no data</p>'
        ml, mr, mt, mb = 70, 16, 30, 62
        items = [(s.name, s.color, s.dash if s.line else "dot") for s in self.series if s.points]
        items += [(hl.label, hl.color, hl.dash) for hl in self.hlines]
        lay = _legend_layout(items, self.width - ml - mr)
        extra = 16 * max((r for _, r in lay), default=0)
        height = self.height + extra
        w, h = self.width - ml - mr, self.height - mt - mb
        xlo, xhi = _span([p[0] for p in pts], 0.02)
        if xhi - xlo < 1:
            xlo, xhi = (xlo + xhi) / 2 - 0.5, (xlo + xhi) / 2 + 0.5
        ys = [p[1] for p in pts] + [hl.y for hl in self.hlines]
        ylo, yhi = _span(ys + ([0.0] if self.y_zero else []))
        if self.y_zero and min(ys) >= 0:
            ylo = 0.0

        def X(x: float) -> float:
            return ml + (x - xlo) / (xhi - xlo) * w

        def Y(y: float) -> float:
            return mt + (1 - (y - ylo) / (yhi - ylo)) * h

        o = [f'<svg class="chart" width="{self.width}" height="{height}" '
             f'viewBox="0 0 {self.width} {height}" role="img" aria-label="{_e(self.title)}">',
             f'<text x="{ml}" y="18" class="ttl">{_e(self.title)}</text>']
        for t in nice_ticks(ylo, yhi):
            o.append(f'<line x1="{ml}" x2="{ml + w}" y1="{Y(t):.1f}" y2="{Y(t):.1f}" class="grid"/>'
                     f'<text x="{ml - 6}" y="{Y(t) + 4:.1f}" class="tick" text-anchor="end">'
                     f'{_e(self.y_fmt(t))}</text>')
        xt = [t for t in nice_ticks(xlo, xhi, 8) if abs(t - round(t)) < 1e-9]
        for t in xt:
            o.append(f'<line x1="{X(t):.1f}" x2="{X(t):.1f}" y1="{mt + h}" y2="{mt + h + 4}" '
                     f'class="axis"/><text x="{X(t):.1f}" y="{mt + h + 17}" class="tick" '
                     f'text-anchor="middle">{int(round(t))}</text>')
        o.append(f'<rect x="{ml}" y="{mt}" width="{w}" height="{h}" class="frame"/>')
        o.append(f'<text x="{ml + w / 2:.1f}" y="{mt + h + 34}" class="lbl" '
                 f'text-anchor="middle">{_e(self.x_label)}</text>')
        if self.y_label:
            o.append(f'<text x="14" y="{mt + h / 2:.1f}" class="lbl" text-anchor="middle" '
                     f'transform="rotate(-90 14 {mt + h / 2:.1f})">{_e(self.y_label)}</text>')
        for hl in self.hlines:
            o.append(f'<line x1="{ml}" x2="{ml + w}" y1="{Y(hl.y):.1f}" y2="{Y(hl.y):.1f}" '
                     f'stroke="{_e(hl.color)}" stroke-dasharray="{_e(hl.dash)}" stroke-width="1.5">'
                     f'<title>{_e(hl.label)}: {_e(self.y_fmt(hl.y))}</title></line>')
        tip = self.tip_fmt or self.y_fmt
        for s in self.series:
            p = sorted(s.points)
            if s.line and len(p) > 1:
                d = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in p)
                dash = f' stroke-dasharray="{_e(s.dash)}"' if s.dash else ""
                o.append(f'<polyline points="{d}" fill="none" stroke="{_e(s.color)}" '
                         f'stroke-width="1.8"{dash}/>')
            if s.dots or len(p) == 1:
                rad = max(s.radius, 4) if len(p) == 1 else s.radius
                for x, y in p:
                    o.append(f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="{rad}" '
                             f'fill="{_e(s.color)}"><title>{_e(s.name)}, step {x:g}: '
                             f'{_e(tip(y))}</title></circle>')
        o.append(_legend(items, ml, self.height - 12, self.width - ml - mr))
        o.append("</svg>")
        return "".join(o)


def _legend_layout(items: list[tuple[str, str, str]], avail: float
                   ) -> list[tuple[float, int]]:
    """(x offset, row) of each legend item, wrapping to a new row when one is full."""
    out, x, row = [], 0.0, 0
    for name, _, _ in items:
        wd = 26 + 6.5 * len(name)
        if x + wd > avail and x > 0:
            x, row = 0.0, row + 1
        out.append((x, row))
        x += wd + 10
    return out


def _legend(items: list[tuple[str, str, str]], x0: float, y0: float, avail: float) -> str:
    o = []
    for (name, color, dash), (dx, row) in zip(items, _legend_layout(items, avail)):
        x, y = x0 + dx, y0 + 16 * row
        if dash == "dot":
            o.append(f'<circle cx="{x + 9:.0f}" cy="{y - 4}" r="4" fill="{_e(color)}"/>')
        else:
            da = f' stroke-dasharray="{_e(dash)}"' if dash else ""
            o.append(f'<line x1="{x:.0f}" x2="{x + 18:.0f}" y1="{y - 4}" y2="{y - 4}" '
                     f'stroke="{_e(color)}" stroke-width="3"{da}/>')
        o.append(f'<text x="{x + 22:.0f}" y="{y}" class="tick">{_e(name)}</text>')
    return "".join(o)


@dataclass
class StackedBars:
    """One horizontal bar per row, segments in ``parts`` order (zero parts are skipped)."""
    title: str
    rows: list[tuple[str, dict[str, float]]]
    parts: list[str]
    fmt: Callable[[float], str] = _num
    width: int = 720

    def render(self) -> str:
        totals = [sum(max(0.0, v) for v in d.values()) for _, d in self.rows]
        if not self.rows or not any(totals):
            return f'<p class="empty">{_e(self.title)}: no data</p>'
        colors = {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(self.parts)}
        ml = max(60, 12 + round(6.5 * max(len(label) for label, _ in self.rows)))
        mr, mt, bh, gap = 80, 30, 30, 14
        w = self.width - ml - mr
        used = [p for p in self.parts if any(d.get(p, 0) > 0 for _, d in self.rows)]
        per_line = max(1, w // 130)
        leg_rows = math.ceil(len(used) / per_line)
        height = mt + len(self.rows) * (bh + gap) + 26 + 18 * leg_rows
        top = max(totals)
        o = [f'<svg class="chart" width="{self.width}" height="{height}" '
             f'viewBox="0 0 {self.width} {height}" role="img" aria-label="{_e(self.title)}">',
             f'<text x="{ml}" y="18" class="ttl">{_e(self.title)}</text>']
        for i, ((label, d), tot) in enumerate(zip(self.rows, totals)):
            y = mt + i * (bh + gap)
            o.append(f'<text x="{ml - 8}" y="{y + bh / 2 + 4:.1f}" class="lbl" '
                     f'text-anchor="end">{_e(label)}</text>')
            x = float(ml)
            for p in self.parts:
                v = d.get(p, 0.0)
                if not v or v <= 0:
                    continue
                sw = v / top * w
                o.append(f'<rect x="{x:.2f}" y="{y}" width="{sw:.2f}" height="{bh}" '
                         f'fill="{colors[p]}"><title>{_e(label)}: {_e(p)} {_e(self.fmt(v))} '
                         f'({100 * v / tot:.1f}%)</title></rect>')
                x += sw
            o.append(f'<text x="{x + 6:.1f}" y="{y + bh / 2 + 4:.1f}" class="tick">'
                     f'{_e(self.fmt(tot))}</text>')
        ly = mt + len(self.rows) * (bh + gap) + 14
        for j, p in enumerate(used):
            lx = ml + (j % per_line) * 130
            yy = ly + (j // per_line) * 18
            o.append(f'<rect x="{lx}" y="{yy - 9}" width="12" height="12" fill="{colors[p]}"/>'
                     f'<text x="{lx + 16}" y="{yy + 1}" class="tick">{_e(p)}</text>')
        o.append("</svg>")
        return "".join(o)

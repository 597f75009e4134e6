"""Least-squares fits of ``t = a + x * s`` for calibration (pure Python, no torch).

Timings span three or four decades (a 1 KB all-reduce and a 32 MB one; a 64^3 and a 1024^3
matmul), so an ordinary least-squares fit would be decided by the largest points alone and
could give a negative intercept. The fit here minimises the *relative* error
``sum(((a + s x_i) - t_i) / t_i)^2`` -- weighted least squares with weights ``1 / t_i^2``,
closed form -- so that small and large points count alike, as they do for a cost model
that prices both tiny and large operations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class LinearFit:
    """``t = intercept + x * slope`` and how well it describes the points."""

    intercept: float
    slope: float
    rms_rel_err: float
    """Root-mean-square of (predicted - measured) / measured over the points."""
    max_rel_err: float
    """Largest |predicted - measured| / measured."""
    clamped: bool = False
    """The free fit gave a non-positive intercept or slope; one parameter was pinned."""

    def predict(self, x: float) -> float:
        return self.intercept + x * self.slope


def _wls(xs: Sequence[float], ts: Sequence[float]) -> tuple[float, float]:
    w = [1.0 / (t * t) for t in ts]
    sw = sum(w)
    sx = sum(wi * x for wi, x in zip(w, xs))
    sxx = sum(wi * x * x for wi, x in zip(w, xs))
    st = sum(wi * t for wi, t in zip(w, ts))
    sxt = sum(wi * x * t for wi, x, t in zip(w, xs, ts))
    det = sw * sxx - sx * sx
    if det <= 0 or not math.isfinite(det):
        return min(ts), 0.0
    return (sxx * st - sx * sxt) / det, (sw * sxt - sx * st) / det


def _slope_only(xs: Sequence[float], ts: Sequence[float], a: float) -> float:
    """Best relative-error slope with the intercept fixed at ``a``."""
    num = sum((x / t) * ((t - a) / t) for x, t in zip(xs, ts))
    den = sum((x / t) ** 2 for x, t in zip(xs, ts))
    return num / den if den > 0 else 0.0


def fit_linear(xs: Sequence[float], ts: Sequence[float], min_intercept: float = 0.0
               ) -> LinearFit:
    """Fit ``t = a + x s`` with ``a > min_intercept`` and ``s > 0`` (relative errors).

    If the free fit's intercept is not positive (the overhead is below the noise of the
    smallest point), it is pinned to a positive floor -- half the smallest time's share not
    explained by the bandwidth/rate term, at least ``min_intercept`` -- and the slope refit.
    """
    pts = [(float(x), float(t)) for x, t in zip(xs, ts) if t > 0 and math.isfinite(t)]
    if len(pts) < 2:
        raise ValueError("a fit needs at least two positive timings")
    xs, ts = [p[0] for p in pts], [p[1] for p in pts]
    a, s = _wls(xs, ts)
    clamped = False
    if s <= 0:  # no size dependence visible: all time is fixed cost
        clamped = True
        s = max(t / x for x, t in pts if x > 0) * 1e-3 if any(x > 0 for x in xs) else 1e-30
        a = sum(ts) / len(ts)
    if a <= min_intercept:
        clamped = True
        i = min(range(len(xs)), key=lambda j: xs[j])
        a = max(min_intercept, 0.5 * max(ts[i] - xs[i] * max(s, 0.0), 0.0), 1e-9)
        s = _slope_only(xs, ts, a)
        if s <= 0:
            s = max(t / x for x, t in pts if x > 0) * 1e-3
    rel = [(a + x * s - t) / t for x, t in pts]
    return LinearFit(a, s, math.sqrt(sum(r * r for r in rel) / len(rel)),
                     max(abs(r) for r in rel), clamped)


def median(v: Sequence[float]) -> float:
    s = sorted(v)
    n = len(s)
    if not n:
        raise ValueError("median of nothing")
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def mean(v: Sequence[float]) -> float:
    return sum(v) / len(v)

"""The textbook formulas of parallel performance, one small function each.

Units: seconds, bytes, FLOPs, FLOP/s, bytes/s. Nothing here knows about transformers; the
rest of :mod:`ptd.cost` computes the inputs (FLOPs, bytes) and calls these.
"""

from __future__ import annotations

import math
from typing import Sequence


def t_compute(flops: float, device_flops: float, devices: int = 1) -> float:
    """T_compute = FLOPs / (device FLOP/s x N): perfect division of the work over N devices."""
    return flops / (device_flops * devices)


def t_comm(nbytes: float, bandwidth: float, latency: float = 0.0) -> float:
    """T_comm = alpha + M / B: the alpha-beta (Hockney) model of one message of M bytes over
    a link of B bytes/s with start-up latency alpha. Collectives multiply M by their ring or
    tree factor first (see :mod:`ptd.cost.comm`)."""
    return latency + nbytes / bandwidth


def t_total(t_compute_s: float, t_comm_s: float, overlap: float = 0.0) -> float:
    """T_total = T_compute + (1 - overlap) x T_comm; ``overlap`` is the fraction of the
    communication hidden behind computation (0: none, 1: all)."""
    return t_compute_s + (1.0 - overlap) * t_comm_s


def throughput(samples: float, seconds: float) -> float:
    """Samples (or tokens) per second."""
    return samples / seconds


def efficiency(t_compute_s: float, t_total_s: float) -> float:
    """Parallel efficiency = T_compute / T_total: the share of time spent computing."""
    return t_compute_s / t_total_s


def speedup(t_1: float, t_n: float) -> float:
    """S = T_1 / T_N."""
    return t_1 / t_n


def scaling_efficiency(speedup_n: float, n: int) -> float:
    """S / N: 1.0 is linear scaling."""
    return speedup_n / n


def amdahl_speedup(parallel_fraction: float, n: int) -> float:
    """Amdahl's law: S = 1 / ((1 - P) + P / N)."""
    p = parallel_fraction
    return 1.0 / ((1.0 - p) + p / n)


def amdahl_parallel_fraction(speedup_n: float, n: int) -> float:
    """Inverse of Amdahl's law for one measurement: P = (1 - 1/S) / (1 - 1/N)."""
    if n == 1:
        return float("nan")
    return (1.0 - 1.0 / speedup_n) / (1.0 - 1.0 / n)


def fit_parallel_fraction(ns: Sequence[int], speedups: Sequence[float]) -> float:
    """Least-squares P over several (N, S) points, fitted in 1/S = (1 - P) + P/N, which is
    linear in P: minimises sum((1/S - 1) - P (1/N - 1))^2. Points with N = 1 carry no
    information and are skipped. Not clamped: P > 1 means superlinear scaling."""
    xs = [1.0 / n - 1.0 for n in ns if n > 1]
    ys = [1.0 / s - 1.0 for n, s in zip(ns, speedups) if n > 1]
    den = sum(x * x for x in xs)
    if not xs or den == 0:
        return float("nan")
    return sum(x * y for x, y in zip(xs, ys)) / den


def training_time(tokens: float, flops_per_token: float, device_flops: float, devices: int,
                  parallel_efficiency: float = 1.0) -> float:
    """Time to train = tokens x FLOPs/token / (device FLOP/s x devices x efficiency)."""
    return tokens * flops_per_token / (device_flops * devices * parallel_efficiency)


def mfu(model_flops_per_token: float, tokens_per_s: float, peak_flops: float, devices: int) -> float:
    """Model FLOPs utilisation (PaLM, arXiv 2204.02311, App. B): the FLOP/s that the model's
    own arithmetic needs at the observed token rate, over the devices' dense peak."""
    return model_flops_per_token * tokens_per_s / (peak_flops * devices)


def hfu(hardware_flops_per_token: float, tokens_per_s: float, peak_flops: float,
        devices: int) -> float:
    """Hardware FLOPs utilisation: as :func:`mfu` but counting the FLOPs actually executed,
    recomputation included (PaLM App. B)."""
    return hardware_flops_per_token * tokens_per_s / (peak_flops * devices)


def finite_or_none(x: float | None) -> float | None:
    """JSON has no NaN: map non-finite numbers to None."""
    return x if x is not None and math.isfinite(x) else None

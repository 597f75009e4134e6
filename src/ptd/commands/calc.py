"""ptd calc: the raw formulas, for people who bring their own numbers.

  t_compute_s = flops / (device_flops * devices)
  t_comm_s    = latency + comm_bytes / bandwidth
  t_total_s   = t_compute_s + t_comm_s        (or --time, a measured time)
  efficiency  = t_compute_s / t_total_s
  throughput_samples_per_s = samples / t_total_s
  speedup     = t_single / t_total_s
  amdahl_speedup = 1 / ((1 - P) + P / devices)

A quantity whose inputs are missing prints as '-' (null with --json).

Examples:
  ptd calc --flops 1e18 --device-flops 1e15 --devices 8          # t_compute_s = 125
  ptd calc --comm-bytes 1e9 --bandwidth 1e6 --latency 0.1        # t_comm_s = 1000.1
  ptd calc --samples 1e6 --time 1000                              # 1000 samples/s
  ptd calc --parallel-fraction 0.95 --devices 8                   # amdahl_speedup = 5.93
"""

from __future__ import annotations

import argparse

from ..cli import emit_json, fraction, nonneg_float, positive_float, positive_int
from ..cost import metrics as m
from ..fmt import table

HELP = "raw formulas: compute/comm time, efficiency, throughput, speedup, Amdahl"
KEYS = ("t_compute_s", "t_comm_s", "t_total_s", "efficiency", "throughput_samples_per_s",
        "speedup", "amdahl_speedup")


def add(p: argparse.ArgumentParser) -> None:
    p.add_argument("--flops", type=nonneg_float, help="total FLOPs of the work")
    p.add_argument("--device-flops", type=positive_float, help="FLOP/s of one device")
    p.add_argument("--devices", type=positive_int, default=1, help="number of devices N (1)")
    p.add_argument("--comm-bytes", type=nonneg_float, help="bytes communicated")
    p.add_argument("--bandwidth", type=positive_float, help="link bandwidth, bytes/s")
    p.add_argument("--latency", type=nonneg_float, default=0.0, help="latency alpha, s (0)")
    p.add_argument("--samples", type=nonneg_float, help="samples processed in t_total_s")
    p.add_argument("--time", type=positive_float,
                   help="a measured total time, s: used instead of t_compute_s + t_comm_s")
    p.add_argument("--t-single", type=positive_float, help="time of the same work on one device, s")
    p.add_argument("--parallel-fraction", type=fraction, help="Amdahl's P in [0, 1]")
    p.add_argument("--json", action="store_true", help="print a JSON object")


def compute(a: argparse.Namespace) -> dict[str, float | None]:
    tc = m.t_compute(a.flops, a.device_flops, a.devices) if (
        a.flops is not None and a.device_flops) else None
    tm = m.t_comm(a.comm_bytes, a.bandwidth, a.latency) if (
        a.comm_bytes is not None and a.bandwidth) else None
    if a.time is not None:
        tt = a.time
    elif tc is not None or tm is not None:
        tt = m.t_total(tc or 0.0, tm or 0.0)
    else:
        tt = None
    return {
        "t_compute_s": tc,
        "t_comm_s": tm,
        "t_total_s": tt,
        "efficiency": m.efficiency(tc, tt) if tc is not None and tt else None,
        "throughput_samples_per_s": m.throughput(a.samples, tt) if a.samples is not None and tt else None,
        "speedup": m.speedup(a.t_single, tt) if a.t_single is not None and tt else None,
        "amdahl_speedup": (m.amdahl_speedup(a.parallel_fraction, a.devices)
                           if a.parallel_fraction is not None else None),
    }


def run(a: argparse.Namespace) -> int:
    out = compute(a)
    if a.json:
        emit_json(out)
    else:
        print(table([(k, "-" if v is None else f"{v:.6g}") for k, v in out.items()],
                    header=("quantity", "value"), align="lr"))
    return 0

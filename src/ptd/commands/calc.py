"""ptd calc: the raw formulas, for people who bring their own numbers.

  t_compute_s = flops / (device_flops * devices)
  t_comm_s    = latency + comm_bytes / bandwidth                  (--topology p2p, default)
              = 2(N-1) latency + 2(N-1)/N comm_bytes / bandwidth   (--topology ring: all-reduce)
              = 2 (max(N,S) latency + max(N/S,1) comm_bytes/bandwidth)
                                          (--topology ps --servers S: synchronous push + pull)
              = latency_f latency + bandwidth_f comm_bytes / bandwidth
                                          (--tp-mode 1d|2d|2.5d|3d over --devices: one linear
                                           layer, comm_bytes its activation; ptd.cost.tpmodes)
  link_bytes  = bytes through the busiest link per step: comm_bytes (p2p), 2(N-1)/N comm_bytes
                (ring), 2 comm_bytes N / S (ps: one server's link)
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
  ptd calc --topology ps --servers 4 --devices 16 --comm-bytes 1e9 --bandwidth 1e10 --latency 1e-5
                                                    # t_comm_s = 2 (16e-5 + 4 * 0.1) = 0.80032
"""

from __future__ import annotations

import argparse

from .args import emit_json, fraction, nonneg_float, positive_float, positive_int
from ..cost import metrics as m
from ..fmt import table

HELP = "raw formulas: compute/comm time, efficiency, throughput, speedup, Amdahl"
KEYS = ("t_compute_s", "t_comm_s", "t_total_s", "efficiency", "throughput_samples_per_s",
        "speedup", "amdahl_speedup", "topology", "servers", "link_bytes", "tp_mode", "tp_mode_factors")


def add(p: argparse.ArgumentParser) -> None:
    p.add_argument("--flops", type=nonneg_float, help="total FLOPs of the work")
    p.add_argument("--device-flops", type=positive_float, help="FLOP/s of one device")
    p.add_argument("--devices", type=positive_int, default=1, help="number of devices N (1)")
    p.add_argument("--comm-bytes", type=nonneg_float, help="bytes communicated")
    p.add_argument("--bandwidth", type=positive_float, help="link bandwidth, bytes/s")
    p.add_argument("--latency", type=nonneg_float, default=0.0, help="latency alpha, s (0)")
    p.add_argument("--topology", choices=["p2p", "ring", "ps"], default="p2p",
                   help="how comm-bytes (a gradient of M bytes per device) travel: one point-to-point "
                        "transfer (default), ring all-reduce over --devices, or a synchronous "
                        "parameter server with --servers")
    p.add_argument("--servers", type=positive_int, help="parameter servers S (--topology ps)")
    p.add_argument("--tp-mode", choices=["1d", "2d", "2.5d", "3d"],
                   help="tensor parallelism of one linear layer over --devices (Megatron 1d, "
                        "Optimus 2d, Tesseract 2.5d, 3d): per-device factors, and t_comm_s")
    p.add_argument("--depth", type=positive_int, default=1, help="2.5d's depth d (1)")
    p.add_argument("--samples", type=nonneg_float, help="samples processed in t_total_s")
    p.add_argument("--time", type=positive_float,
                   help="a measured total time, s: used instead of t_compute_s + t_comm_s")
    p.add_argument("--t-single", type=positive_float, help="time of the same work on one device, s")
    p.add_argument("--parallel-fraction", type=fraction, help="Amdahl's P in [0, 1]")
    p.add_argument("--json", action="store_true", help="print a JSON object")


def _comm(a: argparse.Namespace) -> tuple[float | None, float | None]:
    """(t_comm_s, link_bytes) of ``--topology``."""
    from ..cost import ps
    if a.comm_bytes is None or not a.bandwidth:
        return None, None
    n, M = a.devices, a.comm_bytes
    if a.tp_mode:
        from ..cost.tpmodes import tp_mode_cost
        c = tp_mode_cost(a.tp_mode, n, a.depth)
        return c.comm_time(M, a.latency, a.bandwidth), c.bandwidth * M
    if a.topology == "ps":
        return (ps.ps_time(M, n, a.servers, a.latency, a.bandwidth),
                ps.ps_server_link_bytes(M, n, a.servers))
    if a.topology == "ring":
        return ps.ring_allreduce_time(M, n, a.latency, a.bandwidth), 2 * (n - 1) / n * M
    return m.t_comm(M, a.bandwidth, a.latency), M


def compute(a: argparse.Namespace) -> dict[str, float | str | None]:
    from ..errors import PtdError
    if a.topology == "ps" and a.servers is None:
        raise PtdError("--topology ps needs --servers S (S >= 1)")
    if a.servers is not None and a.topology != "ps":
        raise PtdError("--servers applies to --topology ps only")
    if a.tp_mode and a.topology != "p2p":
        raise PtdError("--tp-mode prices one layer's tensor parallelism; drop --topology")
    factors = None
    if a.tp_mode:
        from ..cost.tpmodes import tp_mode_cost
        factors = tp_mode_cost(a.tp_mode, a.devices, a.depth).to_dict()
    elif a.depth != 1:
        raise PtdError("--depth applies to --tp-mode 2.5d only")
    tc = m.t_compute(a.flops, a.device_flops, a.devices) if (
        a.flops is not None and a.device_flops) else None
    tm, link = _comm(a)
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
        "topology": a.topology,
        "servers": a.servers,
        "link_bytes": link,
        "tp_mode": a.tp_mode,
        "tp_mode_factors": factors,
    }


def run(a: argparse.Namespace) -> int:
    out = compute(a)
    if a.json:
        emit_json(out)
    else:
        factors = out.pop("tp_mode_factors")
        rows = [(k, "-" if v is None else v if isinstance(v, str) else f"{v:.6g}")
                for k, v in out.items()]
        if factors:
            rows += [(f"tp {k}", str(v)) for k, v in factors.items() if k in ("devices", "q", "depth")]
            rows += [(f"tp {k} (x unsplit layer)", f"{v:.6g}") for k, v in factors.items()
                     if k in ("compute", "params", "activations", "bandwidth", "latency")]
        print(table(rows,
                    header=("quantity", "value"), align="lr"))
    return 0

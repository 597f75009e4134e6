"""How fast this machine runs now against the profile that prices its runs.

A calibrated profile is one moment of a machine. A shared machine drifts: on the 2-core
box of docs/measuring.md two calibrations fifteen minutes apart priced the same rows 3-10%
apart, and the runs between them measured up to 14% slower than the hour before. A
measured / predicted ratio mixes that drift with the cost model's error. ``ptd bench``
therefore times, before and after its runs, the two figures the profile's prices rest
on, as ``ptd calibrate`` times them for one worker (:mod:`.bench`): the matmul rate
(three ``S x S`` products of the layouts a linear layer runs, fp32, one thread; compared
with ``gemm_flops_measured["fp32"][1]``, the fit's rate, which the products of 512 reach
within ~1% on the CPUs of docs/calibration.md) and the memory bandwidth (a copy and an add
far larger than the caches; compared with ``memory_bandwidth_measured[1]``, their mean).

Nothing here changes a prediction: the ratios are printed beside them, so that a row's
error can be read against the machine's own drift. CPU profiles only (a GPU profile's
one-worker rates are a GPU's; ``ptd bench`` runs its workers on the CPU).
"""

from __future__ import annotations

from typing import Any

from .profile import memory_bandwidth

SIDE = 512
"""Side of the square products timed: large enough for the fit's rate, one call ~8 ms."""
MEM_BYTES = 64 * 2**20
"""Bytes of each buffer of the copy and the add (as ``ptd calibrate``'s default plan)."""


def reference(hw: Any) -> dict[str, float] | None:
    """The profile's one-worker fp32 matmul rate and memory bandwidth, or None where it
    has not measured both (a preset, a GPU profile)."""
    gemm = (getattr(hw, "gemm_flops_measured", None) or {}).get("fp32", {})
    mem = getattr(hw, "memory_bandwidth_measured", None) or {}
    if 1 not in gemm or 1 not in mem or getattr(hw, "sm_count", 0):
        return None
    return {"matmul_flops": float(gemm[1]), "memory_bandwidth": float(mem[1])}


def measure_now(window_s: float = 0.1, repeats: int = 3) -> dict[str, float]:
    """This machine's matmul rate and memory bandwidth now, one thread, timed as ``ptd
    calibrate`` times one worker (the fastest of ``repeats`` windows)."""
    import torch
    from .bench import Sync, _memory, _three_layouts
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sync = Sync(1, 0, None, None, None, lambda: None, timeout=60.0)
        cpu = torch.device("cpu")
        a, b = torch.randn(SIDE, SIDE), torch.randn(SIDE, SIDE)
        c = torch.empty(SIDE, SIDE)
        t = sync.time(lambda: _three_layouts(a, b, c), window_s, repeats)
        mem = _memory(MEM_BYTES // 4, cpu, sync, window_s, repeats)
    finally:
        torch.set_num_threads(threads)
    return {"matmul_flops": 3 * 2.0 * SIDE**3 / t,
            "memory_bandwidth": memory_bandwidth(mem, MEM_BYTES // 4 * 4)}


def ratios(now: dict[str, float], ref: dict[str, float]) -> dict[str, float]:
    """Now over the profile: below 1, the machine runs slower than when it was calibrated
    (its runs measure slower than predicted by as much, the cost model aside)."""
    return {"matmul": now["matmul_flops"] / ref["matmul_flops"],
            "memory": now["memory_bandwidth"] / ref["memory_bandwidth"]}


def check(hw: Any) -> dict[str, Any] | None:
    """``{"now": ..., "profile": ..., "ratio": {"matmul", "memory"}}``, or None where the
    profile has no one-worker CPU figures to compare with."""
    ref = reference(hw)
    if ref is None:
        return None
    now = measure_now()
    return {"now": now, "profile": ref, "ratio": ratios(now, ref)}


def describe(before: dict | None, after: dict | None) -> str | None:
    """One line for people: the ratios before and after the runs."""
    if before is None:
        return None
    parts = [f"before the runs matmul {before['ratio']['matmul']:.2f}x, "
             f"memory {before['ratio']['memory']:.2f}x"]
    if after is not None:
        parts.append(f"after matmul {after['ratio']['matmul']:.2f}x, "
                     f"memory {after['ratio']['memory']:.2f}x")
    return ("this machine against its profile (1 worker; below 1: slower than calibrated): "
            + "; ".join(parts))

"""``ptd calibrate``: measure this machine and write a hardware profile the cost model reads.

``launch`` starts the workers together, ``bench`` is what each one times, ``fit`` and
``profile`` turn timings into the :class:`~ptd.specs.HardwareSpec` fields
(``gemm_flops_measured``, ``memory_bandwidth_measured``, ``op_overhead_measured``,
``attention_efficiency``, ``collectives``) written over a base preset.
"""

from __future__ import annotations

import datetime
import os
import platform
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable

from ...specs import tomlio
from ...specs.hardware import get_hardware_preset, hardware_from_dict
from .workers import KINDS, make_plan, run_workers, stage_labels
from .profile import profile_table, summarize
from .quiet import OtherLoad

__all__ = ["KINDS", "calibrate", "detect", "gpu_preset", "make_plan", "stage_labels",
           "write_profile"]

# substrings of torch.cuda.get_device_name -> preset
_GPU_PRESETS = [("H200", "h200"), ("H100", "h100-sxm"), ("H800", "h100-sxm"), ("B200", "b200"),
                ("A100", "a100"), ("A800", "a100"), ("V100", "v100"), ("MI300", "mi300x"),
                ("910B", "ascend-910b")]


def gpu_preset(device_name: str, memory_bytes: float) -> str | None:
    """The preset closest to a GPU by its name (``None`` when none matches)."""
    for key, preset in _GPU_PRESETS:
        if key.lower() in device_name.lower():
            if preset == "a100":
                return "a100-80g" if memory_bytes > 50 * 2**30 else "a100-40g"
            return preset
    return None


def detect() -> dict[str, Any]:
    """What runs here: ``device`` (cpu/cuda), ``count``, ``name``, ``memory_bytes``."""
    import torch
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        return {"device": "cuda", "count": torch.cuda.device_count(), "name": p.name,
                "memory_bytes": float(p.total_memory)}
    try:
        mem = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        mem = None
    return {"device": "cpu", "count": os.cpu_count() or 1, "memory_bytes": mem,
            "name": _cpu_name()}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def calibrate(workers: list[int], dtypes: list[str], quick: bool, base: str, name: str,
              info: dict[str, Any], on_tick: Callable[[str], None] = lambda s: None,
              model_shapes: list[tuple[int, int, int]] | None = None,
              model_attention: list[tuple[int, int, int, int]] | None = None,
              op_spec: dict | None = None, moe_spec: dict | None = None) -> dict[str, Any]:
    """Measure; return ``{"hardware": table, "meta": ..., "summary": ...}`` (validated).
    ``model_shapes``: a model's products (m, n, k), swept beside the default shapes;
    ``model_attention``: its attention shapes (b, heads, s, head_dim); ``op_spec``: the model
    whose operators price one operator (:func:`~.workers.op_model`); ``moe_spec``: a
    mixture-of-experts model whose MoE layer is timed (CPU)."""
    import torch
    plan = make_plan(workers, dtypes, quick, info["device"], model_shapes, model_attention, op_spec,
                     moe_spec)
    load = _loadavg()
    t0 = time.monotonic()
    watch = OtherLoad()
    results = run_workers(plan, watch.tick(on_tick))
    watch.stop()
    elapsed = time.monotonic() - t0
    summary = summarize(plan, results)
    host = socket.gethostname()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    note = (f"ptd calibrate on {host} ({info['name']}), {date}, torch {torch.__version__}, "
            f"workers {','.join(map(str, plan['workers']))}{' (quick)' if quick else ''}")
    hw = profile_table(summary, get_hardware_preset(base), name, info["device"],
                       info.get("memory_bytes"), note)
    hardware_from_dict(dict(hw), name)  # the profile must load
    meta = {"date": date, "host": host, "device": info["device"], "device_name": info["name"],
            "cpu_count": os.cpu_count() or 0, "torch": torch.__version__,
            "python": platform.python_version(), "command": " ".join(["ptd", *sys.argv[1:]]),
            "workers": plan["workers"], "dtypes": plan["dtypes"], "quick": quick,
            "seconds": round(elapsed, 1), "load_before": load, "load_after": _loadavg(),
            "other_load": watch.stages(),
            "attention_ratio_measured": summary["attention_ratio"] or 0.0,
            "missing_collectives": sorted(summary["missing"])}
    return {"hardware": hw, "meta": meta, "summary": summary, "plan": plan}


def _loadavg() -> float:
    """The 1-minute load average: how busy the machine was with other work (-1: unknown)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return -1.0


def write_profile(result: dict[str, Any], path: Path) -> None:
    """TOML with ``[hardware]`` (what ``load_hardware`` reads) and ``[meta]`` (ignored), and
    beside it ``NAME.json``: every raw timing, fit and table, for a second look."""
    import json
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps(
        {k: result[k] for k in ("meta", "plan", "summary", "hardware")}, indent=1, default=str))
    head = ("# Hardware profile written by `ptd calibrate`; use it with --hardware "
            f"{path.stem} (in {path.parent}) or --hardware {path}.\n"
            "# [hardware] overrides the preset it names; [meta] says where it was measured.\n")
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text(head + tomlio.dumps({"hardware": result["hardware"], "meta": result["meta"]}))
    tmp.replace(path)

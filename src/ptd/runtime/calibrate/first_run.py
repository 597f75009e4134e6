"""The first run on a machine calibrates it.

A prediction is only as good as the hardware numbers behind it, and the ``cpu`` preset was
measured on another machine. So ``ptd train`` and ``ptd bench`` with ``--hardware auto``
(the default) look for this machine's own profile, and when there is none they measure one
first -- a quick calibration (``ptd calibrate --quick``, fp32, 1, 2 and 4 workers at once;
about 20 s on a 2-core CPU), cached as ``$PTD_HOME/hardware/machine-<key>.toml``.

The key names what the numbers depend on: the CPU model, the number of cores and the torch
version (``amd-epyc-7b13-2c-torch2.13.0-cpu``); a machine with another of any of them
calibrates again. ``ptd calibrate`` (with its default name) refreshes the cached profile;
``--hardware NAME`` uses another. ``PTD_AUTO_CALIBRATE=0`` turns the first-run calibration
off (the test suite does, so that no test calibrates unless it means to). On GPUs nothing
is calibrated automatically: that path has not run on a GPU yet.

Torch-free: ``ptd train`` decides before any torch import whether to calibrate.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable

QUICK_WORKERS = (1, 2, 4)
"""Worker counts the first-run calibration measures (the default run has 4)."""
QUICK_DTYPES = ("fp32",)
"""Dtypes it measures: ptd's default; ``ptd calibrate`` adds bf16 (slow on CPUs without
bf16 units, so not in a calibration that must take seconds)."""


def torch_version() -> str:
    """The installed torch's version, without importing it (~2 s of CPU)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def machine_key(cpu: str | None = None, cores: int | None = None,
                torch: str | None = None) -> str:
    """``<cpu model>-<cores>c-torch<version>``, lower case, one hyphen between words."""
    from . import _cpu_name
    cpu = _cpu_name() if cpu is None else cpu
    cores = (os.cpu_count() or 1) if cores is None else cores
    torch = torch_version() if torch is None else torch
    text = f"{cpu} {cores}c torch{torch}".lower()
    text = re.sub(r"\((r|tm)\)", " ", text)
    return re.sub(r"[^a-z0-9.]+", "-", text).strip("-")


def machine_profile() -> Path:
    """Where this machine's profile is cached."""
    from ...specs.hardware import hardware_home
    return hardware_home() / f"machine-{machine_key()}.toml"


def enabled() -> bool:
    return os.environ.get("PTD_AUTO_CALIBRATE", "1").strip() not in ("0", "false", "no", "off")


def _has_gpu() -> bool:
    from ..launch.launcher import gpu_count
    return gpu_count() > 0


def ensure_profile(hardware: str | None,
                   calibrate: Callable[..., dict[str, Any]] | None = None) -> Path | None:
    """This machine's profile when ``hardware`` is ``auto`` (or unset): the cached one, else
    one measured now (a progress line on stderr). ``None`` when another hardware is named,
    or nothing is to be calibrated here (a GPU host, ``PTD_AUTO_CALIBRATE=0``).
    ``calibrate`` replaces :func:`ptd.runtime.calibrate.calibrate` (tests)."""
    if hardware not in (None, "", "auto"):
        return None
    path = machine_profile()
    if path.is_file():
        return path
    if not enabled() or _has_gpu():
        return None
    from . import _cpu_name, write_profile
    if calibrate is None:
        from . import calibrate
    info = {"device": "cpu", "count": os.cpu_count() or 1, "memory_bytes": _memory(),
            "name": _cpu_name()}
    print(f"ptd: first run on this machine ({info['name']}, {info['count']} cores, torch "
          f"{torch_version()}): calibrating it once for the cost model (~20 s; "
          f"`ptd calibrate` refreshes it, --hardware overrides)", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    tick = _ticker(t0)
    result = calibrate(list(QUICK_WORKERS), list(QUICK_DTYPES), True, "cpu", path.stem, info, tick)
    write_profile(result, path)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    print(f"ptd: calibrated in {time.perf_counter() - t0:.0f} s; wrote {path}",
          file=sys.stderr, flush=True)
    from .quiet import warning
    shared = warning(result.get("meta", {}).get("other_load", []), info["count"])
    if shared:
        print(f"ptd: {shared}", file=sys.stderr, flush=True)
    return path


def _ticker(t0: float) -> Callable[[str], None]:
    """One progress line, rewritten in place on a terminal (nothing per stage in a log)."""
    n = [0]

    def tick(label: str) -> None:
        n[0] += 1
        if sys.stderr.isatty():
            print(f"\rptd: calibrating: stage {n[0]} ({label}), {time.perf_counter() - t0:.0f} s ",
                  end="", file=sys.stderr, flush=True)
    return tick


def _memory() -> float | None:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def resolve_hardware(name: str, device: str = "cpu") -> tuple[Any, str]:
    """(HardwareSpec, where it came from) for a ``TrainConfig.hardware`` value."""
    from ...specs.hardware import hardware_home, load_hardware
    if name in ("auto", ""):
        for prof in (machine_profile(), hardware_home() / "calibrated.toml"):
            if prof.is_file():
                return load_hardware(str(prof)), str(prof)
        if device == "cpu":
            name, seen = "cpu", ""
        else:
            from . import gpu_preset
            gpu = gpu_name()
            name = (gpu_preset(*gpu) if gpu else None) or "h100-sxm"
            seen = f"{gpu[0]}, " if gpu else "GPU not identified, "
        return load_hardware(name), (f"preset {name} ({seen}no calibrated profile in "
                                     f"{hardware_home()})")
    hw = load_hardware(name)
    path = hardware_home() / f"{name}.toml"
    return hw, (str(path) if path.is_file() and name == hw.name else f"preset {name}")


def gpu_name() -> tuple[str, float] | None:
    """(name, memory bytes) of this host's first GPU from ``nvidia-smi`` (no CUDA context
    in the calling process); None where it cannot say."""
    import shutil
    import subprocess
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=10, check=True).stdout.splitlines()
        name, mib = out[0].rsplit(",", 1)
        return name.strip(), float(mib) * 2**20
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None

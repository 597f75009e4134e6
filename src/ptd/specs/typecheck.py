"""Field types of the config dataclasses, checked where TOML enters.

TOML has types, but nothing stops ``steps = "ten"`` or ``lr = nan`` from reaching code that
compares them. :func:`check_fields` holds every value of a table against the annotation of
its dataclass field and refuses a mismatch with one line: ``int`` (not ``bool``), ``float``
(an ``int`` is fine; NaN and infinities are not), ``bool``, ``str``, ``tuple[str, ...]`` and
``Literal[...]``, ``dict[str, float]`` and ``dict[int, float]``. Other annotations (nested
dataclasses) are left to their own checks.

Also here: :func:`read_text_file` (a file that exists, is small enough and decodes as
UTF-8, else one line) and the range checks (:func:`positive`, :func:`in_range`) the specs
use, which name the field and the value and refuse NaN and infinities.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from ..errors import PtdError


def _describe(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return " or ".join(repr(a) for a in get_args(tp))
    if get_origin(tp) is tuple:
        return "a list of strings"
    if get_origin(tp) is dict:
        return "a table of finite numbers"
    return {int: "an integer", float: "a finite number", bool: "true or false", str: "a string"}.get(
        tp, str(tp))


def _ok(tp: Any, v: Any) -> bool | None:
    """Whether ``v`` fits ``tp``; ``None`` when ``tp`` is not one this module checks."""
    if tp is bool:
        return isinstance(v, bool)
    if tp is int:
        return isinstance(v, int) and not isinstance(v, bool)
    if tp is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if tp is str:
        return isinstance(v, str)
    if get_origin(tp) is Literal:
        return any(type(v) is type(a) and v == a for a in get_args(tp))
    if get_origin(tp) is tuple and get_args(tp) == (str, ...):
        return isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v)
    if get_origin(tp) is dict and get_args(tp)[1] is float:
        key = get_args(tp)[0]
        return isinstance(v, dict) and all(
            _ok(key, k) is not False and _ok(float, x) for k, x in v.items())
    return None


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> tuple[dict[str, Any], frozenset[str]]:
    return typing.get_type_hints(cls), frozenset(f.name for f in dataclasses.fields(cls))


def check_instance(obj: Any, where: str) -> None:
    """:func:`check_fields` over every field of the dataclass instance ``obj``."""
    check_fields(type(obj), {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}, where)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def positive(where: str, name: str, v: Any) -> None:
    """Refuse unless ``v`` is a finite number > 0."""
    if not (_num(v) and v > 0):
        raise PtdError(f"{where}{name} must be > 0, got {v!r}")


def in_range(where: str, name: str, v: Any, lo: float, hi: float, *,
             lo_open: bool = False, hi_open: bool = False) -> None:
    """Refuse unless ``v`` is a finite number in the interval (brackets as given)."""
    ok = _num(v) and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    if not ok:
        br = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        raise PtdError(f"{where}{name} must be in {br}, got {v!r}")


MAX_INPUT_BYTES = 64 * 2**20
"""Largest config/model/hardware file read whole (a real one is a few KiB)."""


def read_text_file(path: str | Path, what: str) -> str:
    """The text of ``path``, or one line saying why not: missing, a folder, too large,
    unreadable, or not UTF-8 (a binary file given by mistake)."""
    p = Path(path)
    if not p.exists():
        raise PtdError(f"{what} file not found: {p}")
    if not p.is_file():
        raise PtdError(f"{what} {str(p)!r} is not a regular file")
    try:
        if p.stat().st_size > MAX_INPUT_BYTES:
            raise PtdError(f"{what} {str(p)!r} is larger than {MAX_INPUT_BYTES >> 20} MiB; "
                           "not a config file")
        return p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise PtdError(f"{what} {str(p)!r} is not UTF-8 text (byte {e.start}); a binary "
                       "file?") from None
    except OSError as e:
        raise PtdError(f"cannot read {what} {str(p)!r}: {e.strerror or e}") from None


def check_fields(cls: type, values: dict[str, Any], where: str) -> None:
    """Refuse the first value of ``values`` whose type does not fit ``cls``'s field."""
    hints, names = _hints(cls)
    for name, v in values.items():
        if name not in names:
            continue  # unknown fields are refused by the callers, with their own message
        ok = _ok(hints[name], v)
        if ok is False:
            raise PtdError(f"{where}{name} must be {_describe(hints[name])}, got {v!r}")


def check_link(link: Any, where: str) -> None:
    """A ``LinkSpec``: bandwidth > 0, latency >= 0, efficiency in (0, 1], all finite."""
    positive(where, "bandwidth", link.bandwidth)
    in_range(where, "latency", link.latency, 0, 1e3)
    in_range(where, "efficiency", link.efficiency, 0, 1, lo_open=True)


def check_hardware(hw: Any) -> None:
    """Every value of a ``HardwareSpec`` of the right type, finite and in a sane range,
    named in the message (``hardware x: intra_node.bandwidth must be > 0, got -5e9``)."""
    w = f"hardware {hw.name}: "
    check_instance(hw, w)
    if not isinstance(hw.intra_node, object) or not hasattr(hw.intra_node, "bandwidth"):
        raise PtdError(f"{w}intra_node must be a link table")
    for k in ("intra_node", "inter_node"):
        check_link(getattr(hw, k), f"{w}{k}.")
    if not hw.peak_flops:
        raise PtdError(f"{w}peak_flops needs at least one dtype")
    for dt, v in hw.peak_flops.items():
        positive(w, f"peak_flops.{dt}", v)
    for f in ("memory_bytes", "memory_bandwidth", "host_bandwidth"):
        positive(w, f, getattr(hw, f))
    if not 0 <= hw.sm_count <= 2**20:
        raise PtdError(f"{w}sm_count must be in 0..2**20, got {hw.sm_count!r}")
    if hw.comm_sms and not 0 <= hw.comm_sms < hw.sm_count:
        raise PtdError(f"{w}comm_sms must be >= 0 and below sm_count ({hw.sm_count}), "
                       f"got {hw.comm_sms!r}")
    if not 1 <= hw.devices_per_node <= 2**20:
        raise PtdError(f"{w}devices_per_node must be in 1..2**20, got {hw.devices_per_node!r}")
    for table in ("gemm_flops_measured", "overheads_measured"):
        for key, per in getattr(hw, table).items():
            if not isinstance(per, dict):
                raise PtdError(f"{w}{table}.{key} must be a table of workers = number")
            for n, v in per.items():
                (positive if table == "gemm_flops_measured" else _nonneg)(
                    w, f"{table}.{key}[{n}]", v)
    for n, v in hw.memory_bandwidth_measured.items():
        positive(w, f"memory_bandwidth_measured[{n}]", v)
    for dt, shapes in hw.gemm_shapes_measured.items():
        if not isinstance(shapes, dict):
            raise PtdError(f"{w}gemm_shapes_measured.{dt} must be a table of \"MxNxK\" = FLOP/s")
        for key, v in shapes.items():
            dims = str(key).split("x")
            if len(dims) != 3 or not all(d.isdigit() and 0 < int(d) <= 2**24 for d in dims):
                raise PtdError(f"{w}gemm_shapes_measured.{dt}: shape {key!r} is not MxNxK "
                               "(positive integers, e.g. \"1024x256x64\")")
            positive(w, f"gemm_shapes_measured.{dt}[{key}]", v)
    for n, v in hw.op_overhead_measured.items():
        _nonneg(w, f"op_overhead_measured[{n}]", v)
    from .hardware import EAGER_KERNELS
    for kind, v in hw.eager_bandwidth_fraction.items():
        if kind not in EAGER_KERNELS:
            raise PtdError(f"{w}eager_bandwidth_fraction: unknown kind {kind!r}; known: "
                           + ", ".join(EAGER_KERNELS))
        if not 0 < v <= 2:  # a kernel can beat a copy a little (fewer bytes written), not 2x
            raise PtdError(f"{w}eager_bandwidth_fraction.{kind} must be in (0, 2], got {v!r}")
    for tables in (hw.gemm_flops_measured.values(), hw.overheads_measured.values(),
                   (hw.memory_bandwidth_measured, hw.op_overhead_measured)):
        for per in tables:
            if any(not isinstance(n, int) or n < 1 for n in per):
                raise PtdError(f"{w}measured tables are keyed by workers at once (1, 2, ...)")
    for table in ("blocking_wait_measured", "blocking_wait_group_measured"):
        for n, pts in getattr(hw, table).items():
            if table == "blocking_wait_group_measured" and (not isinstance(n, int) or n < 3
                                                             or not pts):
                raise PtdError(f"{w}{table} wants group (3, 4, ...) = [[chunk, wait], ...]")
            for c, wt in pts:
                _nonneg(w, f"{table}[{n}] chunk", c)
                _nonneg(w, f"{table}[{n}] wait", wt)
    # (the *_situ_measured are residuals: negative where the parts they correct charge more)
    for table, signed in (("dtensor_reduce_measured", False), ("tp_situ_measured", True),
                          ("fsdp_situ_measured", True)):
        for n, pts in getattr(hw, table).items():
            if not isinstance(n, int) or n < 1 or not pts:
                raise PtdError(f"{w}{table} wants workers (1, 2, ...) = [[bytes, seconds], ...]")
            for b, e in pts:
                positive(w, f"{table}[{n}] bytes", b)
                if signed and not _num(e):
                    raise PtdError(f"{w}{table}[{n}] seconds must be a finite number, got {e!r}")
                if not signed:
                    _nonneg(w, f"{table}[{n}] seconds", e)
    for key, per in hw.moe_layer_measured.items():
        for n, pts in per.items():
            if not isinstance(n, int) or n < 1 or not pts:
                raise PtdError(f"{w}moe_layer_measured.{key} wants workers (1, 2, ...) = "
                               "[[tokens, forward s, backward s], ...]")
            for t, f, b in pts:
                positive(w, f"moe_layer_measured.{key}[{n}] tokens", t)
                _nonneg(w, f"moe_layer_measured.{key}[{n}] forward", f)
                _nonneg(w, f"moe_layer_measured.{key}[{n}] backward", b)
            if len({t for t, _, _ in pts}) != len(pts):
                raise PtdError(f"{w}moe_layer_measured.{key}[{n}]: each token count once")
    for c in hw.collectives:
        if not isinstance(c.kind, str) or not isinstance(c.group_size, int) or c.group_size < 1:
            raise PtdError(f"{w}collectives: bad fit {c!r}")
        _nonneg(w, f"collectives[{c.kind}, {c.group_size}].alpha", c.alpha)
        positive(w, f"collectives[{c.kind}, {c.group_size}].bus_bandwidth", c.bus_bandwidth)


def _nonneg(where: str, name: str, v: Any) -> None:
    if not (_num(v) and v >= 0):
        raise PtdError(f"{where}{name} must be >= 0, got {v!r}")


def refuse_unknown(cls: type, d: dict[str, Any], name: str, what: str) -> None:
    """One line naming the fields of table ``d`` that ``cls`` does not have."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise PtdError(f"{name}: unknown {what} field(s) {', '.join(unknown)}")


def from_table(cls: type, d: dict[str, Any], name: str, base: str | None,
               preset: Any, what: str) -> Any:
    """``preset(base)`` with the fields of ``d`` replaced, or ``cls(**d)`` named ``name``
    when there is no base; a table that misses required fields is one line."""
    if base is not None:
        return preset(base).replace(**d)
    d.setdefault("name", name)
    missing = [f.name for f in dataclasses.fields(cls)
               if f.name not in d and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]  # type: ignore[misc]
    if missing:
        raise PtdError(f"{name}: incomplete {what} table: missing {', '.join(missing)} "
                       f"(or start from a preset: preset = \"...\")")
    try:
        return cls(**d)
    except TypeError as e:
        raise PtdError(f"{name}: incomplete {what} table ({e})") from None

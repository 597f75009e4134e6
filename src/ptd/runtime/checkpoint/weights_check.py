"""Checks of weights given to ``--init-from`` before any worker trains from them.

A damaged ``model.safetensors`` must be refused, not trained from: before this check, a
file with a corrupted body loaded, trained at loss ln(vocab) with zero gradients and exited
0. :func:`check_header` reads only the header (format: 8-byte little-endian header length,
a JSON object ``name -> {dtype, shape, data_offsets}``, then the data; see the safetensors
README, "Format") and refuses a header that is not JSON, a dtype that is not a float, or
offsets that disagree with the shapes or the file's size. :func:`check_tensors` refuses
non-finite values and non-float dtypes in the loaded tensors.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

from ...errors import PtdError

FLOAT_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}


def check_header(path: Path) -> dict[str, Any]:
    """The parsed header of ``path``, or :class:`PtdError` naming what is wrong."""
    where = f"init_from: {path}"
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise PtdError(f"{where} is shorter than a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, 100 * 2**20):
                raise PtdError(f"{where}: header length {n} exceeds the file ({size} bytes); "
                               "not a safetensors file, or truncated")
            raw = f.read(n)
    except OSError as e:
        raise PtdError(f"{where}: cannot read ({e.strerror or e})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise PtdError(f"{where}: the safetensors header is not JSON (damaged file)") from None
    if not isinstance(header, dict):
        raise PtdError(f"{where}: the safetensors header is not a JSON object")
    end = 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (a, b) = t["dtype"], t["shape"], t["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise PtdError(f"{where}: tensor {name!r} has a malformed header entry") from None
        if dtype not in FLOAT_DTYPES:
            raise PtdError(f"{where}: tensor {name!r} has dtype {dtype}; weights must be "
                           f"floating point ({', '.join(FLOAT_DTYPES)})")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise PtdError(f"{where}: tensor {name!r} has a malformed shape {shape!r}")
        want = math.prod(shape) * FLOAT_DTYPES[dtype]
        if not (isinstance(a, int) and isinstance(b, int) and 0 <= a <= b and b - a == want):
            raise PtdError(f"{where}: tensor {name!r} offsets {a}..{b} do not hold {shape} "
                           f"x {dtype} ({want} bytes)")
        end = max(end, b)
    if 8 + n + end != size:
        raise PtdError(f"{where}: the file has {size} bytes, its header describes "
                       f"{8 + n + end} (truncated or padded)")
    return header


def check_tensors(tensors: dict[str, Any], where: str) -> None:
    """Refuse a non-float or non-finite tensor (torch tensors; imported by the caller)."""
    import torch
    for name, t in tensors.items():
        if not t.is_floating_point():
            raise PtdError(f"init_from: {where}: {name} has dtype {t.dtype}, not floating point")
        if not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise PtdError(f"init_from: {where}: {name} holds {bad} non-finite value(s) "
                           "(NaN or inf); the weights are damaged")

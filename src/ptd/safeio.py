"""Nothing lost: output paths checked before work, atomic writes, a lock per run folder,
strict JSON.

- :func:`check_writable` -- refuse an output path that cannot be written *before* any
  measuring or training (a probe file is created and removed in the nearest existing
  folder: root ignores permission bits, so ``os.access`` alone would say yes on a
  read-only mount).
- :func:`refuse_overwrite` -- a command never replaces a file it did not create in this
  run unless ``--force``.
- :func:`atomic_write_text` -- write to a temporary name in the same folder, fsync, rename:
  a reader sees the old file or the new one, never half of one; a failed write (a full
  disk) removes its temporary file and leaves the old file as it was.
- :func:`run_lock` -- an exclusive ``filelock`` lock on ``OUT/.ptd.lock`` held while a run
  uses the folder; a second run is refused naming the holder (pid, host, command).
- :func:`json_safe` -- NaN and infinities become ``null`` with a ``<key>_null_reason``.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from .errors import PtdError, PtdFault, describe_os_error


def _existing_ancestor(p: Path) -> Path:
    p = p.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_writable(path: str | Path, what: str, *, kind: str = "dir") -> Path:
    """Refuse (PtdError) unless ``path`` can be created or written as a ``kind``
    (``dir`` or ``file``). Creates nothing that stays."""
    p = Path(path)
    if str(path) == "" or "\0" in str(path):
        raise PtdError(f"{what}: empty or invalid path {str(path)!r}")
    if kind == "dir" and p.exists() and not p.is_dir():
        raise PtdError(f"{what} {str(p)!r} exists and is not a folder")
    if kind == "file" and p.is_dir():
        raise PtdError(f"{what} {str(p)!r} is a folder, not a file")
    anc = _existing_ancestor(p if kind == "dir" else p.parent)
    if not anc.is_dir():
        raise PtdError(f"{what} {str(p)!r}: {str(anc)!r} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".ptd-probe-", dir=anc)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise PtdError(f"{what} {str(p)!r} is not writable ({e.strerror or e})") from None
    return p


def refuse_overwrite(path: str | Path, what: str, force: bool) -> None:
    """Refuse to replace an existing file ``path`` unless ``force``."""
    p = Path(path)
    if p.exists() and not force:
        raise PtdError(f"{what} {str(p)!r} exists; it was not written by this command "
                       "(pass --force to replace it, or choose another path)")


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename.
    On failure the temporary file is removed, the old ``path`` is untouched, and the error
    is a :class:`PtdFault` naming ``path`` (a full disk says so)."""
    p = Path(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
        tmp = None
    except OSError as e:
        e.filename = str(p)
        raise PtdFault(describe_os_error(e)) from e
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by None; in a dict, a key whose value
    was replaced gains a sibling ``<key>_null_reason`` ("not finite: nan")."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        out: dict[Any, Any] = {}
        for k, v in obj.items():
            out[k] = json_safe(v)
            if isinstance(v, float) and not math.isfinite(v):
                out.setdefault(f"{k}_null_reason", f"not finite: {v!r}")
        return out
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def dumps_strict(obj: Any, **kw: Any) -> str:
    """``json.dumps`` that can never print ``NaN``/``Infinity``."""
    return json.dumps(json_safe(obj), allow_nan=False, **kw)


LOCK_NAME = ".ptd.lock"


@contextmanager
def run_lock(folder: str | Path, what: str = "run folder") -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` (created if needed) for the ``with`` body.
    A second holder is refused at once with the first holder's pid, host and command."""
    from filelock import FileLock, Timeout
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    lock_path = d / LOCK_NAME
    info_path = d / (LOCK_NAME + ".holder")
    lock = FileLock(str(lock_path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        try:
            holder = info_path.read_text().strip()
        except OSError:
            holder = "an unknown process"
        raise PtdError(f"{what} {str(d)!r} is in use by {holder}; wait for it or choose "
                       "another --out") from None
    try:
        info_path.write_text(f"pid {os.getpid()} on {socket.gethostname()} "
                             f"({' '.join(['ptd'] + sys.argv[1:])[:200]})\n")
        yield
    finally:
        try:
            info_path.unlink()
        except OSError:
            pass
        lock.release()

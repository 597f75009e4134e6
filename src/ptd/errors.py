"""The error path of every ``ptd`` command.

:class:`PtdError` means "the user asked for something impossible": every layer raises it
with a single human sentence; the CLI turns it into one line ``ptd <cmd>: error: ...`` on
stderr and exit code 2. :class:`PtdFault` means "the machine failed us" (a full disk, a
worker that died): one line, exit code 1. Anything else that escapes is a bug: the CLI
writes its traceback to a log file (:func:`crash_log`) and prints one line naming it, exit
code 1; ``--debug`` or ``PTD_DEBUG=1`` prints the traceback instead. docs/errors.md lists
the exit codes.
"""

from __future__ import annotations

import errno
import os
import time
import traceback
from pathlib import Path

EXIT_OK, EXIT_FAULT, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class PtdError(ValueError):
    """Bad input: an unknown preset, an indivisible plan, a missing file, a negative number."""


class PtdFault(RuntimeError):
    """The environment failed (disk full, a worker crashed): exit code 1, one line."""


def debug_enabled() -> bool:
    return os.environ.get("PTD_DEBUG", "") not in ("", "0")


def describe_os_error(e: OSError) -> str:
    """One sentence for an OSError, naming the path; a full disk says so."""
    where = f" {e.filename}" if e.filename else ""
    if e.errno == errno.ENOSPC:
        return f"disk full writing{where} (no space left on device)"
    if e.errno == errno.EDQUOT:
        return f"disk quota exceeded writing{where}"
    return f"{e.strerror or e}{':' if where else ''}{where}"


def ptd_home() -> Path:
    """ptd's own folder: ``$PTD_HOME`` where it is set and not empty, else ``~/.ptd``. Profiles
    (``hardware/``), the text cache (``cache/``) and crash logs (``logs/``) live under it. One
    function, so an empty ``PTD_HOME`` never means the working folder for one of them."""
    return Path(os.environ.get("PTD_HOME") or Path.home() / ".ptd")


def check_home() -> None:
    """A one-line error (exit 2, before any work) where ``$PTD_HOME`` names a file: profiles,
    the text cache and logs could not be written under it, and the command would fail
    late (after a first-run calibration) on a bare ``Not a directory``."""
    home = ptd_home()
    if home.exists() and not home.is_dir():
        raise PtdError(f"PTD_HOME {str(home)!r} is a file, not a folder (ptd keeps its "
                       "profiles, text cache and logs there); name a folder or unset it")


def crash_log(exc: BaseException) -> Path | None:
    """Write ``exc``'s traceback to ``$PTD_HOME/logs/crash-<time>-<pid>.log`` (else the
    temporary folder) and return the path; None if neither can be written."""
    text = "".join(traceback.format_exception(exc))
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    for folder in (ptd_home() / "logs", Path(os.environ.get("TMPDIR", "/tmp"))):
        path = folder / f"ptd-crash-{stamp}-{os.getpid()}.log"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return path
        except OSError:
            continue
    return None

"""The ``ptd`` command: a thin front over specs, cost, planner and runtime.

Each subcommand is a module of :mod:`ptd.commands` with ``HELP``, ``add(parser)`` (its
flags) and ``run(args)`` (calls into the library, returns the exit code). Heavy imports (torch) happen inside the runners
that need them, so ``ptd calc``, ``estimate`` and ``plan`` start instantly.

Contract (docs/errors.md): bad input prints one line ``ptd <cmd>: error: ...`` to stderr
and exits 2; nothing is started or written before input is validated. A fault of the
machine (disk full) is one line and exit 1; anything unexpected is one line naming a log
file that holds the traceback, exit 1 (``--debug`` or ``PTD_DEBUG=1`` prints it instead).
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .children import EXIT_TERMINATED, Terminated
from .errors import EXIT_FAULT, EXIT_INTERRUPTED, EXIT_USAGE, PtdError, PtdFault


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2 (argparse prints the whole
    usage block first, which buries the reason)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise PtdError(message)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .commands import MODULES, load
    p = _Parser(prog="ptd", description="Plan, run and measure 3D-parallel training of "
                "transformer language models.")
    p.add_argument("--version", action="version", version=f"ptd {__version__}")
    p.add_argument("--debug", action="store_true",
                   help="print tracebacks of unexpected errors (also PTD_DEBUG=1); any position")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in MODULES:
        mod = load(name)
        sp = sub.add_parser(name, help=mod.HELP, description=mod.__doc__ or mod.HELP,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add(sp)
    return p


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (for the error prefix), before parsing it."""
    from .commands import MODULES
    for tok in argv:
        if not tok.startswith("-"):
            return tok if tok in MODULES else None
    return None


def fail(cmd: str | None, message: str) -> None:
    """The one error line: ``ptd <cmd>: error: message`` (one line whatever ``message`` holds)."""
    text = " ".join(str(message).split()) or "error"
    print(f"ptd{' ' + cmd if cmd else ''}: error: {text}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from .errors import crash_log, debug_enabled, describe_os_error
    debug = debug_enabled() or "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    cmd = _command(argv)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not args.command:
            parser.print_help()
            return EXIT_USAGE
        from .errors import check_home
        check_home()
        from .commands import load
        rc = load(args.command).run(args)
        return int(rc or 0)
    except PtdError as e:
        fail(cmd, str(e))
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"ptd{' ' + cmd if cmd else ''}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated:  # SIGTERM while children ran; they were stopped on the way out
        print(f"ptd{' ' + cmd if cmd else ''}: terminated", file=sys.stderr)
        return EXIT_TERMINATED
    except BrokenPipeError:
        return 0
    except PtdFault as e:
        fail(cmd, str(e))
        return EXIT_FAULT
    except Exception as e:  # a fault of the machine (OSError, MemoryError), or a bug
        if debug:
            raise
        if isinstance(e, OSError) and e.errno is not None:
            fail(cmd, describe_os_error(e))
            return EXIT_FAULT
        log = crash_log(e)
        where = f"traceback in {log}" if log else "no log could be written"
        fail(cmd, f"unexpected {type(e).__name__}: {e} ({where}; --debug prints it)")
        return EXIT_FAULT


if __name__ == "__main__":
    sys.exit(main())

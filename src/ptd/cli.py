"""The ``ptd`` command: a thin front over specs, cost, planner and runtime.

Each subcommand is a module of :mod:`ptd.commands` with ``HELP``, ``add(parser)`` (its
flags) and ``run(args)`` (calls into the library, returns the exit code). Heavy imports (torch) happen inside the runners
that need them, so ``ptd calc``, ``estimate`` and ``plan`` start instantly.

Contract: bad input prints one line ``ptd: error: ...`` to stderr and exits 2; nothing is
started or written before input is validated.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from .errors import PtdError


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2 (argparse prints the whole
    usage block first, which buries the reason)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise PtdError(f"{self.prog.split()[-1]}: {message}")


def positive_ints(s: str, limit: int | None = None) -> list[int]:
    """``"4,1,2"`` -> ``[1, 2, 4]``: distinct positive integers (at most ``limit``)."""
    try:
        v = sorted({int(x) for x in s.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,2,4, got {s!r}") from None
    if not v or v[0] < 1 or (limit is not None and v[-1] > limit):
        bound = f"1..{limit}" if limit is not None else "positive"
        raise argparse.ArgumentTypeError(f"expected {bound} numbers like 1,2,4, got {s!r}")
    return v


def positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}")
    return v


def nonneg_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {s!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {s!r}")
    return v


def positive_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {s!r}") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {s!r}")
    return v


def nonneg_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {s!r}") from None
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {s!r}")
    return v


def fraction(s: str) -> float:
    v = nonneg_float(s)
    if v > 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], got {s!r}")
    return v


def emit_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .commands import MODULES, load
    p = _Parser(prog="ptd", description="Plan, run and measure 3D-parallel training of "
                "transformer language models.")
    p.add_argument("--version", action="version", version=f"ptd {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in MODULES:
        mod = load(name)
        sp = sub.add_parser(name, help=mod.HELP, description=mod.__doc__ or mod.HELP,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add(sp)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not args.command:
            parser.print_help()
            return 2
        from .commands import load
        rc = load(args.command).run(args)
        return int(rc or 0)
    except PtdError as e:
        print(f"ptd: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ptd: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())

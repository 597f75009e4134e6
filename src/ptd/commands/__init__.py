"""One module per ``ptd`` subcommand: ``HELP``, ``add(parser)``, ``run(args) -> int``.

Modules are imported only when the parser is built, and each keeps torch imports inside
``run`` so that the instant commands stay instant.
"""

from __future__ import annotations

import importlib
from types import ModuleType

MODULES = ["calc", "estimate", "plan", "validate", "train", "calibrate", "bench", "report", "export"]


def load(name: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{name}")

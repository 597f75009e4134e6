import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def ptd_cli(capsys):
    """Run the ptd CLI in-process; returns (exit code, stdout, stderr)."""
    from ptd.cli import main

    def run(*argv: str):
        rc = main(list(argv))
        out, err = capsys.readouterr()
        return rc, out, err

    return run

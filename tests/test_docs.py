"""README.md and docs/*.md say nothing the repository contradicts: every relative link
points at a file (and heading) that exists, and every ``ptd <cmd> --flag`` they show is a
flag of that command's parser (built from :func:`ptd.cli.build_parser`, nothing run).

Failures name ``file:line`` so a broken doc is found at once, whoever wrote it.
"""

from __future__ import annotations

import argparse
import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LINK = re.compile(r"(?<!\\)\[(?:[^\]\n]|\n(?!\n))*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
SPAN = re.compile(r"(`+)(.+?)\1", re.S)
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# ``ptd <cmd>`` as a command: not ``ptd.runtime`` nor a word ending in ptd
CMD = re.compile(r"(?<![\w.-])ptd\s+([a-z]+)\b")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def rel(p: Path) -> str:
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\s+#+\s*$", "", heading.strip())  # an ATX heading's closing hashes
    text = re.sub(r"`|\*\*|__", "", text).lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def split_fences(text: str) -> tuple[list[tuple[int, str]], str]:
    """Fenced code lines as (line number, text), and the prose with those lines blanked
    (so offsets in it still map to line numbers)."""
    code, prose, inside = [], [], False
    for n, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            inside = not inside
            prose.append("")
            continue
        if inside:
            code.append((n, line))
            prose.append("")
        else:
            prose.append(line)
    return code, "\n".join(prose)


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    _, prose = split_fences(path.read_text())
    for line in prose.split("\n"):
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            s = slug(m.group(1))
            k = seen.get(s, 0)
            seen[s] = k + 1
            out.add(s if k == 0 else f"{s}-{k}")
    return out


def broken_links(path: Path) -> list[str]:
    _, prose = split_fences(path.read_text())
    bad = []
    for m in LINK.finditer(prose):
        target = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        line = prose.count("\n", 0, m.start(1)) + 1
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            bad.append(f"{rel(path)}:{line}: link to {target!r}: {file_part} does not exist")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{rel(path)}:{line}: link to {target!r}: no heading #{anchor} "
                       f"in {rel(dest)}")
    return bad


def commands(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every ``ptd ...`` command shown: inline code spans in prose, and
    lines of fenced blocks (joined over ``\\`` continuations and indented ``[--flag`` lines)."""
    text = path.read_text()
    code, prose = split_fences(text)
    out = []
    for m in SPAN.finditer(prose):
        if CMD.search(m.group(2)):
            out.append((prose.count("\n", 0, m.start()) + 1, m.group(2).replace("\n", " ")))
    i = 0
    while i < len(code):
        n, line = code[i]
        while i + 1 < len(code) and code[i + 1][0] == code[i][0] + 1 and (
                line.rstrip().endswith("\\") or re.match(r"\s+[\[-]", code[i + 1][1])):
            i += 1
            line = line.rstrip().rstrip("\\") + " " + code[i][1]
        if CMD.search(line):
            out.append((n, line))
        i += 1
    return out


def subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return {}


def unknown_flags(cmd_line: str, parsers: dict[str, argparse.ArgumentParser]) -> list[str]:
    """Flags given to a ``ptd <cmd>`` in this text that the command's parser lacks. Each
    command's flags run to the end of its shell command (``|``, ``;``, ``&&``, ``#``)."""
    bad = []
    for m in CMD.finditer(cmd_line):
        parser = parsers.get(m.group(1))
        if parser is None:
            continue  # "ptd is ..." in prose, not a command
        rest = re.split(r"\s(?:\||;|&&|#)|\$\(|`", cmd_line[m.end():])[0]
        rest = CMD.split(rest)[0]  # the next ptd command starts its own flags
        known = {s for a in parser._actions for s in a.option_strings}
        bad += [f"ptd {m.group(1)} {f}" for f in FLAG.findall(rest) if f not in known]
    return bad


@pytest.fixture(scope="module")
def parsers():
    from ptd.cli import build_parser
    return subparsers(build_parser())


def test_the_docs_exist():
    names = {p.name for p in doc_files()}
    assert {"README.md", "benchmarks.md", "planning.md", "training.md"} <= names


def test_relative_links_resolve():
    bad = [b for p in doc_files() for b in broken_links(p)]
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_ptd_flags_exist(parsers):
    bad, seen = [], 0
    for p in doc_files():
        for line, text in commands(p):
            seen += 1
            bad += [f"{rel(p)}:{line}: {b} is not a flag of that command"
                    for b in unknown_flags(text, parsers)]
    assert seen > 20, "the docs show hardly any ptd commands: is the extraction broken?"
    assert not bad, "unknown flags:\n" + "\n".join(bad)


# The checks themselves, on text whose right answer is known by reading it.

def test_checker_finds_a_wrong_flag_and_its_line(tmp_path, parsers):
    doc = tmp_path / "x.md"
    doc.write_text("intro\n\nrun `ptd train --nproc 2\n--no-such-flag` here\n\n```\n"
                   "$ ptd plan --model small \\\n    --gpus 4 --bogus-flag | grep x --color\n"
                   "ptd estimate --sp/--no-sp\n```\n"
                   "`ptd bench scaling --quick` and `ptd calibrate --quick`\n")
    found = [(n, b) for n, t in commands(doc) for b in unknown_flags(t, parsers)]
    assert found == [(3, "ptd train --no-such-flag"), (7, "ptd plan --bogus-flag")]


def test_checker_finds_a_missing_file_and_anchor(tmp_path):
    (tmp_path / "b.md").write_text("# Title\n\n## `ptd plan --try` on this machine\n\n## Closed ##\n")
    doc = tmp_path / "a.md"
    doc.write_text("see [b](b.md), [closed](b.md#closed), [the try](b.md#ptd-plan---try-on-this-machine),\n"
                   "[gone](c.md), [no such part](b.md#nowhere) and [web](https://x.org)\n"
                   "```\n[not a link](d.md)\n```\n")
    bad = broken_links(doc)
    assert len(bad) == 2
    assert bad[0].endswith("a.md:2: link to 'c.md': c.md does not exist")
    assert "a.md:2: link to 'b.md#nowhere': no heading #nowhere" in bad[1]

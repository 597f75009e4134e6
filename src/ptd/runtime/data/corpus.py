"""Where tokens come from: files on disk turned into one memory-mapped token stream.

Tokenisation is byte-level (a token is a byte, vocabulary 256): nothing to download and
nothing to train, and any text file is already tokenised. The default corpus is the Python
standard library's own ``.py`` files (``sysconfig.get_paths()["stdlib"]``, without any
``site-packages``/``dist-packages`` below it), in sorted order: about 1,800 files and
31 MB of tokens on CPython 3.11, present wherever Python is.

Sources (``DataConfig.paths``): text files, folders (every file below them, sorted, hidden
ones skipped), globs (``**`` allowed), and pre-tokenised ``.bin`` files of little-endian
``uint16`` token ids. The stream is all text files concatenated in the order given,
followed by the ``.bin`` files in the order given.

Text is concatenated once into a cache file under ``$PTD_HOME/cache`` (default
``~/.ptd/cache``), keyed by the files' names, sizes and modification times, so that eight
workers memory-map one file instead of each reading 1,800. ``ptd train`` builds the cache
before it starts the workers; writes are atomic (temporary file, then rename).

No torch here: the launcher resolves and checks the data before any worker starts.
"""

from __future__ import annotations

import glob
import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import PtdError, ptd_home
from ...specs import DataConfig


def cache_dir() -> Path:
    return ptd_home() / "cache"


def stdlib_files() -> list[Path]:
    """The standard library's ``.py`` files, sorted, excluding installed packages."""
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in ("site-packages", "dist-packages")]
        out.extend(Path(folder, f) for f in files if f.endswith(".py"))
    return sorted(out)


def _expand(entry: str) -> list[Path]:
    p = Path(entry).expanduser()
    if p.is_file():
        return [p]
    if p.is_dir():
        return sorted(f for f in p.rglob("*") if f.is_file()
                      and not any(part.startswith(".") for part in f.relative_to(p).parts))
    matches = sorted(Path(m) for m in glob.glob(str(p), recursive=True) if Path(m).is_file())
    if not matches:
        raise PtdError(f"data: no file matches {entry!r}")
    return matches


@dataclass(frozen=True)
class Sources:
    """The files of a corpus: byte-level text files and ``uint16`` ``.bin`` files."""

    text: tuple[Path, ...]
    bins: tuple[Path, ...]
    name: str

    @staticmethod
    def resolve(data: DataConfig) -> "Sources":
        if not data.paths:
            files = stdlib_files()
            if not files:
                raise PtdError("data: found no .py files in the standard library; pass --data")
            return Sources(tuple(files), (), "python-stdlib")
        text: list[Path] = []
        bins: list[Path] = []
        for entry in data.paths:
            for f in _expand(entry):
                (bins if f.suffix == ".bin" else text).append(f)
        return Sources(tuple(text), tuple(bins), ",".join(data.paths))


def _fingerprint(files: tuple[Path, ...]) -> str:
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def text_cache(files: tuple[Path, ...]) -> Path:
    """The concatenated bytes of ``files`` as one cached file (built if missing)."""
    path = cache_dir() / f"text-{_fingerprint(files)}.u8"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "wb") as out:
        for f in files:
            out.write(f.read_bytes())
    os.replace(tmp, path)
    return path


class TokenStream:
    """Read-only concatenation of memory-mapped token arrays, viewed over ``[lo, hi)``."""

    def __init__(self, segments: list[np.ndarray], lo: int = 0, hi: int | None = None) -> None:
        self.segments = segments
        self.offsets = np.cumsum([0] + [len(s) for s in segments])
        self.lo = lo
        self.hi = int(self.offsets[-1]) if hi is None else hi

    def __len__(self) -> int:
        return self.hi - self.lo

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens ``[start, start+length)`` of this view as int64 (may span segments)."""
        a = self.lo + start
        b = a + length
        if start < 0 or b > self.hi:
            raise IndexError(f"tokens [{start}, {start + length}) outside a stream of {len(self)}")
        out = np.empty(length, dtype=np.int64)
        i = int(np.searchsorted(self.offsets, a, side="right")) - 1
        pos = a
        while pos < b:
            take = min(b, int(self.offsets[i + 1])) - pos
            local = pos - int(self.offsets[i])
            out[pos - a:pos - a + take] = self.segments[i][local:local + take]
            pos += take
            i += 1
        return out

    def split(self, val_fraction: float) -> tuple["TokenStream", "TokenStream"]:
        """(train, validation): validation is the last ``val_fraction`` of the tokens."""
        cut = self.hi - int(len(self) * val_fraction)
        return TokenStream(self.segments, self.lo, cut), TokenStream(self.segments, cut, self.hi)


def open_stream(sources: Sources) -> TokenStream:
    segments: list[np.ndarray] = []
    if sources.text:
        segments.append(np.memmap(text_cache(sources.text), dtype=np.uint8, mode="r"))
    for f in sources.bins:
        if f.stat().st_size % 2:
            raise PtdError(f"data: {f} has an odd number of bytes; .bin files hold uint16 tokens")
        if f.stat().st_size:
            segments.append(np.memmap(f, dtype="<u2", mode="r"))
    segments = [s for s in segments if len(s)]
    if not segments:
        raise PtdError(f"data: {sources.name} holds no tokens")
    return TokenStream(segments)


def check_stream(stream: TokenStream, sources: Sources, vocab_size: int, seq_len: int) -> None:
    """Raise :class:`PtdError` if the data cannot feed this model (run by the launcher:
    it scans ``.bin`` files once, which the workers then trust)."""
    if len(stream) < seq_len + 1:
        raise PtdError(f"data: {sources.name} has {len(stream)} tokens, fewer than seq_len+1 = {seq_len + 1}")
    if sources.text and vocab_size < 256:
        raise PtdError(f"data: byte-level text needs a vocabulary of at least 256, the model has {vocab_size}")
    for seg in stream.segments:
        if seg.dtype != np.uint8 and len(seg) and int(seg.max()) >= vocab_size:
            raise PtdError(f"data: a .bin file holds token {int(seg.max())} >= vocabulary {vocab_size}")

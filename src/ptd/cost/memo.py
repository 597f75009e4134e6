"""One way to remember pure functions of specs: by the identity of the spec arguments.

``functools.lru_cache`` hashes every argument on every call; hashing a ``ModelSpec`` (twenty
fields) costs more than much of what is remembered, and a ``HardwareSpec`` holds dicts and
cannot be hashed at all. An ``id`` costs nothing. Each entry keeps its objects alive, so an
id is never reused while its entry exists; the memo is emptied when it reaches ``maxsize``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def memo(fn: Callable[..., T] | None = None, *, identity: tuple[int, ...] = (0,),
         maxsize: int = 16384) -> Any:
    """Remember ``fn(*args)``: the positional arguments at ``identity`` by identity, the
    others by value (they must be hashable). Use as ``@memo``, ``@memo(identity=(0, 1))`` or
    ``memo(f, identity=(3,))``; ``.cache_clear()`` empties it."""
    def decorate(f: Callable[..., T]) -> Callable[..., T]:
        table: dict[tuple, tuple] = {}

        @functools.wraps(f)
        def wrapper(*args: Any) -> T:
            key = tuple(id(a) if i in identity else a for i, a in enumerate(args))
            hit = table.get(key)
            if hit is not None and all(hit[0][j] is args[i] for j, i in enumerate(identity)):
                return hit[1]
            if len(table) >= maxsize:
                table.clear()
            value = f(*args)
            table[key] = (tuple(args[i] for i in identity), value)
            return value

        wrapper.cache_clear = table.clear  # type: ignore[attr-defined]
        return wrapper

    return decorate(fn) if fn is not None else decorate

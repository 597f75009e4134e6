"""cost/memo.py: the identity memo's contract, call by call (written from the survivors of a
mutation run, docs/testing.md). Each test counts the calls that reach the wrapped function."""

import pytest

from ptd.cost.memo import memo


def counted(identity=None, maxsize=None):
    calls = []

    def f(*args):
        """Doc of f."""
        calls.append(args)
        return len(calls)

    kw = {}
    if identity is not None:
        kw["identity"] = identity
    if maxsize is not None:
        kw["maxsize"] = maxsize
    return memo(f, **kw), calls


def test_default_identity_is_the_first_argument():
    g, calls = counted()
    a = {"unhashable": [1]}          # a dict: only usable as a key by its id
    assert g(a, 2) == 1
    assert g(a, 2) == 1              # the same dict object: remembered, f not called again
    assert g({"unhashable": [1]}, 2) == 2   # an equal but distinct dict: a new entry
    assert g(a, 3) == 3              # the second argument is by value: 3 is a new key
    assert len(calls) == 3


def test_identity_argument_found_again_even_if_it_is_not_equal_to_itself():
    # NaN != NaN, but it is itself: the identity check is `is`, not `==`
    g, calls = counted(identity=(0,))
    nan = float("nan")
    assert g(nan) == 1
    assert g(nan) == 1
    assert len(calls) == 1


def test_identity_and_maxsize_are_keyword_only():
    def f(x):
        return x
    with pytest.raises(TypeError):
        memo(f, (0,))  # type: ignore[misc]


def test_default_maxsize_is_16384_entries():
    # by value (identity=()); the memo empties itself when a new key finds 16384 entries
    g, calls = counted(identity=())
    for k in range(16384):
        g(k)
    assert len(calls) == 16384
    g(0)                               # 16384 entries held: key 0 is still there
    assert len(calls) == 16384
    g(16384)                           # the 16385th key: the table (full) is emptied first
    assert len(calls) == 16385
    g(0)                               # so key 0 is computed again
    assert len(calls) == 16386
    g(16384)                           # and the key stored after the clear is remembered
    assert len(calls) == 16386


def test_small_maxsize_clears_only_when_full():
    g, calls = counted(identity=(), maxsize=2)
    g(1); g(2)                        # two entries: full
    g(1); g(2)                        # both remembered
    assert len(calls) == 2
    g(3)                              # full: emptied, then 3 stored
    g(3)
    assert len(calls) == 3
    g(1)                              # 1 was dropped with the clear
    assert len(calls) == 4


def test_cache_clear_and_wraps():
    g, calls = counted()
    a = object()
    g(a); g.cache_clear(); g(a)
    assert len(calls) == 2
    # functools.wraps: the wrapper shows the wrapped function's name and doc
    assert g.__name__ == "f"
    assert g.__doc__ == "Doc of f."
    assert g.__wrapped__.__name__ == "f"


def test_decorator_forms():
    @memo
    def a(x):
        return [x]

    @memo(identity=(0, 1))
    def b(x, y):
        return [x, y]

    k = []
    assert a(k) is a(k)
    assert b(k, k) is b(k, k)
    assert b(k, []) is not b(k, [])   # the second list is a new object each time


def test_maxsize_0_keeps_only_the_last_entry():
    # maxsize 0: every miss finds the table at (or past) its size and empties it before
    # storing, so the memo never holds more than the entry just stored. An entry keeps its
    # identity arguments alive, so count the ones still alive: of five distinct objects
    # passed in turn, only the fifth (the last entry) survives a collection.
    import gc
    import weakref

    class Obj:
        pass

    g = memo(lambda o: 0, maxsize=0)   # returns 0: the value holds no reference to o
    objs = [Obj() for _ in range(5)]
    refs = [weakref.ref(o) for o in objs]
    for o in objs:
        g(o)
    del objs, o
    gc.collect()
    assert [r() is not None for r in refs] == [False, False, False, False, True]

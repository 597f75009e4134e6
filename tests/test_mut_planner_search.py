"""planner/search.py by hand, the small pure parts: --fix parsing and its bounds, divisors.
(Started at the end of a session; search.py's mutation score is not measured yet.)"""

import pytest

from ptd.errors import PtdError
from ptd.planner import search as S


def test_parse_fix_aliases_types_and_blanks():
    # aliases: mb -> micro_batch, rc -> recompute, uneven -> uneven_stages; empty items skipped
    assert S.parse_fix(["tp=8, pp=16,", " mb=2 ", "rc=full,uneven=off", "zero=0"]) == {
        "tp": 8, "pp": 16, "micro_batch": 2, "recompute": "full", "uneven_stages": False,
        "zero": 0}
    assert S.parse_fix(["sp=YES", "offload=1"]) == {"sp": True, "offload": True}
    assert S.parse_fix([]) == {}


@pytest.mark.parametrize("spec", ["tp", "tp=", "=4", "bogus=1", "tp=x", "tp=0", "zero=-1",
                                  "zero=4", "sp=maybe", "recompute=some", "schedule=zb"])
def test_parse_fix_refuses(spec):
    with pytest.raises(PtdError):
        S.parse_fix([spec])


def test_fix_bounds_edges():
    # ints >= 1 except zero, which is 0..3
    assert S.parse_fix(["dp=1", "zero=3"]) == {"dp": 1, "zero": 3}


def test_divisors():
    assert S._divisors(1) == [1]
    assert S._divisors(12) == [1, 2, 3, 4, 6, 12]
    assert S._divisors(7) == [1, 7]

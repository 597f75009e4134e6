"""The real survivors of a cosmic-ray sample of specs/typecheck.py (2026-11-30, 20 of 40
killed; docs/testing.md): the input-size limit at its edge and in its message, an unreadable
file's message, literal fields, the interval checks' open and closed ends, and the hardware
counts' bounds. Expected values by hand from each rule's statement."""

import dataclasses
from pathlib import Path
from typing import Literal

import pytest

from ptd.errors import PtdError
from ptd.specs import typecheck as T
from ptd.specs.hardware import get_hardware_preset

MIB = 2**20


def test_a_file_of_64_mib_is_read_and_one_byte_more_is_refused(tmp_path):
    edge = tmp_path / "edge.toml"
    with open(edge, "wb") as f:  # sparse: NUL bytes, which are UTF-8
        f.truncate(64 * MIB)
    assert len(T.read_text_file(edge, "config")) == 64 * MIB
    over = tmp_path / "over.toml"
    with open(over, "wb") as f:
        f.truncate(64 * MIB + 1)
    with pytest.raises(PtdError) as e:
        T.read_text_file(over, "config")
    assert str(e.value) == f"config {str(over)!r} is larger than 64 MiB; not a config file"


def test_an_unreadable_file_says_why_in_words(tmp_path, monkeypatch):
    p = tmp_path / "locked.toml"
    p.write_text("x = 1\n")

    def refuse(self):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(Path, "read_bytes", refuse)
    with pytest.raises(PtdError) as e:
        T.read_text_file(p, "config")
    assert str(e.value) == f"cannot read config {str(p)!r}: Permission denied"


def test_a_literal_field_takes_its_values_and_nothing_else():
    kind = Literal["gpu", "cpu"]
    assert T._ok(kind, "cpu") is True
    assert T._ok(kind, "tpu") is False
    assert T._ok(Literal[1, 2], 2) is True
    assert T._ok(Literal[1, 2], True) is False  # a bool is not the integer 1 here


@pytest.mark.parametrize("v, lo_open, hi_open, ok, shown", [
    (0.0, False, False, True, "[0, 1]"), (1.0, False, False, True, "[0, 1]"),
    (-0.1, False, False, False, "[0, 1]"), (1.1, False, False, False, "[0, 1]"),
    (0.0, True, False, False, "(0, 1]"), (-1.0, True, False, False, "(0, 1]"),
    (0.5, True, True, True, "(0, 1)"),
    (1.0, False, True, False, "[0, 1)"), (2.0, False, True, False, "[0, 1)"),
])
def test_intervals_by_their_ends(v, lo_open, hi_open, ok, shown):
    if ok:
        T.in_range("hw: ", "x", v, 0, 1, lo_open=lo_open, hi_open=hi_open)
        return
    with pytest.raises(PtdError) as e:
        T.in_range("hw: ", "x", v, 0, 1, lo_open=lo_open, hi_open=hi_open)
    assert str(e.value) == f"hw: x must be in {shown}, got {v!r}"


def test_hardware_counts_at_their_bounds():
    h100 = get_hardware_preset("h100-sxm")
    assert dataclasses.replace(h100, sm_count=2**20).sm_count == 2**20
    with pytest.raises(PtdError, match="sm_count must be in 0..2\\*\\*20"):
        dataclasses.replace(h100, sm_count=2**20 + 1)
    assert dataclasses.replace(h100, comm_sms=h100.sm_count - 1).comm_sms == 131
    with pytest.raises(PtdError, match="comm_sms must be >= 0 and below sm_count"):
        dataclasses.replace(h100, comm_sms=500)
    assert dataclasses.replace(h100, devices_per_node=2**20).devices_per_node == 2**20
    for bad in (0, 2**20 + 1):
        with pytest.raises(PtdError, match="devices_per_node must be in 1..2\\*\\*20"):
            dataclasses.replace(h100, devices_per_node=bad)


def test_worker_tables_start_at_one_worker():
    cpu = get_hardware_preset("cpu")
    for table in ("dtensor_reduce_measured", "tp_situ_measured", "fsdp_situ_measured"):
        assert getattr(cpu.replace(**{table: {1: ((1e6, 1e-3),)}}), table) == {1: ((1e6, 1e-3),)}
        with pytest.raises(PtdError, match=f"{table} wants workers \\(1, 2, ...\\)"):
            cpu.replace(**{table: {0: ((1e6, 1e-3),)}})


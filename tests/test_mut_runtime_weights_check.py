"""``--init-from``'s checks of a safetensors file, one rule at a time (written from the
mutation run of runtime/checkpoint/weights_check.py; docs/testing.md).

Every file here is built by hand from the safetensors format (8-byte little-endian header
length, a JSON header ``name -> {dtype, shape, data_offsets}``, then the data), so the
expected verdicts follow from the format, not from the code under test."""

import json
import struct

import pytest
import torch

from ptd.errors import PtdError
from ptd.runtime.checkpoint.weights_check import check_header, check_tensors


def write(path, header, body_len=None, raw_header=None):
    """A file with ``header`` (JSON) and a zero body as long as its largest end offset."""
    h = raw_header if raw_header is not None else json.dumps(header).encode()
    if body_len is None:
        body_len = max([t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"],
                       default=0)
    path.write_bytes(struct.pack("<Q", len(h)) + h + bytes(body_len))
    return path


# bytes per element by the format: F64 8, F32 4, F16 2, BF16 2
@pytest.mark.parametrize("dtype,size", [("F64", 8), ("F32", 4), ("F16", 2), ("BF16", 2)])
def test_a_good_file_of_every_float_dtype_passes(tmp_path, dtype, size):
    # two tensors, [2, 3] then [4]: 6 and 4 elements, back to back
    a, b = 6 * size, 6 * size + 4 * size
    header = {"__metadata__": {"format": "pt"},
              "w": {"dtype": dtype, "shape": [2, 3], "data_offsets": [0, a]},
              "v": {"dtype": dtype, "shape": [4], "data_offsets": [a, b]}}
    got = check_header(write(tmp_path / "m.safetensors", header))
    assert got == header


def test_a_scalar_and_an_empty_tensor_pass(tmp_path):
    # shape [] holds prod([]) = 1 element; shape [0] holds none (a 0-byte span)
    header = {"s": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
              "e": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]}}
    assert check_header(write(tmp_path / "m.safetensors", header)) == header


def refused(path, match):
    with pytest.raises(PtdError, match=match) as e:
        check_header(path)
    assert str(e.value).startswith(f"init_from: {path}")


def test_shorter_than_the_length_field(tmp_path):
    p = tmp_path / "m.safetensors"
    p.write_bytes(b"\x01\x02\x03\x04\x05\x06\x07")  # 7 bytes: no room for the 8-byte length
    refused(p, "shorter than a safetensors header")


def test_a_header_length_beyond_the_file(tmp_path):
    p = tmp_path / "m.safetensors"
    p.write_bytes(struct.pack("<Q", 3) + b"{}")  # says 3 header bytes, 2 follow (size 10)
    refused(p, r"header length 3 exceeds the file \(10 bytes\)")
    r = tmp_path / "m17.safetensors"
    r.write_bytes(struct.pack("<Q", 10) + b'{"a": 1}\n')  # says 10, 9 follow (size 17)
    refused(r, r"header length 10 exceeds the file \(17 bytes\)")
    q = tmp_path / "exact.safetensors"
    q.write_bytes(struct.pack("<Q", 2) + b"{}")  # exactly 2 follow: a valid empty header
    assert check_header(q) == {}


def test_a_header_that_is_not_json_or_not_an_object(tmp_path):
    refused(write(tmp_path / "a", {}, 0, raw_header=b"\xff\xfe"), "not JSON")
    refused(write(tmp_path / "b", {}, 0, raw_header=b"{nope"), "not JSON")
    refused(write(tmp_path / "c", {}, 0, raw_header=b"[1, 2]"), "not a JSON object")


def test_an_unreadable_path(tmp_path):
    refused(tmp_path / "missing.safetensors", r"cannot read \(No such file or directory\)$")


@pytest.mark.parametrize("entry", [
    {"shape": [1], "data_offsets": [0, 4]},                    # no dtype
    {"dtype": "F32", "data_offsets": [0, 4]},                  # no shape
    {"dtype": "F32", "shape": [1]},                            # no offsets
    {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]},  # three offsets
    "F32",                                                     # not an object
])
def test_malformed_entries(tmp_path, entry):
    raw = json.dumps({"w": entry}).encode()
    refused(write(tmp_path / "m", {}, 4, raw_header=raw), "malformed header entry")


@pytest.mark.parametrize("dtype", ["I32", "I64", "U8", "BOOL", "F8_E4M3"])
def test_non_float_dtypes(tmp_path, dtype):
    header = {"w": {"dtype": dtype, "shape": [1], "data_offsets": [0, 4]}}
    refused(write(tmp_path / "m", header), f"dtype {dtype}; weights must be floating point")


@pytest.mark.parametrize("shape", [[-1], [2, -3], [1.5], ["2"], 4, None])
def test_malformed_shapes(tmp_path, shape):
    header = {"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, 4]}}
    refused(write(tmp_path / "m", header), "malformed shape")


@pytest.mark.parametrize("offsets", [
    [0, 8],     # [2] x F32 is 8 bytes: right
    [0, 12],    # one element too many
    [0, 4],     # one too few
    [4, 0],     # reversed
    [-4, 4],    # negative start (8 bytes, but before the data)
    [-1, 7],    # the same, one byte before
    [0.0, 8],   # not integers
])
def test_offsets_must_hold_the_shape(tmp_path, offsets):
    header = {"w": {"dtype": "F32", "shape": [2], "data_offsets": offsets}}
    path = write(tmp_path / "m", header, body_len=12)
    if offsets == [0, 8] and all(type(o) is int for o in offsets):  # ([0.0, 8] == [0, 8])
        refused(path, r"the file has .* bytes, its header describes")  # body 12, described 8
        assert check_header(write(tmp_path / "ok", header))  # with an 8-byte body it passes
    else:
        refused(path, "do not hold")


def test_the_file_size_must_match_the_largest_end(tmp_path):
    header = {"a": {"dtype": "F16", "shape": [2], "data_offsets": [4, 8]},  # out of order:
              "b": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}  # the end is 8
    h = json.dumps(header).encode()
    ok = tmp_path / "ok"
    ok.write_bytes(struct.pack("<Q", len(h)) + h + bytes(8))
    assert check_header(ok) == header
    for extra, name in ((-1, "short"), (1, "long")):
        p = tmp_path / name
        p.write_bytes(struct.pack("<Q", len(h)) + h + bytes(8 + extra))
        size = 8 + len(h) + 8 + extra
        refused(p, rf"the file has {size} bytes, its header describes {8 + len(h) + 8} ")


def test_large_files_compare_sizes_by_value(tmp_path):
    # sizes above 256 are distinct int objects in CPython: an identity test would refuse
    # every real file; this one is 8 + header + 4096 bytes
    header = {"w": {"dtype": "F32", "shape": [32, 32], "data_offsets": [0, 4096]}}
    assert check_header(write(tmp_path / "m", header)) == header


def test_check_tensors():
    check_tensors({"a": torch.zeros(3), "b": torch.ones(2, dtype=torch.bfloat16)}, "f")
    with pytest.raises(PtdError, match=r"^init_from: f: a has dtype torch.int32, not floating"):
        check_tensors({"a": torch.zeros(3, dtype=torch.int32)}, "f")
    t = torch.tensor([1.0, float("inf"), float("nan"), -float("inf"), 2.0])
    with pytest.raises(PtdError, match=r"^init_from: f: w holds 3 non-finite value\(s\)"):
        check_tensors({"ok": torch.zeros(1), "w": t}, "f")


def test_a_header_is_at_most_100_mib(tmp_path):
    # the length field is trusted only up to 100 MiB (a damaged field must not make ptd read a
    # whole checkpoint as JSON). Sparse files of 8 + 100 MiB + 2 bytes: a length of exactly
    # 100 MiB is read (and is not JSON: zeros), one byte more is refused unread.
    cap = 100 * 2**20
    for n, match in ((cap, "not JSON"), (cap + 1, rf"header length {cap + 1} exceeds")):
        p = tmp_path / f"h{n}"
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", n))
            f.truncate(8 + cap + 2)
        refused(p, match)


def test_every_tensor_name_is_checked(tmp_path):
    # only the literal "__metadata__" entry is skipped: names that sort before or after it
    # ("A", "Weight", "_a", "z") are tensors and are checked like any other
    for name in ("A", "Weight", "_a", "z"):
        header = {name: {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]}}
        refused(write(tmp_path / name, header), f"tensor '{name}' has dtype I32")


def test_the_size_message_adds_the_parts(tmp_path):
    # "describes 8 + n + end": the length field, the header and the data, added; header
    # lengths n + 0..7 and a 6-byte tensor make every bit pattern of the sum occur
    for pad in range(8):
        header = {"__metadata__": {"p": "x" * pad},
                  "w": {"dtype": "F16", "shape": [3], "data_offsets": [0, 6]}}
        h = json.dumps(header).encode()
        p = tmp_path / f"pad{pad}"
        p.write_bytes(struct.pack("<Q", len(h)) + h + bytes(7))  # one byte too many
        refused(p, rf"the file has {8 + len(h) + 7} bytes, its header describes "
                   rf"{8 + len(h) + 6} \(truncated or padded\)")

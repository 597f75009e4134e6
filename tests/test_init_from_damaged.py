"""``--init-from`` refuses damaged weights before any worker starts: a header
that is not JSON, offsets that disagree with the file, a non-float dtype, a NaN in the
values -- each one line, exit 2 (before: a corrupted file trained from garbage, exit 0)."""

import json
import struct

import pytest
import torch

from helpers import forbid_processes
from ptd.cli import main
from ptd.runtime.checkpoint import hf
from ptd.runtime.checkpoint.restore import expected_params
from ptd.specs import get_preset


@pytest.fixture
def folder(tmp_path, monkeypatch):
    forbid_processes(monkeypatch)
    monkeypatch.setenv("PTD_HOME", str(tmp_path / "home"))
    spec = get_preset("tiny")
    g = torch.Generator().manual_seed(0)
    state = {k: torch.randn(shape, generator=g) * 0.02 for k, shape in expected_params(spec).items()}
    out = tmp_path / "hf"
    hf.save_folder(state, spec, out)
    return out


def _rewrite(path, mutate):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    body = bytearray(raw[8 + n:])
    header, body = mutate(header, body)
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + bytes(body))


def _first(header):
    return next(k for k in header if k != "__metadata__")


def nan_in_values(header, body):
    a, _ = header[_first(header)]["data_offsets"]
    body[a:a + 4] = struct.pack("<f", float("nan"))
    return header, body


def int_dtype(header, body):
    header[_first(header)]["dtype"] = "I32"
    return header, body


def bad_offsets(header, body):
    t = header[_first(header)]
    t["data_offsets"] = [t["data_offsets"][0], t["data_offsets"][1] + 4]
    return header, body


def truncated(header, body):
    return header, body[:-16]


@pytest.mark.parametrize("damage,match", [
    (nan_in_values, r"holds 1 non-finite value"),
    (int_dtype, r"has dtype I32; weights must be floating point"),
    (bad_offsets, r"offsets .* do not hold"),
    (truncated, r"truncated or padded"),
])
def test_damaged_weights_refused_in_one_line(folder, tmp_path, capfd, damage, match):
    import re
    _rewrite(folder / "model.safetensors", damage)
    rc = main(["train", "--init-from", str(folder), "--nproc", "1", "--steps", "2",
               "--out", str(tmp_path / "run"), "--global-batch", "4", "--seq-len", "32"])
    err = capfd.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("ptd train: error: init_from"), err
    assert re.search(match, err), err
    assert not (tmp_path / "run").exists()


def test_header_that_is_not_json(folder, tmp_path, capfd):
    p = folder / "model.safetensors"
    raw = bytearray(p.read_bytes())
    raw[8:12] = b"\xff\xfe\x00\x01"
    p.write_bytes(bytes(raw))
    rc = main(["train", "--init-from", str(folder), "--nproc", "1", "--out", str(tmp_path / "r")])
    err = capfd.readouterr().err
    assert rc == 2 and "header is not JSON" in err and err.count("\n") == 1, err


def test_good_weights_pass(folder):
    hf.precheck(folder, get_preset("tiny"), 32)  # raises on any problem


def test_gpt2_fused_qkv_with_extra_columns_is_refused(tmp_path, capfd, monkeypatch):
    # GPT-2's c_attn holds q, k and v side by side: 3 x 64 = 192 columns for tiny-gpt. With 5
    # more (and a bias to match) the q/k/v slices used to drop them silently and train.
    from safetensors.torch import load_file, save_file
    forbid_processes(monkeypatch)
    monkeypatch.setenv("PTD_HOME", str(tmp_path / "home"))
    spec = get_preset("tiny-gpt")
    assert (spec.hidden, spec.q_dim + 2 * spec.kv_dim) == (64, 192)  # what the file must hold
    g = torch.Generator().manual_seed(0)
    state = {k: torch.randn(shape, generator=g) * 0.02 for k, shape in expected_params(spec).items()}
    out = tmp_path / "hf"
    hf.save_folder(state, spec, out)
    t = load_file(str(out / "model.safetensors"))
    for k in list(t):
        if k.endswith("c_attn.weight"):
            t[k] = torch.cat([t[k], torch.zeros(64, 5)], 1).contiguous()
        elif k.endswith("c_attn.bias"):
            t[k] = torch.cat([t[k], torch.zeros(5)]).contiguous()
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    rc = main(["train", "--model", "tiny-gpt", "--init-from", str(out), "--nproc", "1",
               "--steps", "2", "--out", str(tmp_path / "run"), "--global-batch", "4",
               "--seq-len", "32"])
    err = capfd.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert "c_attn has shape (64, 197) (bias (197,)), expected (64, 192)" in err, err
    assert not (tmp_path / "run").exists()

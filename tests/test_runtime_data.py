"""Data: sources, the token cache, layout-independent global batches, loader state."""

import numpy as np
import pytest

from ptd.errors import PtdError
from ptd.runtime.data.corpus import Sources, TokenStream, check_stream, open_stream, stdlib_files
from ptd.runtime.data.loader import DataLoader, eval_batches
from ptd.specs import DataConfig


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PTD_HOME", str(tmp_path))


def _stream(n=5000, seed=0):
    return TokenStream([np.random.default_rng(seed).integers(0, 256, n).astype(np.uint8)])


def _loader(stream, dp_rank, dp, mb=2, gb=8, seq=16, seed=0):
    return DataLoader(stream, seq_len=seq, global_batch=gb, micro_batch=mb, dp_rank=dp_rank,
                      dp_size=dp, seed=seed)


def _global_rows(stream, dp, mb, steps=3, **kw):
    """The global batches of ``steps`` steps as seen by concatenating all dp ranks."""
    loaders = [_loader(stream, r, dp, mb=mb, **kw) for r in range(dp)]
    out = []
    for _ in range(steps):
        rows = []
        for ld in loaders:
            rows += [x for m in ld.next() for x in m.inputs.tolist()]
        out.append(rows)
    return out


def test_global_batch_independent_of_dp_and_micro_batch():
    s = _stream()
    ref = _global_rows(s, dp=1, mb=8)
    assert _global_rows(s, dp=2, mb=4) == ref
    assert _global_rows(s, dp=4, mb=1) == ref
    assert _global_rows(s, dp=2, mb=2) == ref


def test_ranks_disjoint_and_targets_shifted():
    s = _stream()
    a, b = _loader(s, 0, 2), _loader(s, 1, 2)
    assert set(a.rows()).isdisjoint(b.rows())
    ma, mb_ = a.next(), b.next()
    assert len(ma) == 2 and ma[0].inputs.shape == (2, 16)
    rows_a = {tuple(x) for m in ma for x in m.inputs.tolist()}
    rows_b = {tuple(x) for m in mb_ for x in m.inputs.tolist()}
    assert rows_a.isdisjoint(rows_b)
    m = ma[0]
    assert (m.inputs[:, 1:] == m.targets[:, :-1]).all()


def test_deterministic_from_seed_and_different_for_other_seeds():
    s = _stream()
    assert _global_rows(s, 2, 2, seed=3) == _global_rows(s, 2, 2, seed=3)
    assert _global_rows(s, 2, 2, seed=3) != _global_rows(s, 2, 2, seed=4)


def test_epochs_visit_every_window_once():
    s = _stream(n=16 * 8 + 1)  # exactly 8 windows
    ld = _loader(s, 0, 1, mb=8, gb=8)
    first = {tuple(x) for x in ld.next()[0].inputs.tolist()}
    assert len(first) == 8 and ld.epoch == 1
    second = [tuple(x) for x in ld.next()[0].inputs.tolist()]
    assert set(second) == first  # a new permutation of the same windows


def test_state_roundtrip_resumes_on_another_dp():
    s = _stream()
    full = _global_rows(s, dp=1, mb=8, steps=4)
    ld = _loader(s, 0, 1, mb=8)
    ld.next()
    ld.next()
    state = ld.state_dict()
    assert state["samples"] == 16
    resumed = [_loader(s, r, 2, mb=4) for r in range(2)]
    for r in resumed:
        r.load_state_dict(state)
    rows = [x for r in resumed for m in r.next() for x in m.inputs.tolist()]
    assert rows == full[2]
    with pytest.raises(PtdError, match="seed"):
        _loader(s, 0, 1, seed=9).load_state_dict(state)


def test_stream_reads_across_segments_and_split():
    segs = [np.arange(0, 5, dtype=np.uint16), np.arange(5, 12, dtype=np.uint16),
            np.arange(12, 20, dtype=np.uint16)]
    st = TokenStream(segs)
    assert len(st) == 20
    assert st.read(3, 12).tolist() == list(range(3, 15))
    train, val = st.split(0.25)
    assert len(train) == 15 and len(val) == 5
    assert val.read(0, 5).tolist() == list(range(15, 20))
    with pytest.raises(IndexError):
        train.read(10, 6)


def test_text_files_globs_and_bin(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b.txt").write_bytes(b"BBBB")
    (tmp_path / "d" / "a.txt").write_bytes(b"AA")
    (tmp_path / "d" / ".hidden").write_bytes(b"no")
    np.array([1, 2, 300], dtype="<u2").tofile(tmp_path / "t.bin")
    src = Sources.resolve(DataConfig(paths=(str(tmp_path / "d"), str(tmp_path / "*.bin"))))
    assert [p.name for p in src.text] == ["a.txt", "b.txt"] and len(src.bins) == 1
    st = open_stream(src)
    assert st.read(0, 9).tolist() == [65, 65, 66, 66, 66, 66, 1, 2, 300]
    check_stream(st, src, vocab_size=512, seq_len=4)
    with pytest.raises(PtdError, match="token 300"):
        check_stream(st, src, vocab_size=256, seq_len=4)
    with pytest.raises(PtdError, match="fewer than seq_len"):
        check_stream(st, src, vocab_size=512, seq_len=64)
    with pytest.raises(PtdError, match="no file matches"):
        Sources.resolve(DataConfig(paths=(str(tmp_path / "nope*.txt"),)))


def test_text_cache_built_once(tmp_path):
    f = tmp_path / "x.txt"
    f.write_bytes(b"hello world")
    src = Sources.resolve(DataConfig(paths=(str(f),)))
    open_stream(src)
    cached = list((tmp_path / "cache").glob("text-*.u8"))
    assert len(cached) == 1 and cached[0].read_bytes() == b"hello world"
    open_stream(src)
    assert list((tmp_path / "cache").glob("*")) == cached


def test_default_corpus_is_the_stdlib():
    files = stdlib_files()
    assert len(files) > 500
    assert files == sorted(files)
    assert not any("site-packages" in p.parts for p in files)
    assert any(p.name == "argparse.py" for p in files)


def test_eval_batches_fixed_and_split():
    s = _stream(n=16 * 40 + 1)
    a = eval_batches(s, seq_len=16, global_batch=8, micro_batch=2, dp_rank=0, dp_size=2)
    b = eval_batches(s, seq_len=16, global_batch=8, micro_batch=2, dp_rank=1, dp_size=2)
    assert len(a) == 4 and len(a[0]) == 2
    assert a[0][0].inputs[0].tolist() == s.read(0, 16).tolist()
    assert b[0][0].inputs[0].tolist() == s.read(4 * 16, 16).tolist()

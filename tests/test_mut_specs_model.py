"""The real survivors of a cosmic-ray sample of specs/model.py (2026-11-30, 36 of 40
killed; docs/testing.md): a single head's dimension and the vocabulary multiple's cap."""

import pytest

from ptd.errors import PtdError
from ptd.specs.model import ModelSpec

SHAPE = dict(name="one-head", n_layers=1, hidden=64, n_heads=1, n_kv_heads=1, ffn_hidden=128,
             vocab_size=256, max_seq_len=64)


def test_one_head_spans_the_hidden_width():
    assert ModelSpec(**SHAPE).head_dim == 64
    assert ModelSpec(**dict(SHAPE, n_heads=4, n_kv_heads=2)).head_dim == 16


def test_the_vocabulary_multiple_is_capped_at_65536():
    assert ModelSpec(**SHAPE, vocab_multiple=2**16).vocab_multiple == 65536
    with pytest.raises(PtdError) as e:
        ModelSpec(**SHAPE, vocab_multiple=2**16 + 1)
    assert str(e.value) == ("model one-head: vocab_multiple = 65537 is beyond any real model "
                            "(at most 65536)")

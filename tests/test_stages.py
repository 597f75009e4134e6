"""Pipeline stage placement (ptd.specs.stages) worked by hand: which rank runs each stage, and
how layers are split when they do not divide or the output layer weighs on the last stage.

The model is a GPT of hidden 64 (F = 256, 4 heads), where one block costs
6 * 49,152 + 12 * 64 * 64 = 344,064 FLOPs per token at sequence 64 and the output layer
6 * V * 64 = V / 896 of a block: with V = 1,344 the output layer weighs 1.5 blocks.
"""

from __future__ import annotations

import pytest

from helpers import gpt
from ptd.specs import ParallelPlan
from ptd.specs.stages import is_v_shape, stage_split, stage_to_rank


def test_zero_bubble_v_puts_stage_s_and_2p_1_s_on_rank_s() -> None:
    v = ParallelPlan(pp=4, dp=1, schedule="zero-bubble", global_batch=8)
    assert is_v_shape(v)
    assert [stage_to_rank(s, v) for s in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]


def test_interleaved_and_deeper_zero_bubble_go_round_robin() -> None:
    inter = ParallelPlan(pp=4, vpp=2, schedule="interleaved-1f1b", global_batch=8)
    zb3 = ParallelPlan(pp=2, vpp=3, schedule="zero-bubble", global_batch=8)
    assert not is_v_shape(inter) and not is_v_shape(zb3)
    assert [stage_to_rank(s, inter) for s in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [stage_to_rank(s, zb3) for s in range(6)] == [0, 1, 0, 1, 0, 1]
    assert not is_v_shape(ParallelPlan(pp=1, schedule="zero-bubble", global_batch=8))


def test_layers_that_do_not_divide_go_to_the_middle_stages_first() -> None:
    # 10 layers on 4 stages: 2 each and 2 left over, given to stages 1 and 2 (the ends hold
    # the embedding and the output layer); a negligible output layer (V = 64) changes nothing
    assert stage_split(gpt(10, 64, 4, V=64, S=64), 4, 64) == (2, 3, 3, 2)
    assert stage_split(gpt(11, 64, 4, V=64, S=64), 4, 64) == (3, 3, 3, 2)  # then stage 0
    assert stage_split(gpt(8, 64, 4, V=64, S=64), 4, 64) == (2, 2, 2, 2)  # even: even split


def test_a_heavy_output_layer_moves_layers_off_the_last_stage() -> None:
    m = gpt(8, 64, 4, V=1344, S=64)  # output layer = 1.5 blocks
    # even 2/2/2/2 loads the last stage with 3.5 blocks; moving one layer to stage 0 gives
    # 3/2/2/1 with loads 3, 2, 2, 2.5: the most loaded stage carries 3
    assert stage_split(m, 4, 64, True) == (3, 2, 2, 1)
    assert stage_split(m, 4, 64) == (2, 2, 2, 2)  # divides: even unless uneven is asked
    # 12 layers: 4/3/3/2 (loads 4, 3, 3, 3.5) and 4/4/3/1 (4, 4, 3, 2.5) tie on the most
    # loaded stage; the tie goes to the more even split (squares 2 against 6)
    assert stage_split(gpt(12, 64, 4, V=1344, S=64), 4, 64, True) == (4, 3, 3, 2)


def test_one_stage_holds_everything_and_too_many_stages_are_refused() -> None:
    assert stage_split(gpt(5, 64, 4, V=64, S=64), 1, 64) == (5,)
    with pytest.raises(ValueError, match="6 stages need at least as many layers"):
        stage_split(gpt(5, 64, 4, V=64, S=64), 6, 64, True)

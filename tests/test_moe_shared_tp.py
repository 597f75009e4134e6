"""Shared experts under tensor parallelism: split like the dense MLP (w1/w3 column parallel,
w2 row parallel), while the router and routed experts stay whole on every tp rank. The run
trains as one process does, and its model states are the cost model's on every rank (they
were not while the runtime replicated the shared experts that ``cost/params.py`` splits)."""

import functools
import json

import pytest

import helpers
from helpers import assert_same_params, losses

pytestmark = pytest.mark.dist

MODEL = """[model]
preset = "tiny-moe"
name = "tiny-moe-shared"
n_shared_experts = 1
"""
RUN_TIMEOUT = 120
trained = functools.partial(helpers.trained, dump_params=True, timeout=RUN_TIMEOUT)


@pytest.mark.timeout(2 * RUN_TIMEOUT + 30)
def test_shared_experts_split_over_tp_train_as_one_process(tmp_path):
    model = tmp_path / "moe.toml"
    model.write_text(MODEL)
    common = ["--model", str(model), "--steps", "4", "--global-batch", "4", "--seq-len", "32",
              "--warmup", "1", "--timeout", "60", "--micro-batch", "4", "--profile-steps", "0"]
    home = tmp_path / "home"
    ref = trained(tmp_path / "ref", "--nproc", "1", home=home, common=common)
    run = trained(tmp_path / "tp2", "--nproc", "2", "--tp", "2", home=home, common=common)
    la, lb = losses(run), losses(ref)
    assert len(la) == len(lb) == 4
    # 1e-4: the shared experts' products are summed over tp ranks in another order
    assert la == pytest.approx(lb, rel=1e-4)
    assert_same_params(run, ref, 1e-4)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["measured"]["memory"]["model_states_equal_per_rank"] is True
    # per tp rank, by hand (tiny-moe: h 64, F 64, 8 experts, 4 layers, SwiGLU): the shared
    # expert's 3 matrices of 64 x 64 are halved, the router (8 x 64) and the 8 routed experts'
    # 3 x 64 x 64 each are whole
    whole = json.loads((ref / "summary.json").read_text())["measured"]["memory"]["params"]
    split = summary["measured"]["memory"]["params"]
    assert whole - split == 4 * 3 * 64 * 64 // 2 * 4 + _halved_rest(summary)


def _halved_rest(summary):
    """Bytes of fp32 parameters outside the MoE layers that tp 2 halves: attention (q 64x64,
    k and v 32x64 each for 4 of 8 heads' GQA, o 64x64) in every block, the padded
    vocabulary's embedding and output (256 rows at tp 2 -- 128 x 2 -- by 64), halved."""
    attn = 4 * (64 * 64 + 2 * 32 * 64 + 64 * 64) // 2
    vocab = 2 * 256 * 64 // 2
    return (attn + vocab) * 4

"""Context parallelism in the cost model, the planner and the CLI: values derived by hand
from the alpha-beta formulas and the hardware's link specs (inputs, not the code under test)."""

import json

import pytest

from ptd.cost import context as CX
from ptd.cost.memory import memory
from ptd.cost.step import step_time
from ptd.specs import ClusterSpec, ParallelPlan, load_hardware, load_model

M405 = load_model("llama3.1-405b")
H100 = load_hardware("h100-sxm")
BIG = ClusterSpec(H100, 8192, 0)
CMD_405B = ["--model", "llama3.1-405b", "--hardware", "h100-sxm", "--gpus", "8192", "--tp", "8",
            "--pp", "16", "--cp", "16", "--seq-len", "131072", "--global-batch", "128",
            "--uneven-stages"]


def plan405(seq=131072, cp=16, **kw):
    base = dict(dp=4, tp=8, pp=16, cp=cp, sp=True, seq_len=seq, global_batch=128,
                recompute="full", schedule="zero-bubble", uneven_stages=True, dtype="bf16")
    return ParallelPlan(**(base | kw))


def test_cp_group_placement_and_kv_bytes_by_hand():
    p = plan405()
    # cp peers are tp = 8 apart: 16 of them on 16 nodes of 8, one per node
    assert CX.cp_group_split(p, 8) == (16, 1)
    # gradient group dp x cp = 64 ranks, 8 apart: 64 nodes, one each
    assert CX.grad_group(p, 8) == (64, 64, 1)
    # K and V of the whole sequence, this rank's 1024/8 kv columns, bf16
    assert CX.kv_exchange_bytes(M405, p) == 2 * 2 * 1 * 131072 * 1024 / 8 == 64 * 2**20


@pytest.mark.parametrize("seq", [131072, 8192])
def test_cp_terms_by_hand(seq):
    p = plan405(seq=seq)
    inter = H100.inter_node
    m_bytes = 2 * 2 * seq * 1024 / 8
    ag = 15 * inter.latency + 15 / 16 * m_bytes / inter.effective_bandwidth  # ring over 16 nodes
    # causal attention of the whole sequence, 1/cp of it on each rank: 0.5 * 4 s^2 d heads
    flops = 0.5 * 4 * seq**2 * 128 * (128 / 8) / 16
    t_attn = flops / (BIG.gemm_rate("bf16") * H100.attention_efficiency)
    exposed = 15 * max(0.0, ag / 15 - t_attn / 16) + 15 * max(0.0, ag / 15 - 2.5 * t_attn / 16)
    t = CX.cp_terms(M405, p, BIG, layers=8)
    assert t.comm_total == pytest.approx(8 * 2 * ag, rel=1e-12)
    assert t.comm_exposed == pytest.approx(8 * exposed, rel=1e-12, abs=1e-15)
    assert t.attn_forward == pytest.approx(8 * t_attn * (1 - 1 / 16), rel=1e-12)
    assert t.attn_backward == pytest.approx(2.5 * t.attn_forward)
    if seq == 131072:
        assert t.comm_exposed == 0.0  # 128k: the ring hides the exchange behind attention
    else:
        assert t.comm_exposed > 0.0  # 8k: attention per block is too short to hide it
    assert CX.cp_terms(M405, p.replace(cp=1, dp=64), BIG, 8) == CX.CPTerms()


def test_memory_activations_divided_by_cp_and_kv_buffer():
    m = M405
    # same dp (same micro-batches in flight); only cp differs
    p1 = plan405(seq=8192, cp=1, dp=32)
    p2 = plan405(seq=8192, cp=2, dp=32)
    a, b = memory(m, p1), memory(m, p2)
    assert b.activations == pytest.approx(a.activations / 2)
    assert b.buffers - a.buffers == pytest.approx(2 * 2 * 8192 * 1024 / 8)
    assert b.params == a.params and b.optimizer == a.optimizer  # cp replicates the weights


def test_step_time_reports_cp_and_splits_tokens():
    p = plan405()
    st = step_time(M405, p, BIG)
    assert st.cp_comm_total == pytest.approx(32 * CX.cp_terms(M405, p, BIG, 8).comm_total)
    assert st.cp_comm == 0.0
    parts = st.compute + st.tp_comm + st.pp_comm + st.dp_comm_exposed + st.bubble + st.optimizer
    # the K/V exchange hidden behind attention takes multiprocessors from it (cost/compute.py
    # overlap_loss): the hidden part is the whole exchange here (cp_comm is 0)
    assert 0 < st.overlap < st.cp_comm_total
    assert st.total == pytest.approx(parts + st.cp_comm + st.overlap)
    # the 8k case exposes some of it, and it is in the total
    q = plan405(seq=8192)
    s8 = step_time(M405, q, BIG)
    assert s8.cp_comm > 0
    assert s8.total == pytest.approx(s8.compute + s8.tp_comm + s8.pp_comm + s8.dp_comm_exposed
                                     + s8.bubble + s8.optimizer + s8.cp_comm + s8.overlap)


def test_estimate_405b_128k_prices_cp_and_fits_only_with_sp(ptd_cli):
    # The long-context layout (Llama 3 405B at 128k tokens, cp 16, dp 4) fits with sequence
    # parallelism: the cost model prices it at under the 78 GiB usable.
    from ptd.cost.estimate import estimate
    with_sp = estimate(M405, BIG, plan405(zero=0))
    assert with_sp.memory.fits and with_sp.step.cp_comm_total > 0
    without = estimate(M405, BIG, plan405(zero=0).replace(sp=False))
    assert not without.memory.fits
    # ptd's runtime combines cp with sp, so the command (sp left to it) chooses sp and prints
    # a plan that fits, with the cp exchange in its breakdown; without sp and without ZeRO it
    # does not fit, and left to choose ZeRO it needs ZeRO-1's even shards of the optimizer
    rc, out, err = ptd_cli("estimate", *CMD_405B)
    assert rc == 0, err
    assert "dp4 tp8 pp16 cp16" in out and "sp=True" in out
    assert "cp_comm" in out and "K/V exchange" in out and "fits in" in out
    rc, out, err = ptd_cli("estimate", *CMD_405B, "--json")
    d = json.loads(out)
    assert d["plan"]["cp"] == 16 and d["plan"]["dp"] == 4 and d["plan"]["sp"]
    assert d["step_time_s"]["cp_comm_total"] > 0 and "cp_comm" in d["step_time_s"]
    assert d["fits"]
    rc, out, err = ptd_cli("estimate", *CMD_405B, "--no-sp", "--zero", "0")
    assert rc == 0, err
    assert "DOES NOT FIT" in out
    rc, out, err = ptd_cli("estimate", *CMD_405B, "--no-sp", "--json")
    d = json.loads(out)
    assert not d["plan"]["sp"] and d["plan"]["zero"] >= 1


def test_plan_searches_cp_and_rejects_with_reason(ptd_cli):
    rc, out, err = ptd_cli("plan", "--model", "llama3.1-405b", "--hardware", "h100-sxm", "--gpus",
                           "8192", "--seq-len", "131072", "--global-batch", "128", "--cp",
                           "1,3,16", "--fix", "tp=8,pp=16", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["search"]["layouts_rejected"] == {"cp does not divide the devices": 1}  # cp 3
    assert d["search"]["layouts_considered"] == 2  # cp 1 and cp 16 (tp 8, pp 16 fixed)
    assert (d["cp_values"], d["dp_comm"], d["servers"]) == ([1, 3, 16], "allreduce", None)
    # At 128k tokens cp 16 fits only with sequence parallelism (which ptd trains with cp), and
    # it wins: the cp 1 plans that fit are bubble-bound GPipe (docs/parallelism-cp.md)
    assert d["top"] and d["top"][0]["plan"]["cp"] == 16 and d["top"][0]["plan"]["sp"]
    # seq 48 cannot be cut into 2*16 chunks
    rc, out, err = ptd_cli("plan", "--model", "tiny", "--hardware", "h100-sxm", "--gpus", "16",
                           "--seq-len", "48", "--global-batch", "16", "--cp", "1,16", "--json")
    assert rc == 0, err
    assert json.loads(out)["search"]["layouts_rejected"]["cp needs seq_len divisible by 2*cp (zig-zag chunks)"] == 1


@pytest.mark.parametrize("cmd,match", [
    (["estimate", "--model", "tiny", "--gpus", "8", "--cp", "4", "--seq-len", "20"],
     "divisible by 2\\*cp = 8"),
    (["estimate", "--model", "tiny", "--gpus", "8", "--cp", "3"], "not divisible by tp\\*pp\\*cp"),
    (["estimate", "--model", "tiny", "--gpus", "8", "--cp", "0"], "--cp: expected a positive integer"),
    (["plan", "--model", "tiny", "--gpus", "8", "--cp", "2,x"], "--cp"),
])
def test_bad_cp_input_is_one_line_exit_2(ptd_cli, cmd, match):
    import re
    rc, out, err = ptd_cli(*cmd)
    assert rc == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("ptd"), err
    assert re.search(match, err), err

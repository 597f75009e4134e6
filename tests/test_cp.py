"""Context parallelism: the zig-zag split by hand, the cp attention core on 2 gloo ranks
against one plain ``scaled_dot_product_attention`` over the whole sequence (outputs and the
gradients of q, k, v), and ``ptd train --cp`` loss parity with one process (fp32, 10 steps)
for cp 2, cp 2 x dp 2, cp 2 x tp 2 and cp 2 x pp 2."""

import multiprocessing as mp
import os

import pytest
import torch

from ptd.runtime.parallel.cp import split_sequence, zigzag_positions


def test_zigzag_slices_by_hand():
    # 8 tokens, cp 2: 4 chunks of 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    assert zigzag_positions(4, 2, 0).tolist() == [0, 1, 6, 7]
    assert zigzag_positions(4, 2, 1).tolist() == [2, 3, 4, 5]
    x = torch.arange(8)[None, :]
    assert split_sequence(x, 2, 0).tolist() == [[0, 1, 6, 7]]
    assert split_sequence(x, 2, 1).tolist() == [[2, 3, 4, 5]]
    # cp 3, 12 tokens: chunks of 2; rank 1 holds chunks 1 and 4
    assert zigzag_positions(4, 3, 1).tolist() == [2, 3, 8, 9]


def _reference(q, k, v, w, cos, sin):
    import torch.nn.functional as F
    from ptd.runtime.model.layers import apply_rope
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    y = F.scaled_dot_product_attention(
        apply_rope(q, cos, sin).transpose(1, 2), apply_rope(k, cos, sin).transpose(1, 2),
        v.transpose(1, 2), is_causal=True, enable_gqa=True).transpose(1, 2)
    (y * w).sum().backward()
    return y.detach(), q.grad, k.grad, v.grad


def _worker(rank, world, path, queue):
    import torch.distributed as dist
    from ptd.runtime.model.layers import rope_tables
    from ptd.runtime.parallel.cp import CPAttention
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    try:
        g = torch.Generator().manual_seed(0)
        b, s, h, hkv, d = 2, 16, 4, 2, 8  # grouped-query: 2 query heads per kv head
        q, k, v = (torch.randn(b, s, n, d, generator=g, dtype=torch.float64) for n in (h, hkv, hkv))
        w = torch.randn(b, s, h, d, generator=g, dtype=torch.float64)
        cos, sin = (t.double() for t in rope_tables(d, 32, 10000.0))
        y_ref, gq, gk, gv = _reference(q, k, v, w, cos, sin)
        ql, kl, vl = (split_sequence(t, world, rank).requires_grad_() for t in (q, k, v))
        y = CPAttention(dist.group.WORLD, rank, world)(ql, kl, vl, (cos, sin))
        (y * split_sequence(w, world, rank)).sum().backward()
        errs = [float((a - split_sequence(r, world, rank)).abs().max())
                for a, r in ((y, y_ref), (ql.grad, gq), (kl.grad, gk), (vl.grad, gv))]
        queue.put((rank, errs, float(y_ref.abs().max()), float(gk.abs().max())))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(60)
def test_cp_attention_equals_sdpa_on_two_ranks(tmp_path):
    ctx = mp.get_context("fork")  # torch already imported: no second import per worker
    queue = ctx.Queue()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    procs = [ctx.Process(target=_worker, args=(r, 2, str(tmp_path / "store"), queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=50) for _ in procs]
    for p in procs:
        p.join(timeout=10)
        assert p.exitcode == 0
    for rank, errs, y_scale, gk_scale in results:
        assert y_scale > 0.1 and gk_scale > 0.1  # a real comparison, not of zeros
        # float64 throughout: blockwise softmax merged by log-sum-exp equals the fused kernel
        assert max(errs) < 1e-12, (rank, errs)


# ------------------------------------------------------------------ refusals (no worker)
@pytest.mark.parametrize("flags,match", [
    (["--nproc", "2", "--cp", "2", "--seq-len", "66"], r"divisible by 2\*cp = 4"),
    (["--nproc", "2", "--cp", "3"], r"not divisible by tp\*pp\*cp = 3"),
    (["--nproc", "2", "--cp", "0"], "--cp: expected a positive integer"),
    (["--model", "tiny-gpt", "--nproc", "2", "--cp", "2"], "context parallel needs RoPE"),
    (["--model", "tiny-moe", "--nproc", "4", "--cp", "2", "--ep", "2"],
     "context parallel with expert parallel"),
    (["--nproc", "2", "--cp", "2", "--grad-compression", "fp16"], "compression hooks need DDP"),
    # 68 cuts into 2*cp = 4 zig-zag chunks, but a cp slice of 34 tokens not over tp 4
    (["--nproc", "8", "--cp", "2", "--tp", "4", "--sp", "--seq-len", "68"],
     r"divisible by tp\*cp = 4\*2"),
])
def test_cp_refused_before_any_worker(ptd_cli, no_workers, tmp_path, flags, match):
    import re
    out = tmp_path / "out"
    args = ["train", "--model", "tiny", "--seq-len", "64", *flags, "--out", str(out)]
    rc, _, err = ptd_cli(*args)
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("ptd"), err
    assert re.search(match, err), err
    assert not out.exists()


def test_cp_dry_run_writes_the_plan(ptd_cli, no_workers, tmp_path):
    from ptd.specs import load_config
    out = tmp_path / "out"
    rc, _, err = ptd_cli("train", "--model", "tiny", "--nproc", "8", "--cp", "2", "--tp", "2",
                         "--global-batch", "8", "--out", str(out), "--dry-run")
    assert rc == 0, err
    plan = load_config(out / "config.toml").plan
    assert (plan.cp, plan.tp, plan.dp, plan.world_size) == (2, 2, 2, 8)

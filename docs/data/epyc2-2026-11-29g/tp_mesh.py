"""Two processes at once. Each: (A) its rank of ptd's tp-2 model of small on a two-rank mesh,
DTensor's all-reduce replaced by a copy; (B) the tp model of the tp-2 rank's local shapes on a
ONE-rank mesh (what the calibration's dtensor_op/share see); (C) the local shapes plain.
Counts DTensor ops per whole step in A and B. Env (added 2026-11-29, twenty-eighth session; the
defaults are what ran here): MODE=clone|same|real (real: the all-reduce left as it is), MB and
SEQ (16, 128), ROUNDS (9)."""
import os, sys, time, statistics, tempfile, dataclasses
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests"))
os.environ["OMP_NUM_THREADS"] = "1"
def worker(rank, store, q):
    import torch, torch.distributed as dist
    torch.set_num_threads(1)
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh, DeviceMesh
    from torch.distributed.tensor.parallel import loss_parallel
    from ptd.runtime.model.init import materialize
    from ptd.runtime.model.transformer import build_model, lm_loss_sum
    from ptd.runtime.parallel.tp import apply_tp
    from ptd.runtime.measure.opcount import DTensorOpCounter
    from ptd.specs.plan import ParallelPlan
    from ptd.specs.model import load_model
    N = 2
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=N)
    one_pgs = [dist.new_group([r]) for r in range(N)]
    spec = load_model("small")
    A = build_model(spec, "meta"); apply_tp(A, init_device_mesh("cpu", (N,)), ParallelPlan(tp=N, seq_len=int(os.environ.get("SEQ","128")))); materialize(A, "cpu", 0)
    loc = dataclasses.replace(spec, n_heads=spec.n_heads // N, n_kv_heads=spec.n_kv_heads // N,
                              ffn_hidden=spec.ffn_hidden // N, vocab_size=spec.vocab_size // N, vocab_multiple=1)
    one = DeviceMesh.from_group(one_pgs[rank], "cpu")
    B = build_model(loc, "meta"); apply_tp(B, one, ParallelPlan(tp=1, seq_len=int(os.environ.get("SEQ","128")))); materialize(B, "cpu", 0)
    C = materialize(build_model(loc), "cpu", 0)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, loc.vocab_size, (int(os.environ.get("MB","16")), int(os.environ.get("SEQ","128"))), generator=g); y = torch.randint(0, loc.vocab_size, (int(os.environ.get("MB","16")), int(os.environ.get("SEQ","128"))), generator=g)
    real_ar = funcol.all_reduce
    calls = [0]
    MODE = os.environ.get("MODE", "clone")
    def fake_ar(t, reduceOp, group, tag=""):
        calls[0] += 1
        return t.clone() if MODE == "clone" else t
    import contextlib
    def step(m, ctx, count=False):
        if MODE != "real": funcol.all_reduce = fake_ar
        dist.barrier(); t0 = time.perf_counter()
        c = DTensorOpCounter() if count else contextlib.nullcontext()
        with c, ctx():
            loss = lm_loss_sum(m(x), y) / x.numel(); loss.backward()
        t = time.perf_counter() - t0
        for p in m.parameters(): p.grad = None
        funcol.all_reduce = real_ar
        return t, (c.dtensor, c.plain) if count else None
    nul = contextlib.nullcontext
    for _ in range(2): step(A, loss_parallel); step(B, loss_parallel); step(C, nul)
    calls[0] = 0; cA = step(A, loss_parallel, True)[1]; nA = calls[0]
    calls[0] = 0; cB = step(B, loss_parallel, True)[1]; nB = calls[0]
    res = {"A": [], "B": [], "C": []}
    for _ in range(int(os.environ.get("ROUNDS", "9"))):
        res["A"].append(step(A, loss_parallel)[0]); res["B"].append(step(B, loss_parallel)[0]); res["C"].append(step(C, nul)[0])
    q.put((rank, {k: round(statistics.median(v) * 1e3, 1) for k, v in res.items()} | {"countA": cA, "countB": cB, "arA": nA, "arB": nB}))
    dist.destroy_process_group()
if __name__ == "__main__":
    from helpers import run_ranks
    print(run_ranks(worker, 2, tempfile.mkdtemp() + "/s", timeout=500))

"""TPN ranks (default 2), interleaved in the same processes: ptd's tp-N model of small (16 x 128
tokens), the same model with DTensor's all-reduce replaced by a copy (DTensor without
communication), a tp-N rank's local shapes as a plain model, and the step's 33 all-reduces of
2 MiB back to back. ``TPN=4 python tp_decomposition.py`` for tp 4."""
import os, sys, time, statistics, tempfile, dataclasses
N = int(os.environ.get("TPN", "2"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests"))
os.environ["OMP_NUM_THREADS"] = "1"
def worker(rank, store, q):
    import torch, torch.distributed as dist
    torch.set_num_threads(1)
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel
    from ptd.runtime.model.init import materialize
    from ptd.runtime.model.transformer import build_model, lm_loss_sum
    from ptd.runtime.parallel.tp import apply_tp
    from ptd.specs.plan import ParallelPlan
    from ptd.specs.model import load_model
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=N)
    spec = load_model("small")
    dt = build_model(spec, "meta"); apply_tp(dt, init_device_mesh("cpu", (N,)), ParallelPlan(tp=N, seq_len=128)); materialize(dt, "cpu", 0)
    loc = dataclasses.replace(spec, n_heads=spec.n_heads // N, n_kv_heads=spec.n_kv_heads // N,
                              ffn_hidden=spec.ffn_hidden // N, vocab_size=spec.vocab_size // N, vocab_multiple=1)
    sh = materialize(build_model(loc), "cpu", 0)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, loc.vocab_size, (16, 128), generator=g); y = torch.randint(0, loc.vocab_size, (16, 128), generator=g)
    real_ar = funcol.all_reduce
    def fake_ar(t, reduceOp, group, tag=""):
        return t.clone()
    def tp_step(fake):
        funcol.all_reduce = fake_ar if fake else real_ar
        dist.barrier(); t0 = time.perf_counter()
        with loss_parallel():
            loss = lm_loss_sum(dt(x), y) / x.numel(); loss.backward()
        t = time.perf_counter() - t0
        for p in dt.parameters(): p.grad = None
        funcol.all_reduce = real_ar
        return t
    def shard_step():
        dist.barrier(); t0 = time.perf_counter()
        loss = lm_loss_sum(sh(x), y) / 2048; loss.backward()
        t = time.perf_counter() - t0
        for p in sh.parameters(): p.grad = None
        return t
    buf = torch.zeros(2 * 2**20 // 4)
    def colls():
        dist.barrier(); t0 = time.perf_counter()
        for _ in range(33): dist.all_reduce(buf)
        return time.perf_counter() - t0
    for _ in range(2): tp_step(False); tp_step(True); shard_step(); colls()
    res = {"tp": [], "tp_nocomm": [], "shard": [], "colls33": []}
    for _ in range(7):
        res["tp"].append(tp_step(False)); res["tp_nocomm"].append(tp_step(True))
        res["shard"].append(shard_step()); res["colls33"].append(colls())
    q.put((rank, {k: statistics.median(v) * 1e3 for k, v in res.items()} | {k + "_all": [round(a * 1e3) for a in v] for k, v in res.items()}))
    dist.destroy_process_group()
if __name__ == "__main__":
    from helpers import run_ranks
    res = run_ranks(worker, N, tempfile.mkdtemp() + "/s", timeout=500)
    for r, d in sorted(res.items()):
        print(r, d)

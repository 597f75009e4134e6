"""Two processes: a chunk of work (products of a tp-2 rank's MLP shapes, then a
LayerNorm-ish eager pass) timed right after (a) a barrier only, (b) a 2 MiB all-reduce,
(c) a 2 MiB all-reduce through funcol (as DTensor does). Interleaved, medians."""
import os, sys, time, statistics, tempfile
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests"))
os.environ["OMP_NUM_THREADS"] = "1"
def worker(rank, store, q):
    import torch, torch.distributed as dist
    torch.set_num_threads(1)
    import torch.distributed._functional_collectives as funcol
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    x = torch.randn(2048, 256); w1 = torch.randn(352, 256); w2 = torch.randn(256, 352)
    buf = torch.randn(2048, 256)
    def chunk():
        h = torch.nn.functional.gelu(x @ w1.t())
        y = h @ w2.t()
        return torch.nn.functional.layer_norm(y + x, (256,))
    res = {"barrier": [], "ar": [], "funcol": []}
    for _ in range(3): chunk(); dist.all_reduce(buf)
    for i in range(60):
        for k in res:
            dist.barrier()
            if k == "ar": dist.all_reduce(buf)
            elif k == "funcol":
                out = funcol.all_reduce(buf, "sum", dist.group.WORLD); out = funcol.wait_tensor(out)
            t0 = time.perf_counter(); chunk(); res[k].append(time.perf_counter() - t0)
    q.put((rank, {k: round(statistics.median(v) * 1e3, 3) for k, v in res.items()}))
    dist.destroy_process_group()
if __name__ == "__main__":
    from helpers import run_ranks
    for k, v in sorted(run_ranks(worker, 2, tempfile.mkdtemp() + "/s", timeout=300).items()):
        print(k, v)

"""Two processes: nine all-reduces of 72 values back to back, the same each after a tiny
backward, and nine gathers then nine all-reduces (FSDP's small collectives), 40 rounds."""
import os, sys, time, statistics, tempfile
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests"))
os.environ["OMP_NUM_THREADS"] = "1"
def worker(rank, store, q):
    import torch, torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    a = torch.empty(72); lin = torch.nn.Linear(8, 8); x = torch.randn(4, 8)
    res = {"ar9 b2b": [], "ar9 spaced": [], "ag9+ar9": []}
    for _ in range(40):
        dist.barrier(); t0 = time.perf_counter()
        for _ in range(9): dist.all_reduce(a)
        res["ar9 b2b"].append(time.perf_counter() - t0)
        dist.barrier(); t0 = time.perf_counter(); s = 0.0
        for _ in range(9):
            t1 = time.perf_counter(); lin(x).sum().backward(); s += time.perf_counter() - t1
            dist.all_reduce(a)
        res["ar9 spaced"].append(time.perf_counter() - t0 - s)
        dist.barrier(); t0 = time.perf_counter()
        for _ in range(9): dist.all_gather_single(torch.empty(72), torch.empty(36))
        for _ in range(9): dist.all_reduce(a)
        res["ag9+ar9"].append(time.perf_counter() - t0)
    q.put((rank, {k: (round(statistics.median(v) * 1e3, 2), round(min(v) * 1e3, 2), round(max(v) * 1e3, 2)) for k, v in res.items()}))
    dist.destroy_process_group()
if __name__ == "__main__":
    from helpers import run_ranks
    for k, v in sorted(run_ranks(worker, 2, tempfile.mkdtemp() + "/s", timeout=300).items()):
        print(k, "(median, min, max) ms:", v)

import os, sys, time, statistics
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests"))
os.environ["OMP_NUM_THREADS"] = "1"
KiB, MiB = 1024, 1 << 20
def worker(rank, store, q):
    import torch, torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    res = {}
    for nb in (KiB, 4 * KiB, 32 * KiB, 256 * KiB, MiB, 4 * MiB, 16 * MiB):
        x = torch.zeros(nb // 4); dist.all_reduce(x)
        reps = max(3, min(40, 48 * MiB // nb))
        ws = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(reps): dist.all_reduce(x)
            ws.append((time.perf_counter() - t0) / reps)
        res[nb] = ws
    q.put((rank, res)); dist.destroy_process_group()
if __name__ == "__main__":
    from helpers import run_ranks
    import tempfile
    res = run_ranks(worker, 2, tempfile.mkdtemp() + "/s", timeout=300)
    for nb, ws in res[0].items():
        print(f"{nb:>9d} B  windows " + " ".join(f"{w*1e3:6.2f}" for w in ws) + f"  min {min(ws)*1e3:6.2f} mean {statistics.mean(ws)*1e3:6.2f} ms")

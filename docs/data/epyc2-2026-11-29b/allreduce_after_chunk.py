import os, sys, time, statistics
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests"))
os.environ["OMP_NUM_THREADS"] = "1"
def worker(rank, store, q):
    import torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    X = torch.randn(2048, 256); W = torch.randn(256, 352); W2 = torch.randn(352, 256)
    buf = torch.zeros(2048, 256)
    def model(k):
        for _ in range(k):
            h = X @ W; h = h * h; h @ W2
    def plain():
        dist.all_reduce(buf)
    def dt():
        d = DTensor.from_local(buf, mesh, [Partial()], run_check=False)
        return d.redistribute(mesh, [Replicate()]).to_local()
    res = {}
    for k in (0, 1, 3):
        for name, coll in (("plain", plain), ("dtensor", dt)):
            vals = []
            for trial in range(3):
                dist.barrier(); coll()
                cs = []; ch = []
                for _ in range(20):
                    t0 = time.perf_counter(); model(k); t1 = time.perf_counter(); coll(); t2 = time.perf_counter()
                    ch.append(t1 - t0); cs.append(t2 - t1)
                vals.append((statistics.mean(ch), statistics.mean(cs)))
            res[(k, name)] = sorted(vals, key=lambda v: v[1])[1]
    q.put((rank, res))
    dist.destroy_process_group()
if __name__ == "__main__":
    from helpers import run_ranks
    import tempfile
    res = run_ranks(worker, 2, tempfile.mkdtemp() + "/s", timeout=300)
    for r, d in sorted(res.items()):
        for (k, name), (c, s) in sorted(d.items()):
            print(r, f"chunk x{k} ({c*1e3:.2f} ms) {name:8s} collective {s*1e3:.2f} ms")

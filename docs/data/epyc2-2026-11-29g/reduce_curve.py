import os, sys, time, statistics, tempfile
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests"))
os.environ["OMP_NUM_THREADS"] = "1"
def worker(rank, store, q):
    import torch, torch.distributed as dist
    torch.set_num_threads(1)
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Partial, Replicate
    from ptd.runtime.calibrate.bench import dtensor_reduce_curve
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    ones = [dist.new_group([r]) for r in range(2)]
    import threading
    class B:
        def wait(self, t): dist.barrier()
    out = {}
    for rnd in range(3):
        c = dtensor_reduce_curve(rank, 2, None, ones[rank], B(), 60, [2 * 2**20], 15)
        out.setdefault("curve", []).append([round(v * 1e3, 3) for v in c[str(2 * 2**20)]])
        # one-rank reduce in a loop of its own
        one = DeviceMesh.from_group(ones[rank], "cpu")
        x = torch.zeros(2**19)
        def reduce(m):
            d = DTensor.from_local(x, m, [Partial()], run_check=False)
            return d.redistribute(m, [Replicate()]).to_local()
        ts = []
        for _ in range(30):
            t0 = time.perf_counter(); reduce(one); ts.append(time.perf_counter() - t0)
        out.setdefault("one_alone", []).append(round(statistics.median(ts) * 1e3, 3))
        # one-rank right after a plain pair all-reduce
        ts = []
        for _ in range(15):
            dist.barrier(); dist.all_reduce(x)
            t0 = time.perf_counter(); reduce(one); ts.append(time.perf_counter() - t0)
        out.setdefault("one_after_ar", []).append(round(statistics.median(ts) * 1e3, 3))
    q.put((rank, out))
    dist.destroy_process_group()
if __name__ == "__main__":
    from helpers import run_ranks
    for k, v in sorted(run_ranks(worker, 2, tempfile.mkdtemp() + "/s", timeout=300).items()):
        print(k, v)

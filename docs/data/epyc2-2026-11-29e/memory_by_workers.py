"""Per-worker copy bandwidth (128 MiB fp32, 3 s) with 1, 2 and 4 processes at once, twice
(twenty-fifth session): on this VM the two-worker figure is bimodal.

    OMP_NUM_THREADS=1 .venv/bin/python docs/data/epyc2-2026-11-29e/memory_by_workers.py
"""
import torch, time, multiprocessing as mp, os
def run(q, start, nel, secs):
    torch.set_num_threads(1)
    x = torch.ones(nel); z = torch.empty(nel); z.copy_(x)
    start.wait()
    n = 0; t = time.perf_counter()
    while time.perf_counter() - t < secs:
        z.copy_(x); n += 1
    q.put(8 * nel * n / (time.perf_counter() - t) / 1e9)
if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    for rep in range(2):
        for k in (1, 2, 4):
            q = ctx.Queue(); start = ctx.Barrier(k)
            ps = [ctx.Process(target=run, args=(q, start, 32 * 1024 * 1024, 3.0)) for _ in range(k)]
            [p.start() for p in ps]; r = [q.get() for _ in ps]; [p.join() for p in ps]
            print(f"{k} workers: per-worker copy GB/s {[round(v,1) for v in r]}, aggregate {sum(r):.1f}")

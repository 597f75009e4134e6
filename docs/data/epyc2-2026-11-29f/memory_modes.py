"""Time series of copy bandwidth with 1, 2, 4 of 4 persistent workers active, 0.5 s phases
(twenty-sixth session; output in memory_modes.txt).

    OMP_NUM_THREADS=1 .venv/bin/python docs/data/epyc2-2026-11-29f/memory_modes.py 100
"""
import torch, time, multiprocessing as mp, sys
def run(rank, q, bar, nel, secs, rounds):
    torch.set_num_threads(1)
    x = torch.ones(nel); z = torch.empty(nel); z.copy_(x)
    for r in range(rounds):
        for k in (1, 2, 4):
            bar.wait()
            if rank < k:
                n = 0; t = time.perf_counter()
                while time.perf_counter() - t < secs:
                    z.copy_(x); n += 1
                q.put((r, k, rank, 8 * nel * n / (time.perf_counter() - t) / 1e9))
            else:
                time.sleep(secs)
if __name__ == "__main__":
    rounds = int(sys.argv[1])
    ctx = mp.get_context("spawn"); q = ctx.Queue(); bar = ctx.Barrier(4)
    ps = [ctx.Process(target=run, args=(i, q, bar, 16 * 1024 * 1024, 0.5, rounds)) for i in range(4)]
    [p.start() for p in ps]
    t0 = time.time(); agg = {}
    for _ in range(rounds * 7):
        r, k, rank, v = q.get(); agg.setdefault((r, k), []).append(v)
        if len(agg[(r, k)]) == k and k == 4:
            print(f"{time.time()-t0:6.1f}s round {r}: " + "  ".join(
                f"x{kk} {sum(agg[(r,kk)]):5.1f}" for kk in (1, 2, 4)), flush=True)
    [p.join() for p in ps]

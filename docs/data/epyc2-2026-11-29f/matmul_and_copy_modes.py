"""Time series of matmul (512, fp32) and copy with 1 and 2 of 2 persistent workers
(twenty-sixth session: 40 rounds, the output quoted in docs/measuring.md).

    OMP_NUM_THREADS=1 .venv/bin/python docs/data/epyc2-2026-11-29f/matmul_and_copy_modes.py 40
"""
import torch, time, multiprocessing as mp, sys
def run(rank, q, bar, rounds):
    torch.set_num_threads(1)
    a = torch.randn(512, 512); b = torch.randn(512, 512); c = torch.empty(512, 512)
    x = torch.ones(16 * 2**20); z = torch.empty_like(x)
    for r in range(rounds):
        for kind in ("mm", "copy"):
            for k in (1, 2):
                bar.wait()
                if rank < k:
                    n = 0; t = time.perf_counter()
                    while time.perf_counter() - t < 0.5:
                        if kind == "mm": torch.mm(a, b, out=c); n += 2 * 512**3
                        else: z.copy_(x); n += 8 * x.numel()
                    q.put((r, kind, k, n / (time.perf_counter() - t) / 1e9))
                else:
                    time.sleep(0.5)
if __name__ == "__main__":
    rounds = int(sys.argv[1])
    ctx = mp.get_context("spawn"); q = ctx.Queue(); bar = ctx.Barrier(2)
    ps = [ctx.Process(target=run, args=(i, q, bar, rounds)) for i in range(2)]
    [p.start() for p in ps]
    t0 = time.time(); agg = {}
    for _ in range(rounds * 6):
        r, kind, k, v = q.get(); agg.setdefault((r, kind, k), []).append(v)
        if kind == "copy" and k == 2 and len(agg[(r, kind, k)]) == 2:
            f = lambda kd, kk: sum(agg[(r, kd, kk)]) / kk
            print(f"{time.time()-t0:6.1f}s r{r}: mm/worker x1 {f('mm',1):5.1f} x2 {f('mm',2):5.1f} GF  copy/worker x1 {f('copy',1):5.1f} x2 {f('copy',2):5.1f} GB/s", flush=True)
    [p.join() for p in ps]

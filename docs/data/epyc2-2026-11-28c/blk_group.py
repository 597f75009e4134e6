"""(2026-11-28; run from the repository root: OMP_NUM_THREADS=1 PYTHONPATH=src python docs/data/epyc2-2026-11-28c/blk_group.py)
Late-peer wait of a blocking all-reduce after compute chunks, 4 workers on this box:
in pairs (the calibration's) against one group of 4 (what tp 4 runs)."""
import os, sys
import torch, torch.distributed as dist, torch.multiprocessing as mp

def main(rank, world, bar, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29551")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from ptd.runtime.calibrate.bench import blocking_curve
    pair, _ = dist.new_subgroups_by_enumeration([[0, 1], [2, 3]])
    chunks = {0: 100, 2: 60, 8: 30, 24: 15, 64: 8}
    out = {}
    for name, pg in (("pairs", pair), ("group4", None), ("pairs", pair), ("group4", None)):
        w = blocking_curve(rank, 4, pg, bar, 60, 3, chunks, 2**20)
        out.setdefault(name, []).append(w)
    q.put((rank, out))
    dist.destroy_process_group()

if __name__ == "__main__":
    ctx = mp.get_context("spawn"); bar = ctx.Barrier(4); q = ctx.Queue()
    ps = [ctx.Process(target=main, args=(r, 4, bar, q)) for r in range(4)]
    [p.start() for p in ps]; res = dict(q.get() for _ in ps); [p.join() for p in ps]
    for name in ("pairs", "group4"):
        for i in range(2):
            ks = res[0][name][i].keys()
            row = []
            for k in ks:
                c = sum(res[r][name][i][k][0] for r in range(4)) / 4
                a = sum(res[r][name][i][k][1] for r in range(4)) / 4
                row.append(f"k={k}: chunk {c*1e3:.2f} ar {a*1e3:.2f}")
            print(name, i, " | ".join(row))

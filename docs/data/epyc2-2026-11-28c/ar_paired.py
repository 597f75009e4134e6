"""(2026-11-28; run: OMP_NUM_THREADS=1 python ar_paired.py) Paired: per round, one plain dist.all_reduce then one DTensor Partial->Replicate of the same bytes; median of differences."""
import os, sys, time, statistics
import torch, torch.distributed as dist, torch.multiprocessing as mp

def main(rank, world, sizes):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29544")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate
    mesh = init_device_mesh("cpu", (world,))
    out = []
    for mb in sizes:
        x = torch.randn(int(mb * 2**20) // 4)
        def plain(): dist.all_reduce(x)
        def dt():
            d = DTensor.from_local(x, mesh, [Partial()], run_check=False)
            return d.redistribute(mesh, [Replicate()]).to_local()
        for _ in range(5): plain(); dt()
        p, q, diff = [], [], []
        for i in range(60):
            dist.barrier()
            t0 = time.perf_counter(); plain(); t1 = time.perf_counter()
            dist.barrier()
            t2 = time.perf_counter(); dt(); t3 = time.perf_counter()
            p.append(t1 - t0); q.append(t3 - t2); diff.append((t3 - t2) - (t1 - t0))
        c0 = time.thread_time(); 
        for _ in range(20): plain()
        c1 = time.thread_time()
        for _ in range(20): dt()
        c2 = time.thread_time()
        out.append((mb, statistics.median(p)*1e3, statistics.median(q)*1e3, statistics.median(diff)*1e3, (c1-c0)/20*1e3, (c2-c1)/20*1e3))
    if rank == 0:
        print("MB  plain  dtensor  median(diff)  main-thread cpu: plain dtensor (ms)")
        for r in out: print(" ".join(f"{v:8.3f}" for v in r))
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(main, args=(2, [0.0625, 0.5, 2, 8]), nprocs=2)

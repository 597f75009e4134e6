"""tp 2 on 2 processes (gloo), `small` at 16 x 128 tokens: rank 0's ops by category over 3
steps (profiler self time), and the same for one process on the plain model (twenty-sixth
session).

    OMP_NUM_THREADS=1 .venv/bin/python docs/data/epyc2-2026-11-29f/tp2_ops.py
    OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc_per_node 2 docs/data/epyc2-2026-11-29f/tp2_ops.py
"""
import os, sys, time, collections, torch, torch.distributed as dist
from torch.profiler import profile, ProfilerActivity
torch.set_num_threads(1)
from ptd.specs import get_preset, ParallelPlan
from ptd.runtime.model.transformer import build_model, lm_loss_sum
def cat(name):
    n = name
    if n in ("aten::mm", "aten::addmm", "aten::bmm"): return "mm"
    if "scaled_dot_product" in n: return "attn"
    if "all_reduce" in n or "allreduce" in n or n.startswith("c10d") or "wait_tensor" in n: return "comm"
    return "other"
def run(rank, world):
    spec = get_preset("small"); torch.manual_seed(0)
    m = build_model(spec, device="cpu")
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from ptd.runtime.parallel.tp import apply_tp
        mesh = init_device_mesh("cpu", (world,))
        apply_tp(m, mesh, ParallelPlan(tp=world, micro_batch=16, global_batch=16, seq_len=128))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, foreach=False)
    x = torch.randint(0, 256, (16, 128)); y = torch.randint(0, 256, (16, 128))
    import contextlib
    ctx = contextlib.nullcontext
    if world > 1:
        from torch.distributed.tensor.parallel import loss_parallel as ctx
    def step():
        with ctx():
            loss = lm_loss_sum(m(x), y) / y.numel(); loss.backward()
        opt.step(); opt.zero_grad()
    for _ in range(3): step()
    if world > 1: dist.barrier()
    t = time.perf_counter()
    for _ in range(5): step()
    dt = (time.perf_counter() - t) / 5
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(3): step()
    if rank == 0:
        tot = collections.defaultdict(float)
        for e in p.events():
            if e.cpu_parent is not None: continue
            pass
        # self time by category (leaf attribution)
        for e in p.key_averages():
            tot[cat(e.key)] += e.self_cpu_time_total / 3 / 1e3
        print(f"world {world}: step {dt*1e3:.1f} ms; self-time by category (ms/step):", {k: round(v, 1) for k, v in sorted(tot.items())}, flush=True)
        top = sorted(p.key_averages(), key=lambda e: -e.self_cpu_time_total)[:25]
        for e in top: print(f"   {e.self_cpu_time_total/3/1e3:7.2f} ms  {e.count//3:5d}x  {e.key}")
if __name__ == "__main__":
    world = int(os.environ.get("WORLD_SIZE", "1")); rank = int(os.environ.get("RANK", "0"))
    if world > 1: dist.init_process_group("gloo")
    run(rank, world)
    if world > 1: dist.destroy_process_group()

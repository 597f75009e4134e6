"""Per-thread CPU time, run-queue delay and context switches of a worker of ptd's `small`
model (micro-batch 16 x 128, fp32), forward and backward, on one process or tensor
parallel over N (gloo), from /proc (2026-11-28). Run from the repository root:
    OMP_NUM_THREADS=1 PYTHONPATH=src python docs/data/epyc2-2026-11-28c/tp_threads.py 2 5
"""
import contextlib, os, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp

def threads():
    out = {}
    tck = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            st = open(f"/proc/self/task/{tid}/stat").read()
            name = st[st.index("(")+1:st.rindex(")")]
            f = st[st.rindex(")")+2:].split()
            cpu = (int(f[11]) + int(f[12])) / tck
            s = open(f"/proc/self/task/{tid}/status").read()
            nv = int(s.split("nonvoluntary_ctxt_switches:")[1].split()[0])
            v = int(s.split("\nvoluntary_ctxt_switches:")[1].split()[0])
            sc = open(f"/proc/self/task/{tid}/schedstat").read().split()
            out[tid] = (name, int(sc[0])/1e9, v, nv, int(sc[1])/1e9)
        except FileNotFoundError:
            pass
    return out

def main(rank, world, steps):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29541")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel
    from ptd.runtime.model.init import materialize
    from ptd.runtime.model.transformer import build_model, lm_loss_sum
    from ptd.runtime.parallel.tp import apply_tp
    from ptd.specs import ParallelPlan
    from ptd.specs.model import load_model
    spec = load_model("small")
    model = build_model(spec, "meta")
    if world > 1:
        apply_tp(model, init_device_mesh("cpu", (world,)), ParallelPlan(tp=world, seq_len=128, global_batch=16, micro_batch=16))
    materialize(model, torch.device("cpu"), seed=0)
    ctx = loss_parallel if world > 1 else contextlib.nullcontext
    x = torch.randint(0, 256, (16, 129), generator=torch.Generator().manual_seed(0))
    def step():
        with ctx():
            loss = lm_loss_sum(model(x[:, :-1]), x[:, 1:]) / x[:, 1:].numel()
            loss.backward()
    for _ in range(2): step()
    dist.barrier()
    t0 = threads(); w0 = time.perf_counter(); c0 = time.process_time()
    for _ in range(steps): step()
    w = time.perf_counter() - w0; c = time.process_time() - c0
    t1 = threads()
    lines = [f"rank {rank}: wall/step {w/steps*1e3:.0f} ms, process cpu/step {c/steps*1e3:.0f} ms"]
    for tid, (name, cpu, v, nv, rq) in t1.items():
        if tid in t0:
            d = cpu - t0[tid][1]; dv = v - t0[tid][2]; dnv = nv - t0[tid][3]; drq = rq - t0[tid][4]
            if d > 0 or dv > 0:
                lines.append(f"   {tid} {name:16s} cpu/step {d/steps*1e3:6.1f} ms  runqueue/step {drq/steps*1e3:6.1f} ms  vol/step {dv/steps:7.1f}  invol/step {dnv/steps:6.1f}")
    dist.barrier()
    for r in range(world):
        if r == rank: print("\n".join(lines), flush=True)
        dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    world = int(sys.argv[1]); steps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    mp.spawn(main, args=(world, steps), nprocs=world)

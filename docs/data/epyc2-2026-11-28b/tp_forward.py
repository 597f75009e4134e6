"""Where a tensor-parallel forward spends its time on this CPU (2026-11-28, eleventh session).

    OMP_NUM_THREADS=1 python tp_forward.py 1   # the model on one process
    OMP_NUM_THREADS=1 python tp_forward.py 2   # tensor parallel over two (gloo)

ptd's ``small`` model, micro-batch 16 x 128, fp32: five forwards under ``torch.profiler``
(the backward runs outside the profiled window), operators' self time summed by kind.
A dispatch mode timing each operator from Python inflates the memory-bound ones 2-3x
(docs/measuring.md, eleventh session); the profiler does not.
"""
import contextlib
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

KIND = {"aten::mm": "matmul", "aten::addmm": "matmul",
        "PythonSubclass": "dtensor", "_FromTorchTensor": "dtensor", "_ToTorchTensor": "dtensor",
        "Redistribute": "dtensor", "_c10d_functional::_wrap_tensor_autograd": "dtensor"}
ELEMENTWISE = ("mul", "add", "silu", "pow", "cat", "neg", "_fused_rms_norm", "copy_", "sum",
               "mean", "rsqrt", "div_", "add_")


def kind(name: str) -> str:
    if name in KIND:
        return KIND[name]
    if "flash" in name:
        return "attention"
    if "wait_tensor" in name or "allreduce" in name or "all_reduce" in name:
        return "collective"
    return "memory-bound" if name.removeprefix("aten::") in ELEMENTWISE else "other"


def main(rank: int, world: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel
    from torch.profiler import ProfilerActivity, profile
    from ptd.runtime.model.init import materialize
    from ptd.runtime.model.transformer import build_model, lm_loss_sum
    from ptd.runtime.parallel.tp import apply_tp
    from ptd.specs import ParallelPlan
    from ptd.specs.model import load_model
    spec = load_model("small")
    model = build_model(spec, "meta")
    if world > 1:
        apply_tp(model, init_device_mesh("cpu", (world,)),
                 ParallelPlan(tp=world, seq_len=128, global_batch=16, micro_batch=16))
    materialize(model, torch.device("cpu"), seed=0)
    ctx = loss_parallel if world > 1 else contextlib.nullcontext
    x = torch.randint(0, 256, (16, 129), generator=torch.Generator().manual_seed(0))

    def forward() -> torch.Tensor:
        with ctx():
            return lm_loss_sum(model(x[:, :-1]), x[:, 1:]) / x[:, 1:].numel()

    def backward(loss: torch.Tensor) -> None:
        with ctx():
            loss.backward()
    for _ in range(3):
        backward(forward())
    walls = []
    prof = profile(activities=[ProfilerActivity.CPU])
    for i in range(5):
        dist.barrier()
        if i == 0:
            prof.start()
        else:
            prof.toggle_collection_dynamic(True, [ProfilerActivity.CPU])
        t0 = time.perf_counter()
        loss = forward()
        walls.append(time.perf_counter() - t0)
        prof.toggle_collection_dynamic(False, [ProfilerActivity.CPU])
        backward(loss)
    prof.stop()
    if rank == 0:
        by: dict[str, float] = {}
        for e in prof.key_averages():
            by[kind(e.key)] = by.get(kind(e.key), 0.0) + e.self_cpu_time_total / 5e3
        print(f"world {world}: forward {sorted(walls)[2] * 1e3:.1f} ms (median wall); "
              "self time by kind, ms:", {k: round(v, 1) for k, v in sorted(by.items())})
    dist.destroy_process_group()


if __name__ == "__main__":
    n = int(sys.argv[1])
    mp.spawn(main, args=(n,), nprocs=n)

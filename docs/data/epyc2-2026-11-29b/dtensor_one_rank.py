import os, time, tempfile
os.environ["OMP_NUM_THREADS"] = "1"
import torch, torch.distributed as dist
torch.set_num_threads(1)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import loss_parallel
from ptd.runtime.model.init import materialize
from ptd.runtime.model.transformer import build_model, lm_loss_sum
from ptd.runtime.parallel.tp import apply_tp
from ptd.runtime.measure.opcount import DTensorOpCounter
from ptd.specs.plan import ParallelPlan
from ptd.specs.model import load_model
import contextlib
d = tempfile.mkdtemp()
dist.init_process_group("gloo", store=dist.FileStore(d + "/s", 1), rank=0, world_size=1)
spec = load_model("small")
plain = materialize(build_model(spec), "cpu", 0)
dt = build_model(spec, "meta"); apply_tp(dt, init_device_mesh("cpu", (1,)), ParallelPlan(tp=1, seq_len=128)); materialize(dt, "cpu", 0)
def step(m, lp, x, y):
    t0 = time.perf_counter()
    with (loss_parallel() if lp else contextlib.nullcontext()):
        loss = lm_loss_sum(m(x), y) / x.numel()
        loss.backward()
    for p in m.parameters(): p.grad = None
    return time.perf_counter() - t0
for b, s in [(1, 8), (1, 128), (4, 128), (16, 128)]:
    x = torch.randint(0, spec.vocab_size, (b, s)); y = torch.randint(0, spec.vocab_size, (b, s))
    for _ in range(2): step(plain, False, x, y); step(dt, True, x, y)
    with DTensorOpCounter() as c:
        step(dt, True, x, y)
    n = 15 if b * s < 1000 else 9
    diffs = []
    for i in range(n):
        a = step(plain, False, x, y); bb = step(dt, True, x, y); diffs.append(bb - a)
        tp_ = a
    diffs.sort()
    print(f"{b}x{s}: dtensor ops {c.dtensor}; extra median {diffs[n//2]*1e3:.2f} ms  per op {diffs[n//2]/c.dtensor*1e6:.1f} us  (plain ~{tp_*1e3:.1f} ms) range {diffs[1]*1e3:.1f}..{diffs[-2]*1e3:.1f}")

"""In-model products (profiler, `small`, one process, 2048 tokens) against the same shapes
alone on one warm set of buffers and on sets rotated over 96 MB, outputs included
(twenty-sixth session).

    OMP_NUM_THREADS=1 .venv/bin/python docs/data/epyc2-2026-11-29f/in_model.py
"""
import torch, time, collections
from torch.profiler import profile, ProfilerActivity
from ptd.specs import get_preset
from ptd.runtime.model.transformer import build_model, lm_loss_sum
torch.set_num_threads(1); torch.manual_seed(0)
spec = get_preset("small")
m = build_model(spec, device="cpu")
opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
x = torch.randint(0, 256, (8, 256)); y = torch.randint(0, 256, (8, 256))
def step():
    loss = lm_loss_sum(m(x), y) / y.numel(); loss.backward(); opt.step(); opt.zero_grad()
for _ in range(3): step()
t = time.perf_counter()
for _ in range(3): step()
print(f"step {1e3*(time.perf_counter()-t)/3:.1f} ms (no profiler)")
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
    for _ in range(3): step()
agg = collections.defaultdict(lambda: [0.0, 0])
tot = collections.defaultdict(float)
for e in p.events():
    if e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::"):
        continue  # only top-level aten
    tot[e.name] += e.self_cpu_time_total if False else e.cpu_time_total
    if e.name in ("aten::mm", "aten::linear"):
        agg[(e.name, str(e.input_shapes))][0] += e.cpu_time_total
        agg[(e.name, str(e.input_shapes))][1] += 1
for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:25]:
    print(f"{v/3/1e3:8.2f} ms  {k}")
print("--- mm by shape (per call us, calls/step)")
rows = []
for (n, s), (us, c) in sorted(agg.items(), key=lambda kv: -kv[1][0]):
    sh = eval(s); a, b = sh[0], sh[1]
    if n == "aten::linear":
        a = [a[0] * a[1], a[2]] if len(a) == 3 else a; b = [b[1], b[0]]  # x W^T
    rows.append((n, a, b, us / c, c // 3))
def alone(a, b, cold):
    nbuf = max(1, int(64e6 // (4 * (a[0]*a[1] + b[0]*b[1])))) if cold else 1
    nbuf = max(1, int(96e6 // (4 * (a[0]*a[1] + b[0]*b[1] + a[0]*b[1])))) if cold else 1
    A = [torch.randn(*a) for _ in range(nbuf)]; B = [torch.randn(*b) for _ in range(nbuf)]
    O = [torch.empty(a[0], b[1]) for _ in range(nbuf)]
    for i in range(nbuf): torch.mm(A[i], B[i], out=O[i])
    n = 0; t = time.perf_counter()
    while time.perf_counter() - t < 0.3:
        i = n % nbuf; torch.mm(A[i], B[i], out=O[i]); n += 1
    return (time.perf_counter() - t) / n * 1e6
tm = tw = tc = 0
for n, a, b, us, c in rows:
    w = alone(a, b, False); cl = alone(a, b, True)
    tm += us * c; tw += w * c; tc += cl * c
    print(f"{n[6:]:6s} {str(a):12s} x {str(b):12s} x{c:3d}: in-model {us:7.0f} us  warm {w:7.0f} ({us/w:.2f})  cold {cl:7.0f} ({us/cl:.2f})")
print(f"total mm per step: in-model {tm/1e3:.1f} ms, warm {tw/1e3:.1f} ({tm/tw:.2f}), cold {tc/1e3:.1f} ({tm/tc:.2f})")

"""One mixture-of-experts layer of ptd's runtime, timed and profiled: the grouped expert
product alone (even and skewed groups) against one plain product of the same FLOPs, then the
whole layer (router, dispatch, experts, combine) forward and backward under autocast, and
its kernels (torch.profiler). On a CUDA host in bf16, else on the CPU in fp32:

    PYTHONPATH=src python scripts/moe_layer_profile.py mixtral-8x7b 16384   # an H200: ~15 s
    PYTHONPATH=src python scripts/moe_layer_profile.py tiny-moe 512        # this CPU

It found Mixtral's experts running in fp32 under autocast (0.70 s a layer on an H200,
docs/data/h200-2026-11-27/moe-layer-profile-before.txt; docs/moe.md)."""
import sys, time, torch
from ptd.specs import get_preset
from ptd.runtime.model.moe import MoE, grouped_mm, _grouped_ok
dev = "cuda" if torch.cuda.is_available() else "cpu"
spec = get_preset(sys.argv[1]) if len(sys.argv) > 1 else get_preset("mixtral-8x7b")
T = int(sys.argv[2]) if len(sys.argv) > 2 else 16384
dt = torch.bfloat16 if dev == "cuda" else torch.float32
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
def timeit(fn, n=5):
    fn(); sync(); ts = []
    for _ in range(n):
        a = time.perf_counter(); fn(); sync(); ts.append(time.perf_counter() - a)
    return sorted(ts)[n // 2] * 1e3
h, f, E = spec.hidden, spec.ffn_hidden, spec.n_experts
# grouped product alone: equal groups, then Mixtral-like skew
x = torch.randn(T * spec.top_k, h, device=dev, dtype=dt, requires_grad=True)
w = torch.randn(E, h, f, device=dev, dtype=dt, requires_grad=True)
for name, counts in (("even", [T * spec.top_k // E] * E),
                     ("skewed", None)):
    if counts is None:
        c = torch.tensor([170, 119, 50, 86, 29, 44, 111, 178], dtype=torch.float64)
        counts = (c / c.sum() * T * spec.top_k).long().tolist(); counts[0] += T * spec.top_k - sum(counts)
    cnt = torch.tensor(counts, device=dev)
    fl = 2 * T * spec.top_k * h * f
    tf = timeit(lambda: grouped_mm(x, w, cnt))
    tb = timeit(lambda: grouped_mm(x, w, cnt).sum().backward())
    print(f"grouped_mm {name} ok={_grouped_ok(x, w)}: fwd {tf:.2f} ms ({fl/tf/1e9:.3g} TFLOP/s), fwd+bwd {tb:.2f} ms ({3*fl/tb/1e9:.3g} TFLOP/s)", flush=True)
xm = torch.randn(T * spec.top_k, h, device=dev, dtype=dt); wm = torch.randn(h, f, device=dev, dtype=dt)
tm = timeit(lambda: xm @ wm)
print(f"plain mm same FLOPs: {tm:.2f} ms ({2*T*spec.top_k*h*f/tm/1e9:.3g} TFLOP/s)", flush=True)
moe = MoE(spec).to(dev)
for p in moe.parameters(): torch.nn.init.normal_(p, std=0.02)
moe.aux_scale = 1.0 / T
xi = torch.randn(1, T, h, device=dev, requires_grad=True)
def layer():
    with torch.autocast(dev, dtype=dt, enabled=dev == "cuda"):
        y = moe(xi)
    y.float().sum().backward()
print(f"MoE layer fwd+bwd (bf16 autocast on CUDA): {timeit(layer):.1f} ms", flush=True)
from torch.profiler import profile, ProfilerActivity
acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
with profile(activities=acts) as prof:
    layer(); sync()
key = "self_cuda_time_total" if dev == "cuda" else "self_cpu_time_total"
print(prof.key_averages().table(sort_by=key, row_limit=22, max_name_column_width=60))

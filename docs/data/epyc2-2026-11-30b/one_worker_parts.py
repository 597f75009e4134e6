"""One worker's forward and backward of `small` (16 x 128 tokens, fp32, one thread), timed
clean and by operator category under torch.profiler, beside the cost model's parts.
    OMP_NUM_THREADS=1 .venv/bin/python docs/data/epyc2-2026-11-30b/one_worker_parts.py docs/data/epyc2-2026-11-30b/bench6/calibrated.toml"""
import statistics, sys, time
import torch
torch.set_num_threads(1)
from ptd.specs import get_preset, load_hardware, ClusterSpec, ParallelPlan
from ptd.runtime.model.transformer import build_model, lm_loss_sum
from ptd.runtime.model.init import materialize
from ptd.cost import compute as C
from ptd.cost import eager as E
from ptd.cost.estimate import estimate

spec = get_preset("small"); mb, seq = 16, 128
m = build_model(spec, "meta"); materialize(m, "cpu", 0)
x = torch.randint(0, spec.vocab_size, (mb, seq), generator=torch.Generator().manual_seed(0))
def step():
    t0 = time.perf_counter(); loss = lm_loss_sum(m(x), x) / x.numel(); t1 = time.perf_counter()
    loss.backward(); t2 = time.perf_counter()
    for p in m.parameters(): p.grad = None
    return t1 - t0, t2 - t1
for _ in range(3): step()
ts = [step() for _ in range(10)]
f, b = statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)
print(f"clean: forward {f*1e3:.1f} ms, backward {b*1e3:.1f} ms")

from torch.profiler import profile, ProfilerActivity
def cats(prof):
    out = {}
    for e in prof.key_averages():
        n = e.key
        if n in ("aten::mm", "aten::addmm", "aten::bmm"): c = "matmul"
        elif "scaled_dot_product" in n or "flash_attention" in n: c = "attention"
        else: c = "other"
        out[c] = out.get(c, 0.0) + e.self_cpu_time_total / 1e3
        out.setdefault("_ops", {}); 
    return out
def top(prof, k=12):
    ev = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:k]
    return ", ".join(f"{e.key.replace('aten::','')} {e.self_cpu_time_total/1e3:.1f}/{e.count}" for e in ev)
loss = None
with profile(activities=[ProfilerActivity.CPU]) as pf:
    loss = lm_loss_sum(m(x), x) / x.numel()
with profile(activities=[ProfilerActivity.CPU]) as pb:
    loss.backward()
for p in m.parameters(): p.grad = None
for name, p in (("forward", pf), ("backward", pb)):
    c = cats(p); c.pop("_ops")
    print(f"profiled {name}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in c.items()))
    print("   top:", top(p))

hw = load_hardware(sys.argv[1]); cl = ClusterSpec(hw, 1)
plan = ParallelPlan(dp=1, micro_batch=16, global_batch=16, seq_len=128, dtype="fp32")
st = estimate(spec, cl, plan).step
print(f"priced: forward {st.forward*1e3:.1f} ms, backward {st.backward*1e3:.1f} ms")
rate = cl.gemm_rate("fp32"); bw = cl.memory_bandwidth; tokens = mb * seq
full, attn = C.block_gemms(spec, tokens, seq, mb, 1)
t_lin = sum(C.gemm_time(g, rate, bw, 4, hw, "fp32") for g in full)
out = C.gemm_time(C.Gemm(tokens, spec.padded_vocab(1), spec.hidden), rate, bw, 4, hw, "fp32")
flops = 0.5 * sum(g.flops for g in attn)
eff = C.attention_fraction(hw, "fp32", spec.head_dim, seq)
t_attn = flops / (rate * eff)
ew, ew_b = C.eager_time(E.block_passes(spec, tokens, 1, False, "fp32", "autocast", 1, composite_norm=True, ffn=True), bw, False, hw.eager_bandwidth_fraction)
ops = C.block_ops(spec); oo = C.output_ops(spec)
L = spec.n_layers
print(f"priced parts forward: matmul {(L*t_lin+out)*1e3:.1f} (blocks {L*t_lin*1e3:.1f}, output {out*1e3:.1f}), attention {L*t_attn*1e3:.1f}, "
      f"block elementwise {L*ew*1e3:.1f}, ops {(L*ops[0]+oo[0])} x {cl.op_overhead*1e6:.1f} us = {(L*ops[0]+oo[0])*cl.op_overhead*1e3:.1f} ms")
print(f"priced parts backward: matmul {2*(L*t_lin+out)*1e3:.1f}, attention {2.5*L*t_attn*1e3:.1f}, block elementwise {L*ew_b*1e3:.1f}, ops {(L*ops[1]+oo[1])*cl.op_overhead*1e3:.1f} ms")

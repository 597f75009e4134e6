"""Where a single-GPU training step of ptd's model spends its device time, by operator and
input shape, beside a matmul held for many seconds (does the rate of a short benchmark hold
while the card heats?). Run on a CUDA host:

    OUT=results PYTHONPATH=src python scripts/gpu_step_breakdown.py [sustain|kernels|NAME ...]

NAME is one of CONFIGS below (a preset or a published case's model, on one GPU, at the case's
micro-batch and sequence length). Writes OUT/breakdown_<NAME>.json: the phase times (median of
the steps after two warm-ups, CUDA-synchronised), every kernel's name, count and device time,
and the aten operators with their input shapes and device time (two profiled steps), from
which ``scripts/gpu_breakdown_compare.py`` prices each product with the cost model.
``sustain`` writes OUT/sustain.json: the rate of back-to-back 8192^3 bf16 products, second by
second for 20 s, with the SM clock, power and temperature nvidia-smi reports beside it;
``kernels`` writes OUT/kernels.json: the bandwidth eager kernels reach at a block's sizes."""
import dataclasses
import json
import os
import subprocess
import sys
import time

import torch

from ptd.runtime.model.init import materialize
from ptd.runtime.model.transformer import build_model
from ptd.specs.model import get_preset

sys.path.insert(0, os.path.dirname(__file__))
from gpu_profile_step import step  # noqa: E402  (the phases as ptd train runs them)

OUT = os.environ.get("OUT", ".")
DEV = torch.device("cuda")


def case_spec(case_id):
    from ptd.cost.validate import case_model, load_cases
    return case_model({c["id"]: c for c in load_cases()}[case_id])


# name: (model spec, micro-batch, sequence length). Layers cut where the whole model would
# not fit one GPU with fp32 AdamW states; a block's time does not depend on how many there are.
CONFIGS = {
    "llama3-8b-L8": (lambda: dataclasses.replace(get_preset("llama3-8b"), n_layers=8), 1, 8192),
    "mcore-1.7b": (lambda: case_spec("megatron_h100_2024_1.7b"), 4, 4096),
    "llama2-7b-L8": (lambda: dataclasses.replace(case_spec("ibm_fsdp2024_7B_h100"), n_layers=8), 2, 4096),
    # held out: measured after ptd.cost.eager was written from the three above
    "gpt2-1.5b": (lambda: get_preset("gpt2-1.5b"), 8, 1024),
    "llama3-8b-L8-s4096": (lambda: dataclasses.replace(get_preset("llama3-8b"), n_layers=8), 2, 4096),
}


def kernels():
    """Achieved bandwidth of eager kernels at a block's sizes (bytes read + written over
    time), beside a plain bf16 copy: what the cost model's copy bandwidth does not see."""
    s, h, v = 8192, 4096, 128256
    x32 = torch.randn(s, h, device=DEV)
    x16 = x32.to(torch.bfloat16)
    q = torch.randn(1, s, 32, 128, device=DEV, dtype=torch.bfloat16)
    tab = torch.randn(1, s, 1, 128, device=DEV, dtype=torch.bfloat16)
    logits = torch.randn(s, v, device=DEV, dtype=torch.bfloat16)
    l32 = logits.float()
    n = s * h
    cases = {
        "copy bf16": (lambda: x16.clone(), 4 * n),
        "cast fp32->bf16": (lambda: x32.to(torch.bfloat16), 6 * n),
        "cast bf16->fp32": (lambda: x16.float(), 6 * n),
        "add fp32+bf16": (lambda: x32 + x16, 10 * n),
        "mul bf16 broadcast (rope)": (lambda: q * tab, 4 * q.numel()),
        "cat halves bf16 (rope)": (lambda: torch.cat([q[..., 64:], q[..., :64]], -1), 4 * q.numel()),
        "silu bf16": (lambda: torch.nn.functional.silu(x16), 4 * n),
        "log_softmax fp32": (lambda: torch.log_softmax(l32, -1), 8 * s * v),
        "cast logits bf16->fp32": (lambda: logits.float(), 6 * s * v),
    }
    out = {}
    for name, (fn, nbytes) in cases.items():
        for _ in range(3):
            fn()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(20):
            fn()
        e1.record()
        torch.cuda.synchronize()
        t = e0.elapsed_time(e1) / 1e3 / 20
        out[name] = {"us": t * 1e6, "TB/s": nbytes / t / 1e12}
        print(f"  {name:28s} {t * 1e6:8.1f} us  {nbytes / t / 1e12:5.2f} TB/s", flush=True)
    return out


def smi():
    q = "clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"
    r = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True, timeout=10)
    return r.stdout.strip()


def sustain(seconds=20.0):
    n = 8192
    a = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)
    rows, t_end = [], time.time() + seconds
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    while time.time() < t_end:
        s.record()
        for _ in range(200):
            torch.mm(a, b)
        e.record()
        torch.cuda.synchronize()
        dt = s.elapsed_time(e) / 1e3
        rows.append({"t": round(seconds - (t_end - time.time()), 2),
                     "tflops": 200 * 2 * n ** 3 / dt / 1e12, "smi": smi()})
        print(rows[-1], flush=True)
    return rows


def attr(e, *names):
    for n in names:
        if hasattr(e, n):
            return getattr(e, n)
    return 0.0


def breakdown(name):
    make, mb, seq = CONFIGS[name]
    spec = make()
    model = materialize(build_model(spec), DEV, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    params = list(model.parameters())
    tok = torch.randint(0, spec.vocab_size, (mb, seq + 1), device=DEV)
    x, y = tok[:, :-1], tok[:, 1:]
    times = []
    for _ in range(6):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        parts = step(model, opt, params, x, y, foreach=True)
        times.append([time.perf_counter() - t0] + parts)
    med = {k: sorted(c)[len(c) // 2] * 1e3
           for k, c in zip(["step", "fwd", "bwd", "norm", "opt"], zip(*times[2:]))}
    print(name, {k: round(v, 2) for k, v in med.items()}, flush=True)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for _ in range(2):
            step(model, opt, params, x, y, foreach=True)
    kernels, ops = [], []
    for e in prof.key_averages():
        dev = attr(e, "self_device_time_total", "self_cuda_time_total")
        if dev > 0 and attr(e, "device_type") is not None and "DeviceType.CUDA" in str(e.device_type):
            kernels.append([e.key, e.count, dev])
    for e in prof.key_averages(group_by_input_shape=True):
        dev = attr(e, "device_time_total", "cuda_time_total")
        if e.key.startswith("aten::") and dev > 0:
            ops.append([e.key, str(e.input_shapes), e.count, dev])
    kernels.sort(key=lambda r: -r[2])
    ops.sort(key=lambda r: -r[3])
    res = {"name": name, "spec": dataclasses.asdict(spec), "micro_batch": mb, "seq_len": seq,
           "phases_ms": med, "profiled_steps": 2, "kernels_us": kernels[:200], "ops_us": ops[:300],
           "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    with open(os.path.join(OUT, f"breakdown_{name}.json"), "w") as f:
        json.dump(res, f, indent=0)
    tot = sum(k[2] for k in kernels) / 2e3
    print(f"{name}: kernels {tot:.1f} ms per step; top:", flush=True)
    for k in kernels[:12]:
        print(f"  {k[2] / 2e3:8.2f} ms  x{k[1] // 2:<5} {k[0][:90]}", flush=True)
    del model, opt, params
    torch.cuda.empty_cache()


def main():
    names = sys.argv[1:] or ["sustain", "kernels", *CONFIGS]
    for name in names:
        t0 = time.time()
        if name == "kernels":
            with open(os.path.join(OUT, "kernels.json"), "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "rows": kernels()}, f, indent=0)
        elif name == "sustain":
            with open(os.path.join(OUT, "sustain.json"), "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "rows": sustain()}, f, indent=0)
        else:
            breakdown(name)
        print(f"[{name}] {time.time() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()

"""GPU microbenchmarks behind the cost model's GPU figures: a matmul shape sweep (bf16, fp16,
tf32, fp32; m, n, k from 256 to 16k, and the products of transformer layers), causal SDPA
attention, memory-bound kernels and kernel launch overhead. Run on a CUDA host:

    OUT=results python scripts/gpu_microbench.py     # writes results/gpu_microbench.json

Each timing is the mean over enough repetitions to fill ~30 ms after two warm-ups (CUDA
events), on random normal data."""
import itertools
import json
import os
import time

import torch
import torch.nn.functional as F

OUT = os.environ.get("OUT", ".")
DEV = "cuda"
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32}
SIZES = [256, 512, 1024, 2048, 4096, 8192, 16384]
HIDDEN = [2304, 3072, 4096, 5120, 6144, 8192, 12288]


def timeit(fn, target=0.03, min_reps=3, warm=2):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    torch.cuda.synchronize()
    one = max(s.elapsed_time(e) / 1e3, 1e-6)
    reps = max(min_reps, min(200, int(target / one)))
    s.record()
    for _ in range(reps):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / 1e3 / reps


def gemm_rate(dt, m, n, k):
    a = torch.randn(m, k, device=DEV, dtype=DT[dt])
    b = torch.randn(k, n, device=DEV, dtype=DT[dt])
    t = timeit(lambda: torch.mm(a, b))
    return 2 * m * n * k / t


def sweep_gemm(res, t0):
    for dt in ["bf16", "fp16", "tf32", "fp32"]:
        torch.backends.cuda.matmul.allow_tf32 = dt == "tf32"
        rows = [[m, n, k, gemm_rate(dt, m, n, k)] for m, n, k in itertools.product(SIZES, SIZES, SIZES)]
        res["gemm"][dt] = rows
        print(f"{dt}: {len(rows)} shapes, best {max(r[3] for r in rows) / 1e12:.0f} TFLOP/s, "
              f"{time.time() - t0:.0f} s", flush=True)
    torch.backends.cuda.matmul.allow_tf32 = False


def sweep_layers(res, t0):
    """Forward (x W^T), input-gradient and weight-gradient products of a GPT block's linears
    at hidden size h, tensor-parallel degree tp and T tokens per micro-batch."""
    for dt in ["bf16"]:
        rows = []
        for h, tp, T in itertools.product(HIDDEN, [1, 2, 4, 8], [2048, 4096, 8192]):
            for name, out, inn in [("qkv", 3 * h // tp, h), ("proj", h, h // tp),
                                   ("fc1", 4 * h // tp, h), ("fc2", h, 4 * h // tp)]:
                for kind, (m, n, k) in [("fwd", (T, out, inn)), ("dgrad", (T, inn, out)),
                                        ("wgrad", (out, inn, T))]:
                    rows.append([h, tp, T, name, kind, m, n, k, gemm_rate(dt, m, n, k)])
        res["gemm_model"][dt] = rows
        print(f"layer shapes {dt}: {len(rows)}, {time.time() - t0:.0f} s", flush=True)


def sweep_attention(res):
    for d, s in itertools.product([64, 128], [1024, 2048, 4096, 8192, 16384]):
        heads = 64 if d == 64 else 16
        b = max(1, 16384 // s)
        q = torch.randn(b, heads, s, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn_like(q, requires_grad=True)
        v = torch.randn_like(q, requires_grad=True)
        flops = 4 * b * heads * s * s * d / 2  # two products, causal half
        tf = timeit(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        g = torch.randn_like(q)

        def fb():
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)
        tfb = timeit(fb)
        res["attention"].append(dict(d=d, s=s, b=b, heads=heads, fwd_s=tf, fwdbwd_s=tfb,
                                     fwd_tflops=flops / tf / 1e12,
                                     bwd_tflops=2.5 * flops / (tfb - tf) / 1e12))
        print(res["attention"][-1], flush=True)


def sweep_memory(res):
    """Achieved bandwidth, counting bytes read and written once each."""
    for n_el in [2**20, 2**24, 2**28]:
        x = torch.randn(n_el, device=DEV, dtype=torch.bfloat16)
        y = torch.randn_like(x)
        h = 4096
        x2 = x.view(-1, h)
        w = torch.ones(h, device=DEV, dtype=torch.bfloat16)
        for name, fn, nbytes in [
            ("copy", lambda: x.clone(), 4 * n_el),
            ("add", lambda: x + y, 6 * n_el),
            ("gelu", lambda: F.gelu(x), 4 * n_el),
            ("silu_mul", lambda: F.silu(x) * y, 6 * n_el),  # two kernels: 10 bytes/el moved
            ("layer_norm", lambda: F.layer_norm(x2, (h,), w, w), 4 * n_el),
            ("rms_norm", lambda: F.rms_norm(x2, (h,), w), 4 * n_el),
            ("softmax", lambda: torch.softmax(x2, -1), 4 * n_el),
        ]:
            t = timeit(fn)
            res["memory"].append(dict(kernel=name, elements=n_el, bytes=nbytes, s=t, bw=nbytes / t))
        print(res["memory"][-7:], flush=True)


def launch_overhead(res):
    x = torch.ones(16, device=DEV)
    for _ in range(100):
        x.add_(1.0)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(5000):
        x.add_(1.0)
    torch.cuda.synchronize()
    res["launch"]["tiny_add_s"] = (time.perf_counter() - t) / 5000
    print(res["launch"], flush=True)


def main():
    p = torch.cuda.get_device_properties(0)
    info = dict(name=p.name, sms=p.multi_processor_count, memory_bytes=p.total_memory,
                torch=torch.__version__, cuda=torch.version.cuda,
                date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    print(info, flush=True)
    res = dict(info=info, gemm={}, gemm_model={}, attention=[], memory=[], launch={})
    t0 = time.time()
    for step in (lambda: sweep_gemm(res, t0), lambda: sweep_layers(res, t0),
                 lambda: sweep_attention(res), lambda: sweep_memory(res), lambda: launch_overhead(res)):
        step()
        with open(os.path.join(OUT, "gpu_microbench.json"), "w") as f:
            json.dump(res, f)  # after every part, so a cut-off run keeps what it measured
    print(f"done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()

"""Set the kernel time of ``scripts/gpu_step_breakdown.py`` runs beside the cost model, by
kind of kernel: matrix products, fused attention, memory-bound kernels (the optimizer's left
out). Runs anywhere (no GPU):

    PYTHONPATH=src python scripts/gpu_breakdown_compare.py docs/data/h200-2026-11-27/breakdown_*.json \\
        [--hardware h200] [--elementwise fused|eager|llama-ref|autocast]

Each file holds the model spec, micro-batch and sequence length it ran, so the prediction
is of the same work on one device (``ptd.cost.compute``: the block's products, attention
and memory-bound passes, and the output layer)."""
import argparse
import json

from ptd.cost import compute as C
from ptd.specs.hardware import load_hardware
from ptd.specs.model import ModelSpec


def kind(name: str) -> str | None:
    """The kind of a CUDA kernel by its name (None: a profiler annotation, not a kernel)."""
    k = name.lower()
    if name.startswith(("Optimizer.step", "ProfilerStep")):
        return None
    if any(w in k for w in ("sdpa", "flash", "fmha", "attention")):
        return "attention"
    if any(w in k for w in ("nvjet", "gemm", "cutlass", "cublas")):
        return "products"
    if any(w in k for w in ("multi_tensor_apply", "fused_adam", "foreach")):
        return "optimizer"
    return "memory-bound"


def measured(run: dict) -> dict[str, float]:
    """Milliseconds per step by kind (the profile covers ``profiled_steps`` steps)."""
    out: dict[str, float] = {}
    for name, _count, us in run["kernels_us"]:
        k = kind(name)
        if k:
            out[k] = out.get(k, 0.0) + us / 1e3 / run["profiled_steps"]
    return out


def predicted(run: dict, hw_name: str, elementwise: str) -> dict[str, float]:
    spec = ModelSpec(**run["spec"])
    hw = load_hardware(hw_name)
    mb, s = run["micro_batch"], run["seq_len"]
    tokens, layers = mb * s, spec.n_layers
    rate, bw = hw.gemm_rate("bf16"), hw.effective_memory_bandwidth
    lin, attn = C.block_gemms(spec, tokens, s, mb, 1)
    out = C.Gemm(tokens, spec.padded_vocab(1), spec.hidden)
    products = 3 * (layers * sum(C.gemm_time(g, rate, bw, 2, hw, "bf16") for g in lin)
                    + C.gemm_time(out, rate, bw, 2, hw, "bf16"))
    flops = 0.5 * sum(g.flops for g in attn)  # causal
    attention = layers * 3.5 * flops / (rate * C.attention_fraction(hw, "bf16", spec.head_dim, s))
    blk = C.block_time(spec, hw, s, mb, 1, False, "bf16", rate, elementwise=elementwise)
    of, ob = C.output_time(spec, hw, tokens, 1, "bf16", rate, elementwise=elementwise)
    total = layers * (blk.forward + blk.backward) + of + ob
    return {"products": products * 1e3, "attention": attention * 1e3,
            "memory-bound": (total - products - attention) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--hardware", default="h200")
    ap.add_argument("--elementwise", default="autocast")
    a = ap.parse_args()
    print(f"{'run':22s} {'kind':13s} {'measured':>9s} {'predicted':>10s}  (ms per step)")
    for path in a.files:
        with open(path) as f:
            run = json.load(f)
        m, p = measured(run), predicted(run, a.hardware, a.elementwise)
        for k in ("products", "attention", "memory-bound"):
            print(f"{run['name']:22s} {k:13s} {m.get(k, 0.0):9.1f} {p[k]:10.1f}")
        tm = sum(m.get(k, 0.0) for k in p)
        print(f"{run['name']:22s} {'all but opt.':13s} {tm:9.1f} {sum(p.values()):10.1f}"
              f"  ({sum(p.values()) / tm - 1:+.1%})")


if __name__ == "__main__":
    main()

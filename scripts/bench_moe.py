"""Grouped experts against the per-expert loop they replaced: tokens/s of one training step
(forward + backward) of a mixture-of-experts model, single process, side by side in one run.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_moe.py --model tiny-moe --batch 8 --seq 256

"loop" is the per-expert MoE forward ptd had first (for each expert: ``nonzero`` of the tokens that
chose it, gather, the expert's MLP, weighted ``index_add``), run on the same stacked weights;
"grouped" is :class:`ptd.runtime.model.moe.MoE` (one sort, one gather, ``torch._grouped_mm`` per
weight matrix, one ``index_add``). Auxiliary losses off in both, so the work is the same.
The two alternate, ``--reps`` times each; the median is reported. Timed with
``time.process_time`` (CPU seconds of this process; one intra-op thread, so that is the
work done) because wall-clock time on a shared machine measures the neighbours too.
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from ptd.runtime.model.init import materialize
from ptd.runtime.model.transformer import build_model
from ptd.runtime.model.moe import MoE
from ptd.specs import load_model


def loop_forward(self: MoE, x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    weights, chosen = self.router(flat).topk(self.top_k, dim=-1)
    weights = weights.float().softmax(dim=-1).to(x.dtype)
    out = torch.zeros_like(flat)
    w = self.experts
    for e in range(self.n_experts):
        rows, slot = (chosen == e).nonzero(as_tuple=True)
        if rows.numel():
            h = flat[rows]
            y = (F.silu(h @ w.w1[e]) * (h @ w.w3[e])) @ w.w2[e]
            out.index_add_(0, rows, y * weights[rows, slot, None])
    return out.view_as(x)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny-moe")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--experts", type=int, default=0, help="override n_experts (0: the model's)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    spec = load_model(a.model).replace(aux_loss_coef=0.0, z_loss_coef=0.0)
    if a.experts:
        spec = spec.replace(n_experts=a.experts)
    assert spec.mlp == "swiglu" and not spec.bias
    model = materialize(build_model(spec), "cpu", 0)
    x = torch.randint(0, spec.vocab_size, (a.batch, a.seq))
    grouped = MoE.forward

    layer = model.layers["0"].feed_forward
    h = torch.randn(a.batch, a.seq, spec.hidden, requires_grad=True)

    def step(kind: str, what: str) -> float:
        MoE.forward = loop_forward if kind == "loop" else grouped
        t = time.process_time()
        out = model(x) if what == "model" else layer(h)
        out.float().pow(2).mean().backward()
        dt = time.process_time() - t
        model.zero_grad(set_to_none=True)
        return dt

    tokens = a.batch * a.seq
    print(f"{a.model} ({spec.n_experts} experts, top-{spec.top_k}), {tokens} tokens/step, torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    for what in ("model", "one MoE layer"):
        for kind in ("loop", "grouped"):  # warm-up
            step(kind, what)
        times: dict[str, list[float]] = {"loop": [], "grouped": []}
        for _ in range(a.reps):
            for kind in times:
                times[kind].append(step(kind, what))
        for kind, ts in times.items():
            med = statistics.median(ts)
            print(f"{what:14s} {kind:8s} {med * 1e3:8.2f} ms CPU fwd+bwd  {tokens / med:10,.0f} tokens/s")
        ratio = statistics.median(times["loop"]) / statistics.median(times["grouped"])
        print(f"{what:14s} grouped / loop speed-up: {ratio:.2f}x")


if __name__ == "__main__":
    main()

"""Where ptd's single-GPU training step spends its time: ptd's own model (``build_model`` +
``materialize``), fp32 weights under bf16 autocast as ``ptd train --dtype bf16`` runs them,
each phase timed between CUDA synchronisations (median of the steps after two warm-ups),
and the kernels of two steps from torch.profiler. Run on a CUDA host:

    OUT=results PYTHONPATH=src python scripts/gpu_profile_step.py [MODEL MICRO_BATCH SEQ [LAYERS]]

Writes OUT/profile_<model>.txt (kernel table) and OUT/profile_phases.json. Compares ptd's
optimizer path with the per-tensor loop it replaced on GPUs (see runtime/optim.py)."""
import dataclasses
import json
import os
import sys
import time

import torch

from ptd.runtime.model.init import materialize
from ptd.runtime.model.transformer import build_model, lm_loss_sum
from ptd.runtime.optim import clip_grads_, global_grad_norm, squared_norm
from ptd.specs.model import get_preset

OUT = os.environ.get("OUT", ".")
DEV = torch.device("cuda")


def step(model, opt, params, x, y, foreach):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(x)
    loss = lm_loss_sum(logits, y) / y.numel()
    marks = [time.perf_counter()]
    for phase in ("fwd", "bwd", "norm", "opt"):
        if phase == "bwd":
            loss.backward()
        elif phase == "norm":
            if foreach:
                norm = global_grad_norm(params, DEV)
            else:
                norm = squared_norm([p.grad for p in params], DEV, foreach=False).sqrt()
            clip_grads_(params, 1.0, norm)
        elif phase == "opt":
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        marks.append(time.perf_counter())
    return [b - a for a, b in zip(marks, marks[1:])]


def run(spec, mb, seq, fused, steps=6):
    model = materialize(build_model(spec), DEV, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused, foreach=None if fused else True)
    params = list(model.parameters())
    tok = torch.randint(0, spec.vocab_size, (mb, seq + 1), device=DEV)
    x, y = tok[:, :-1], tok[:, 1:]
    times = []
    for i in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        parts = step(model, opt, params, x, y, foreach=fused)
        times.append([time.perf_counter() - t0] + parts)
    med = [sorted(c)[len(c) // 2] * 1e3 for c in zip(*times[2:])]
    return model, opt, params, x, y, dict(zip(["step", "fwd", "bwd", "norm", "opt"], med))


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "gpt2-355m"
    mb, seq = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (16, 1024)
    spec = get_preset(name)
    if len(sys.argv) > 4:
        spec = dataclasses.replace(spec, n_layers=int(sys.argv[4]))
    res = {}
    for fused in (False, True):
        model, opt, params, x, y, med = run(spec, mb, seq, fused)
        res["fused AdamW + foreach norm" if fused else "foreach AdamW + per-tensor norm"] = med
        print(name, "fused" if fused else "per-tensor", {k: round(v, 1) for k, v in med.items()})
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            step(model, opt, params, x, y, foreach=True)
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70)
    print(table)
    with open(os.path.join(OUT, f"profile_{name}.txt"), "w") as f:
        f.write(table)
    with open(os.path.join(OUT, "profile_phases.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

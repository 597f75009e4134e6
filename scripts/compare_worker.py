"""One worker of scripts/compare_frameworks.py: ptd's model, data and optimizer settings
trained by Hugging Face Accelerate (DDP) or DeepSpeed (ZeRO 1/2/3) instead of ptd's trainer.

Launched by torchrun (one process per worker). What is the same as ``ptd train``, so that
only the framework differs:

* the model: :func:`ptd.runtime.model.transformer.build_model` on the meta device, then
  :func:`ptd.runtime.model.init.materialize` with the same seed (the same initial weights);
* the data: :class:`ptd.runtime.data.loader.DataLoader` over the same corpus (each data-parallel
  rank reads the same rows as ptd's rank of the same index);
* the optimizer: AdamW on :func:`ptd.runtime.optim.param_groups` (weight decay off for norms
  and biases), ptd's learning-rate schedule (:func:`ptd.runtime.optim.lr_at`), gradient
  clipping at ``OptimConfig.grad_clip``;
* the step, and how it is timed: next batch, forward and backward of every micro-batch, the
  loss averaged over all ranks and read on the host (what ptd does to log it), clipping,
  optimizer step -- wall clock on rank 0 around all of it; tokens/s is the tokens of a step
  over the mean step time of every step after the first (ptd's ``measured.tokens_per_s``
  with the profiler and memory tracker off).

Writes one JSON line to ``--out`` on rank 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--framework", choices=["accelerate", "deepspeed"], required=True)
    p.add_argument("--zero", type=int, default=0)
    p.add_argument("--model", default="small")
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--global-batch", type=int, required=True)
    p.add_argument("--micro-batch", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    a = p.parse_args()

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from ptd.runtime.data.corpus import Sources, open_stream
    from ptd.runtime.data.loader import DataLoader
    from ptd.runtime.model.init import materialize
    from ptd.runtime.model.transformer import build_model
    from ptd.runtime.optim import lr_at, param_groups
    from ptd.specs import load_model
    from ptd.specs.config import DataConfig, TrainConfig

    torch.set_num_threads(1)  # as ptd train: one intra-op thread per worker
    spec = load_model(a.model)
    ocfg = TrainConfig().optim  # ptd train's defaults (its warm-up is longer than OptimConfig's)
    model = materialize(build_model(spec), "cpu", a.seed)
    opt = torch.optim.AdamW(param_groups(model, ocfg.weight_decay), lr=ocfg.lr,
                            betas=(ocfg.beta1, ocfg.beta2), eps=ocfg.eps)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_at(s + 1, ocfg, a.steps) / ocfg.lr)

    if a.framework == "accelerate":
        from accelerate import Accelerator
        acc = Accelerator(cpu=True)
        # the scheduler stays unprepared: Accelerate would step it once per process per step
        model, opt = acc.prepare(model, opt)
        rank, world = acc.process_index, acc.num_processes

        def backward(loss: torch.Tensor, last: bool) -> None:
            # as ptd's DDP: gradients are reduced once, after the last micro-batch
            with contextlib.nullcontext() if last else acc.no_sync(model):
                acc.backward(loss / len(micro))

        def update() -> None:
            acc.clip_grad_norm_(model.parameters(), ocfg.grad_clip)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
        version = __import__("accelerate").__version__
    else:
        import deepspeed
        deepspeed.init_distributed(dist_backend="gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        per_replica = a.global_batch // world
        ds_config = {
            "train_batch_size": a.global_batch,
            "train_micro_batch_size_per_gpu": a.micro_batch,
            "gradient_accumulation_steps": per_replica // a.micro_batch,
            "gradient_clipping": ocfg.grad_clip,
            "zero_optimization": {"stage": a.zero},
            "zero_allow_untested_optimizer": True,  # torch AdamW: DeepSpeed's own needs its C++ ops
            "steps_per_print": 10**9,
        }
        engine, opt, _, sched = deepspeed.initialize(model=model, optimizer=opt,
                                                     lr_scheduler=sched, config=ds_config)
        model = engine

        def backward(loss: torch.Tensor, last: bool) -> None:
            engine.backward(loss)  # divides by gradient_accumulation_steps itself
            engine.step()  # an optimizer step only at the accumulation boundary

        def update() -> None:
            pass
        version = deepspeed.__version__

    stream = open_stream(Sources.resolve(DataConfig()))
    loader = DataLoader(stream, seq_len=a.seq_len, global_batch=a.global_batch,
                        micro_batch=a.micro_batch, dp_rank=rank, dp_size=world, seed=a.seed)
    times, losses = [], []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        micro = loader.next()
        total = torch.zeros(())
        for i, mb in enumerate(micro):
            logits = model(mb.inputs)
            loss = F.cross_entropy(logits.float().flatten(0, 1), mb.targets.flatten())
            backward(loss, i == len(micro) - 1)
            total += loss.detach() / len(micro)
        dist.all_reduce(total)
        losses.append(total.item() / world)
        update()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        step_s = sum(times[1:]) / max(1, len(times) - 1)
        rec = {"framework": a.framework, "version": version, "zero": a.zero, "world": world,
               "tokens_per_s": a.global_batch * a.seq_len / step_s, "step_time_s": step_s,
               "step_times_s": times, "losses": losses}
        with open(a.out, "w") as f:
            f.write(json.dumps(rec) + "\n")
    dist.barrier()
    os._exit(0)  # skip the frameworks' teardown: nothing is left to flush


if __name__ == "__main__":
    main()

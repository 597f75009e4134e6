"""One training process: ``python -m ptd.runtime.worker OUT/config.toml``.

Started by torchrun (``ptd train --nproc N``, or by hand on several nodes) or called in
process for a single worker. It assembles the run -- mesh, model, parallel dimensions,
optimizer, data, runner, trainer -- and trains. ``@record`` makes an exception in any
worker land in torchrun's error file, so the launcher can name the failing rank and
show its error.

Debugging hook (hidden): ``PTD_DUMP_PARAMS=1`` makes rank 0 write the consolidated
parameters before the first and after the last step to ``OUT/params_init.pt`` and
``OUT/params_final.pt`` (the parity tests compare layouts with them).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.distributed.elastic.multiprocessing.errors import record

from ..specs import TrainConfig, load_config
from .data.corpus import Sources, open_stream
from .data.loader import DataLoader, eval_batches
from .resilience.fault import FaultInjector
from .parallel.mesh import ParallelDims, init_distributed, shutdown
from ..summary.compare import comparison_table
from .measure.probe import Probe
from .measure.runlog import RunLog
from .model import moe
from .model.transformer import build_model
from .optim import build_optimizer
from .parallel import parallelize, unwrap
from .parallel.pp import split_model
from .precision import Precision
from .resilience.recovery import Recovery
from .runner import make_runner
from .trainer import Trainer


def dump_params(model: torch.nn.Module, path: Path, dims: ParallelDims) -> None:
    """Full (unsharded) state dict of the whole model on rank 0; a collective: every rank
    must call it. Each pipeline stage's is gathered over its dp/tp shards, then the stages'
    are collected on rank 0 (over the pp group of rank 0). The vocabulary's padding rows
    are left out, as exports leave them: the dump does not depend on tp."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from .model.transformer import is_vocab_tensor
    # (not cpu_offload: with it, only global rank 0 would get a state dict)
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    vocab = unwrap(model).spec.vocab_size
    sd = {k: (v[:vocab] if is_vocab_tensor(k) else v).detach().cpu().clone() for k, v in sd.items()}
    if dims.plan.pp > 1 and dims.coords["dp"] == dims.coords["cp"] == dims.coords["tp"] == 0:
        parts: list | None = [None] * dims.plan.pp if dims.is_main else None
        dist.gather_object(sd, parts, dst=0, group=dims.group("pp"))
        if parts is not None:
            sd = {k: v for part in parts for k, v in part.items()}
    if dims.is_main:
        torch.save(sd, path)


def count_params(model: torch.nn.Module, dims: ParallelDims) -> int:
    """Parameters of the whole model (global sizes of shards, summed over pipeline stages; a
    tied embedding's copy on the last stage once, as the tensor it stands for)."""
    import torch.distributed as dist
    from .model.transformer import tied_copy
    copy = tied_copy(model)
    n = torch.tensor(sum(p.numel() for p in unwrap(model).parameters() if p is not copy),
                     dtype=torch.int64)
    if dims.plan.pp > 1:
        dist.all_reduce(n, group=dims.group("pp"))
    return int(n)


def build_trainer(cfg: TrainConfig, dims: ParallelDims) -> Trainer:
    plan = cfg.plan
    # Dropout streams differ per replica and pipeline rank, not between tensor-parallel peers:
    # their replicated activations (the residual stream) must get the same masks.
    dims.seed_rng(cfg.seed)
    model, stage_modules, stage_ids = split_model(build_model(cfg.model, tp=plan.tp_split), plan,
                                                  dims.coords["pp"])
    model = parallelize(model, plan, dims, seed=cfg.seed, compile=cfg.compile, roots=stage_modules)
    # MoE: auxiliary-loss scale (the runners' loss is per replica token); stats once per tp group
    moe.prepare(model, plan.global_batch // plan.dp * plan.seq_len, record=dims.coords["tp"] == 0)
    optimizer = build_optimizer(model, cfg.optim)
    precision = Precision(plan.dtype, dims.device, fsdp=plan.zero >= 1,
                          distributed=dims.world_size > 1)
    train, val = open_stream(Sources.resolve(cfg.data)).split(cfg.data.val_fraction)
    common = dict(seq_len=plan.seq_len, global_batch=plan.global_batch, micro_batch=plan.micro_batch,
                  dp_rank=dims.dp_rank, dp_size=dims.dp_size, device=dims.device)
    loader = DataLoader(train, seed=cfg.seed, **common)
    val_batches = eval_batches(val, **common) if cfg.eval_every else []
    log = RunLog(cfg.out, cfg.steps, enabled=dims.is_main, tensorboard=cfg.tensorboard)
    runner = make_runner(model, stage_modules, stage_ids, dims, precision)
    return Trainer(cfg, dims, model, runner, optimizer, precision, loader, log, val_batches,
                   FaultInjector(dims.rank))


def run(cfg: TrainConfig) -> dict[str, Any]:
    """Train ``cfg`` in this process (one rank of the world torchrun set up, or alone)."""
    start = time.perf_counter()
    torch.set_num_threads(cfg.threads)
    dims = init_distributed(cfg.plan, cfg.timeout_s)
    trainer = None
    try:
        cfg.validate(dims.world_size)
        trainer = build_trainer(cfg, dims)
        recovery = Recovery.start(cfg, dims, trainer)  # resume / init_from, checkpoints, timeouts
        probe = Probe.attach(trainer, cfg, dims, memory_step=cfg.measure.memory_step,
                             profile_steps=cfg.measure.profile_steps)
        from .resilience.interrupt import Interrupt
        interrupt = Interrupt.install(trainer, dims, recovery.checkpointer)  # Ctrl-C
        dump = os.environ.get("PTD_DUMP_PARAMS") == "1"
        if dump:
            dump_params(trainer.model, Path(cfg.out) / "params_init.pt", dims)
        summary = trainer.train()
        recovery.close()
        interrupt.uninstall()
        if dump:
            dump_params(trainer.model, Path(cfg.out) / "params_final.pt", dims)
        runtime_params = count_params(trainer.model, dims)
        summary.update(
            wall_time_s=time.perf_counter() - start, world_size=dims.world_size,
            plan=cfg.plan.to_dict(), plan_desc=cfg.plan.describe(), model=cfg.model.name,
            param_count=cfg.model.param_count(), device=str(dims.device), dtype=cfg.plan.dtype,
            torch=torch.__version__, runtime_params=runtime_params)
        if note := cfg.model.padding_note(cfg.plan.tp_split):
            summary["vocab_padding"] = note
        if not summary["status"].startswith("interrupted"):  # (every rank agrees)
            summary.update(probe.finish(summary))  # a collective: measured vs predicted
        trainer.log.finish(summary)
        if dims.is_main and "measured" in summary:
            print(comparison_table(summary), flush=True)
        return summary
    except BaseException:
        if trainer is not None:
            trainer.log.abort()  # the error line must not share the progress bar's line
        raise
    finally:
        shutdown()


@record
def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if os.environ.get("PTD_WORKER_DIES_WITH_PARENT") == "1":  # forked: launcher.fork_workers
        from ..children import die_with_parent
        die_with_parent()
    if len(args) != 1:
        print("usage: python -m ptd.runtime.worker CONFIG.toml", file=sys.stderr)
        return 2
    run(load_config(args[0]))
    # A run stopped on purpose (non-finite loss) is not a failure torchrun should restart
    # from the same data into the same NaN: its status is in summary.json, which ptd train
    # reads to set its own exit code.
    return 0


if __name__ == "__main__":
    code = main()
    # Leave without running C++ static destructors: after a torch.profiler window, one run
    # in a few aborted at interpreter exit ("terminate called without an active exception",
    # a profiler thread still joinable; torch 2.13, CPU), after everything was written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

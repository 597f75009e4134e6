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
from .corpus import Sources, open_stream
from .data import DataLoader, eval_batches
from .fault import FaultInjector
from .mesh import ParallelDims, init_distributed, shutdown
from .metrics import RunLog
from .model import build_model
from .optim import build_optimizer
from .parallel import parallelize, unwrap
from .precision import Precision
from .recovery import Recovery
from .step import AccumulationRunner
from .trainer import Trainer


def dump_params(model: torch.nn.Module, path: Path, dims: ParallelDims) -> None:
    """Full (unsharded) state dict on rank 0; a collective: every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dims.is_main:
        torch.save({k: v.detach().clone() for k, v in sd.items()}, path)


def build_trainer(cfg: TrainConfig, dims: ParallelDims) -> Trainer:
    plan = cfg.plan
    torch.manual_seed(cfg.seed * 100_003 + dims.rank)  # dropout streams differ per rank
    model = parallelize(build_model(cfg.model), plan, dims, seed=cfg.seed, compile=cfg.compile)
    optimizer = build_optimizer(model, cfg.optim, zero=plan.zero, dp_group=dims.group("dp"))
    precision = Precision(plan.dtype, dims.device, fsdp=plan.zero >= 2, group=dims.group("dp"))
    train, val = open_stream(Sources.resolve(cfg.data)).split(cfg.data.val_fraction)
    common = dict(seq_len=plan.seq_len, global_batch=plan.global_batch, micro_batch=plan.micro_batch,
                  dp_rank=dims.dp_rank, dp_size=dims.dp_size, device=dims.device)
    loader = DataLoader(train, seed=cfg.seed, **common)
    val_batches = eval_batches(val, **common) if cfg.eval_every else []
    log = RunLog(cfg.out, cfg.steps, enabled=dims.is_main)
    return Trainer(cfg, dims, model, AccumulationRunner(model, precision), optimizer, precision,
                   loader, log, val_batches, FaultInjector(dims.rank))


def run(cfg: TrainConfig) -> dict[str, Any]:
    """Train ``cfg`` in this process (one rank of the world torchrun set up, or alone)."""
    start = time.perf_counter()
    torch.set_num_threads(cfg.threads)
    dims = init_distributed(cfg.plan, cfg.timeout_s)
    try:
        cfg.validate(dims.world_size)
        trainer = build_trainer(cfg, dims)
        recovery = Recovery.start(cfg, dims, trainer)  # resume / init_from, checkpoints, timeouts
        dump = os.environ.get("PTD_DUMP_PARAMS") == "1"
        if dump:
            dump_params(trainer.model, Path(cfg.out) / "params_init.pt", dims)
        summary = trainer.train()
        recovery.close()
        if dump:
            dump_params(trainer.model, Path(cfg.out) / "params_final.pt", dims)
        inner = unwrap(trainer.model)
        summary.update(
            wall_time_s=time.perf_counter() - start, world_size=dims.world_size,
            plan=cfg.plan.to_dict(), plan_desc=cfg.plan.describe(), model=cfg.model.name,
            param_count=cfg.model.param_count(), device=str(dims.device), dtype=cfg.plan.dtype,
            torch=torch.__version__, runtime_params=sum(p.numel() for p in inner.parameters()))
        trainer.log.finish(summary)
        return summary
    finally:
        shutdown()


@record
def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m ptd.runtime.worker CONFIG.toml", file=sys.stderr)
        return 2
    run(load_config(args[0]))
    # A run stopped on purpose (non-finite loss) is not a failure torchrun should restart
    # from the same data into the same NaN: its status is in summary.json, which ptd train
    # reads to set its own exit code.
    return 0


if __name__ == "__main__":
    sys.exit(main())

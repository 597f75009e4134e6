"""What goes into a checkpoint's tensors, and back.

One state dict, keyed by the *whole model's* fully-qualified parameter names:

* ``model.<fqn>``: parameters, from :func:`get_state_dict` -- plain tensors under DDP,
  ``DTensor`` shards under FSDP (ZeRO-1/2/3) and tensor parallelism;
  a pipeline stage holds a subset of the names;
* ``optim.state.<fqn>.{step,exp_avg,exp_avg_sq}`` and ``optim.param_groups.<fqn>.<hp>``:
  the optimizer, *flattened* per parameter (``flatten_optimizer_state_dict``), so that a
  rank loads exactly the parameters it owns under the new layout;
* ``rng.rank<r>.cpu`` (``.cuda``): each rank's random-number generator state.

``torch.distributed.checkpoint`` stores each tensor once with its global shape and reads
back whatever slices the loading ranks ask for, so a checkpoint written under one layout
loads under any other.

Every ZeRO stage is FSDP2's (:mod:`ptd.runtime.parallel.fsdp`): a rank's AdamW states are
``DTensor`` shards of its parameters' shards, so ZeRO-1/2 checkpoints reshard to and from
any layout as ZeRO-3's do.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict,
                                                     set_state_dict)
from torch.distributed.tensor import DTensor

from ..model.transformer import tied_copy

OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def as_list(x: Any) -> list[Any]:
    return list(x) if isinstance(x, (list, tuple)) else [x]


class TrainState:
    """The model and optimizer of a run, as one checkpointable state dict.

    ``model`` and ``optimizer`` may be lists (one per pipeline stage / model chunk held by
    this rank; their names are the whole model's, so they never collide)."""

    def __init__(self, model: nn.Module | Sequence[nn.Module],
                 optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer]) -> None:
        self.parts = as_list(model)
        self.optims = as_list(optimizer)
        if len(self.optims) != len(self.parts):
            raise ValueError("checkpointing needs one optimizer per model part")

    def _pairs(self) -> list[tuple[nn.Module, torch.optim.Optimizer]]:
        return list(zip(self.parts, self.optims))

    def state_dicts(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """``(model_sd, optim_sd)`` per part. On a fresh optimizer the states are created by
        a step with zero gradients and learning rate 0 (parameters unchanged).

        A tied embedding's copy on a pipeline's last stage (:func:`tied_copy`) keeps its
        AdamW states under the embedding's name, as a run without the copy has them (the
        optimizer holds a tied matrix once, named ``tok_embeddings.weight``): equal on
        both copies, written once, and read by either layout."""
        return [(msd, {_alias(k, part): v for k, v in osd.items()})
                for part, (msd, osd) in zip(self.parts, (get_state_dict(part, opt, options=OPTIONS)
                                                         for part, opt in self._pairs()))]

    def state_dict(self) -> dict[str, Any]:
        model, optim = {}, {}
        for msd, osd in self.state_dicts():
            model.update(msd)
            optim.update(osd)
        return {"model": model, "optim": optim}

    def load(self, loaded: dict[str, Any], parts: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
        """Install a state dict that ``dcp.load`` filled in place; ``parts`` is what
        :meth:`state_dicts` returned before the load (its keys say which part owns what).
        Optimizer hyperparameters stay those of the run's config."""
        for (part, opt), (msd, osd) in zip(self._pairs(), parts):
            keep = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
            names = get_state_dict(part, opt, options=OPTIONS)[1]  # the optimizer's own keys
            set_state_dict(part, opt,
                           model_state_dict={k: loaded["model"][k] for k in msd},
                           optim_state_dict={k: loaded["optim"][_alias(k, part)] for k in names},
                           options=OPTIONS)
            for group, hp in zip(opt.param_groups, keep):
                group.update(hp)


def _alias(key: str, part: nn.Module) -> str:
    """An optimizer key of ``part`` under the name a checkpoint stores it by: the tied
    embedding copy's (``state.output.weight.*``, ``param_groups.output.weight.*``) under the
    embedding's; every other key as it is."""
    for section in ("state.", "param_groups."):
        if key.startswith(section + "output.weight.") and tied_copy(part) is not None:
            return section + "tok_embeddings.weight." + key[len(section + "output.weight."):]
    return key


# ------------------------------------------------------------------ RNG
def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    out = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        out["cuda"] = torch.cuda.get_rng_state(device)
    return out


def set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def rng_template(device: torch.device) -> dict[str, torch.Tensor]:
    return {k: torch.empty_like(v) for k, v in rng_state(device).items()}


# ------------------------------------------------------------------ poison check
def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def first_nonfinite(sd: dict[str, Any], prefix: str = "") -> str | None:
    """The name of the first floating-point tensor in ``sd`` (nested) with a NaN or an
    infinity in this rank's part, else ``None``."""
    for k, v in sd.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            bad = first_nonfinite(v, name + ".")
            if bad:
                return bad
        elif isinstance(v, torch.Tensor):
            t = _local(v)
            if t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all()):
                return name
    return None


def nonfinite_anywhere(sd: dict[str, Any], rank: int, group: dist.ProcessGroup | None,
                       device: torch.device) -> str | None:
    """:func:`first_nonfinite` agreed over ``group``: every rank gets the same answer,
    ``"<name> on rank <r>"`` for the lowest rank that found one."""
    bad = first_nonfinite(sd)
    world = dist.get_world_size(group)
    if world == 1:
        return bad
    flag = torch.tensor([rank if bad else world], dtype=torch.int64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    first = int(flag)
    if first == world:
        return None
    names: list[Any] = [None] * world
    dist.all_gather_object(names, bad, group=group)
    return f"{names[first]} on rank {first}"

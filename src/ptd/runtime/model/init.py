"""Materialise a meta-device model and initialise it *independently of the layout*.

Every parameter is drawn from its own generator, seeded by ``(seed, parameter name)``, as
the full tensor; each rank then keeps its own shard of it. So one seed gives bit-identical
weights whether the run is one process, DDP, FSDP shards, tensor-parallel shards or
pipeline stages (a stage holds a subset of the names; the names do not change). That is
what lets a sharded run be compared with a single process exactly.

The price: each rank generates each full tensor once, one at a time, on the CPU. For the
largest matrices of a 100B-class model that is seconds per matrix and a few GB of
transient memory -- never the whole model.
"""

from __future__ import annotations

import hashlib
import math
from typing import Sequence

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from .layers import RMSNorm
from .transformer import fit_vocab_rows, is_vocab_tensor, tied_copy

# Wrappers that prefix parameter names; stripped so the seed sees the model's own names.
_WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")


def canonical_name(fqn: str) -> str:
    """``layers.0.attention.wq.weight`` whatever DDP/compile/checkpoint wrappers added."""
    parts = [p for p in fqn.split(".") if p + "." not in _WRAPPER_PREFIXES]
    return ".".join(parts)


def param_seed(seed: int, fqn: str) -> int:
    """A 63-bit generator seed from the run seed and a parameter's canonical name."""
    digest = hashlib.sha256(f"{seed}:{canonical_name(fqn)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _is_residual_out(fqn: str) -> bool:
    # Projections that write into the residual stream: scaled by 1/sqrt(2L) (GPT-2) so the
    # residual's variance does not grow with depth.
    return (fqn.endswith("attention.wo.weight") or fqn.endswith(".w2.weight")
            or fqn.endswith("experts.w2"))  # stacked expert weights (runtime.moe)


def _full_value(fqn: str, param: torch.Tensor, kind: str, std: float, seed: int,
                vocab: int) -> torch.Tensor:
    shape = tuple(param.shape)  # the global shape, also for a DTensor
    if kind == "ones":
        return torch.ones(shape)
    if kind == "zeros":
        return torch.zeros(shape)
    g = torch.Generator(device="cpu").manual_seed(param_seed(seed, fqn))
    if is_vocab_tensor(fqn):
        # the real rows are drawn alike at every padding (tp), the padding rows are zero
        return fit_vocab_rows(torch.normal(0.0, std, (vocab, *shape[1:]), generator=g), shape[0], vocab)
    return torch.normal(0.0, std, shape, generator=g)


def assign_full(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy ``full`` (or this rank's shard of it) into ``param``."""
    if isinstance(param, DTensor):
        # src_data_rank=None: every rank slices its own shard locally, no communication.
        shard = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
        param.to_local().copy_(shard.to_local())
    else:
        param.copy_(full)


def init_plan(model: nn.Module) -> list[tuple[str, nn.Parameter, str]]:
    """``(name, parameter, kind)`` for every distinct parameter; kind is ``normal``,
    ``normal_residual``, ``ones`` or ``zeros``. Tied parameters appear once; a tied output
    layer held apart from its embedding (:func:`tied_copy`) goes by the embedding's name,
    so that it starts equal to it."""
    out: list[tuple[str, nn.Parameter, str]] = []
    copy = tied_copy(model)
    seen: set[int] = set()
    for mname, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            fqn = f"{mname}.{pname}" if mname else pname
            if isinstance(module, (RMSNorm, nn.LayerNorm)):
                kind = "ones" if pname == "weight" else "zeros"
            elif pname == "bias" or pname.endswith("_bias"):  # (stacked expert biases)
                kind = "zeros"
            else:
                kind = "normal_residual" if _is_residual_out(fqn) else "normal"
            out.append(("tok_embeddings.weight" if p is copy else canonical_name(fqn), p, kind))
    return out


@torch.no_grad()
def init_weights(model: nn.Module, seed: int, init_std: float, n_layers: int, vocab: int) -> None:
    """Initialise every parameter from ``(seed, name)`` (see the module docstring)."""
    residual_std = init_std / math.sqrt(2 * n_layers)
    for fqn, p, kind in init_plan(model):
        std = residual_std if kind == "normal_residual" else init_std
        full = _full_value(fqn, p, kind.removesuffix("_residual"), std, seed, vocab)
        assign_full(p, full.to(device=p.device, dtype=p.dtype))


def materialize(model: nn.Module, device: torch.device | str, seed: int,
                roots: Sequence[nn.Module] = ()) -> nn.Module:
    """Allocate a (possibly sharded) meta model on ``device`` and initialise it.

    Works before or after FSDP's ``fully_shard`` (which shards meta parameters in place),
    so no rank ever holds more than its shard plus one full tensor in flight. ``roots``:
    FSDP roots outside ``model``'s module tree that share its modules (pipeline stage
    views); they are re-registered on the new storage too."""
    model.to_empty(device=device)
    for root in roots:
        if root is not model:
            root.to_empty(device=device)  # FSDP re-reads the sharded parameters it manages
    inner = _unwrap(model)
    inner.tie_weights()
    inner.init_buffers()
    spec = inner.spec
    init_weights(model, seed, spec.init_std, spec.n_layers, spec.vocab_size)
    return model


def _unwrap(model: nn.Module) -> nn.Module:
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    return model

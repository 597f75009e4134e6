"""Count the dispatcher operators the runtime model really runs (what ``ptd.cost.compute``'s
``OPS_*`` constants price at ``op_overhead`` each on a CPU).

A ``TorchDispatchMode`` counts every operator call that reaches the dispatcher -- views and
metadata-only ops included, since on a CPU their dispatch is what they cost -- for one
block's forward and backward, the output layer with the loss, and one AdamW step per
parameter tensor. ``tests/test_cost_vs_runtime.py`` checks the constants against it.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_iter

from ...specs import ModelSpec


class OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def count_ops(spec: ModelSpec, seq_len: int = 32, batch: int = 2) -> dict[str, int]:
    """Operators of one block forward/backward, the output layer + loss forward/backward,
    and one AdamW step (``foreach=False``, as ptd's single-tensor path) per tensor."""
    from ..model.init import materialize
    from ..model.transformer import build_model
    model = build_model(spec, "meta")
    materialize(model, torch.device("cpu"), seed=0)
    out = _block_and_output(model, spec, seq_len, batch, OpCounter, "total")
    p = torch.nn.Parameter(torch.randn(8, 8))
    opt = torch.optim.AdamW([p], lr=1e-3)
    p.grad = torch.randn(8, 8)
    opt.step()  # first step creates the states
    with OpCounter() as c:
        opt.step()
    out["adamw_per_tensor"] = c.total
    return out


def _block_and_output(model: torch.nn.Module, spec: ModelSpec, seq_len: int, batch: int,
                      counter: type, read: str, loss_ctx: Any = contextlib.nullcontext,
                      grad: Any = torch.randn_like) -> dict[str, int]:
    """Operators of block 0's forward and backward and of the output layer + loss forward and
    backward, each read from a fresh ``counter()`` as its attribute ``read``; the loss runs
    under ``loss_ctx()`` (``loss_parallel`` for vocabulary-sharded logits)."""
    from ..model.transformer import lm_loss_sum
    rope = (model.rope_cos, model.rope_sin) if model.rope_cos is not None else None
    x = torch.randn(batch, seq_len, spec.hidden, requires_grad=True)
    out: dict[str, int] = {}
    with counter() as c:
        y = model.layers["0"](x, rope)
    out["block_fwd"] = getattr(c, read)
    g = grad(y)
    with counter() as c:
        y.backward(g)
    out["block_bwd"] = getattr(c, read)
    h = torch.randn(batch, seq_len, spec.hidden, requires_grad=True)
    t = torch.randint(0, spec.vocab_size, (batch, seq_len))
    with loss_ctx(), counter() as c:
        loss = lm_loss_sum(model.output(model.norm(h)), t)
    out["output_fwd"] = getattr(c, read)
    with loss_ctx(), counter() as c:
        loss.backward()
    out["output_bwd"] = getattr(c, read)
    return out


class DTensorOpCounter(TorchDispatchMode):
    """Counts operators called on ``DTensor`` arguments (a dispatch mode runs before the
    subclass, so it sees the DTensor-level call once; the local ops beneath are not seen)."""

    def __init__(self) -> None:
        super().__init__()
        self.dtensor = 0
        self.plain = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        from torch.distributed.tensor import DTensor
        if any(isinstance(a, DTensor) for a in tree_iter((args, kwargs or {}))):
            self.dtensor += 1
        else:
            self.plain += 1
        return func(*args, **(kwargs or {}))


def count_tp_ops(spec: ModelSpec, sp: bool = False, seq_len: int = 32, batch: int = 2
                 ) -> dict[str, int]:
    """Operators on DTensors in one tensor-parallel block's forward and backward and in the
    output layer + loss, on a one-rank tp mesh (the counts do not depend on the degree).
    Needs an initialised process group (a world of one will do)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel
    from ...specs import ParallelPlan
    from ..model.init import materialize
    from ..model.transformer import build_model
    from ..parallel.tp import apply_tp
    model = build_model(spec, "meta")
    mesh = init_device_mesh("cpu", (1,))
    apply_tp(model, mesh, ParallelPlan(tp=1, sp=sp, seq_len=seq_len))
    materialize(model, torch.device("cpu"), seed=0)
    return _block_and_output(model, spec, seq_len, batch, DTensorOpCounter, "dtensor",
                             loss_ctx=loss_parallel, grad=torch.ones_like)

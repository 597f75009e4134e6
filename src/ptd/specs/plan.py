"""ParallelPlan: how one training step is split over devices.

A step processes ``global_batch`` sequences of ``seq_len`` tokens. The devices form a
``pp x dp x tp`` grid (see :mod:`ptd.specs.layout` for which rank sits where). Each
data-parallel replica runs ``n_microbatches = global_batch / (micro_batch * dp)``
micro-batches per step: gradient-accumulation steps without pipelining, pipeline
micro-batches with it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import PtdError
from .model import ModelSpec

Recompute = Literal["none", "selective", "full"]
Schedule = Literal["gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"]
Dtype = Literal["fp32", "bf16", "fp16"]
GradCompression = Literal["none", "fp16", "powersgd"]
TPMode = Literal["1d", "2d"]

RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")
TRAIN_DTYPES = ("fp32", "bf16", "fp16")
GRAD_COMPRESSION = ("none", "fp16", "powersgd")
TP_MODES = ("1d", "2d")


@dataclass(frozen=True)
class ParallelPlan:
    """Degrees of parallelism and the shape of one optimizer step."""

    dp: int = 1
    """Data-parallel replicas (the ZeRO sharding group when ``zero > 0``)."""
    tp: int = 1
    """Tensor-parallel degree (Megatron 1-D: heads and MLP columns split)."""
    pp: int = 1
    """Pipeline-parallel stages (ranks along the pipeline)."""
    cp: int = 1
    """Context-parallel degree: each sequence is cut into ``2*cp`` chunks and rank ``i`` of
    the cp group holds chunks ``i`` and ``2*cp-1-i`` (zig-zag, balanced causal work);
    attention gathers K/V over the group (:mod:`ptd.runtime.parallel.cp`)."""
    vpp: int = 1
    """Virtual stages per pipeline rank (model chunks); >1 means interleaved 1F1B."""
    zero: int = 0
    """0: DDP; 1: optimizer states sharded; 2: + gradients; 3: + parameters (FSDP)."""
    sp: bool = False
    """Sequence parallel: norms/dropout sharded along the sequence over the tp group."""
    micro_batch: int = 1
    """Sequences per micro-batch per data-parallel replica."""
    global_batch: int = 8
    """Sequences per optimizer step, over all replicas."""
    seq_len: int = 128
    """Tokens per sequence."""
    recompute: Recompute = "none"
    """Activation checkpointing: none, selective (attention core) or full (whole block)."""
    schedule: Schedule = "1f1b"
    """Pipeline schedule; ignored when ``pp == 1``."""
    dtype: Dtype = "fp32"
    """Compute dtype; bf16/fp16 keep fp32 master weights and optimizer states."""
    offload: bool = False
    """Parameters, gradients and optimizer states kept in host memory, the optimizer step
    run there (FSDP CPU offload; ZeRO-3 only)."""
    grad_compression: GradCompression = "none"
    """DDP gradient-communication hook: none, fp16 (halves bytes), powersgd (low rank)."""
    uneven_stages: bool = False
    """Allow a layer count not divisible by ``pp * vpp``: stages then get the cost-balanced
    split of :func:`ptd.specs.stages.stage_split` (Llama 3 405B ran 126 layers on 16 stages,
    the first and last one layer short)."""
    ep: int = 1
    """Expert-parallel degree (MoE): the routed experts split over ``ep`` consecutive
    data-parallel ranks; must divide ``dp`` and the expert count (docs/moe.md)."""
    tp_mode: TPMode = "1d"
    """How the ``tp`` ranks split the layers: ``1d`` (Megatron: heads and MLP columns) or
    ``2d`` (Optimus/SUMMA on a ``q x q`` mesh, ``tp = q^2``: weights in ``q x q`` blocks,
    activations split batch over mesh rows and hidden over columns;
    :mod:`ptd.runtime.parallel.tp2d`)."""

    # ----------------------------------------------------------- derived
    @property
    def tp_split(self) -> int:
        """Into how many slices tensor parallelism cuts the heads, the MLP columns and the
        vocabulary (padded to a multiple of it): ``tp`` for 1d, the mesh side ``q`` for 2d."""
        if self.tp_mode != "2d":
            return self.tp
        q = math.isqrt(self.tp)
        return q if q * q == self.tp else self.tp

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    @property
    def n_microbatches(self) -> int:
        """Micro-batches per replica per step (accumulation steps, or pipeline micro-batches)."""
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def stages_per_rank(self) -> int:
        """Model chunks each pipeline rank holds: ``vpp``; the zero-bubble schedule places
        two chunks per rank in a V (ZB-V) unless more are asked for."""
        if self.pp > 1 and self.schedule == "zero-bubble":
            return max(2, self.vpp)
        return self.vpp

    @property
    def n_stages(self) -> int:
        return self.pp * self.stages_per_rank

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    def replace(self, **changes: Any) -> "ParallelPlan":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """Short human form, e.g. ``dp2 tp2 pp2 zero1 sp mb1 gb16 1f1b``."""
        parts = [f"dp{self.dp}", f"tp{self.tp}", f"pp{self.pp}"]
        if self.tp_mode != "1d":
            parts.insert(2, f"tp-{self.tp_mode}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.vpp > 1:
            parts.append(f"vpp{self.vpp}")
        parts.append(f"zero{self.zero}")
        if self.sp:
            parts.append("sp")
        parts += [f"mb{self.micro_batch}", f"gb{self.global_batch}"]
        if self.recompute != "none":
            parts.append(f"rc-{self.recompute}")
        if self.pp > 1:
            parts.append(self.schedule)
        if self.offload:
            parts.append("offload")
        if self.uneven_stages:
            parts.append("uneven")
        return " ".join(parts)

    # --------------------------------------------------------- validation
    def validate(self, model: ModelSpec | None = None, world_size: int | None = None) -> None:
        """Raise :class:`PtdError` with the first reason this plan cannot run."""
        for f in ("dp", "tp", "pp", "ep", "cp", "vpp", "micro_batch", "global_batch", "seq_len"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise PtdError(f"{f} must be a positive integer, got {v!r}")
        if self.zero not in (0, 1, 2, 3):
            raise PtdError(f"zero must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.recompute not in RECOMPUTE:
            raise PtdError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        if self.schedule not in SCHEDULES:
            raise PtdError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.dtype not in TRAIN_DTYPES:
            raise PtdError(f"dtype must be one of {', '.join(TRAIN_DTYPES)}, got {self.dtype!r}")
        if self.grad_compression not in GRAD_COMPRESSION:
            raise PtdError(f"grad_compression must be one of {', '.join(GRAD_COMPRESSION)}, "
                           f"got {self.grad_compression!r}")
        if self.tp_mode not in TP_MODES:
            raise PtdError(f"tp_mode must be one of {', '.join(TP_MODES)}, got {self.tp_mode!r}")
        if self.tp_mode == "2d":
            q = math.isqrt(self.tp)
            if q * q != self.tp or q < 2:
                raise PtdError(f"--tp-mode 2d needs tp = q*q with q >= 2 (4, 9, 16, ...), got tp {self.tp}")
            if self.micro_batch % q:
                raise PtdError(f"--tp-mode 2d splits each micro-batch over the {q} mesh rows: "
                               f"micro_batch {self.micro_batch} is not divisible by q = {q}")
        if world_size is not None and self.world_size != world_size:
            cp = ("*cp", f"*{self.cp}") if self.cp > 1 else ("", "")
            raise PtdError(f"dp*tp*pp{cp[0]} = {self.dp}*{self.tp}*{self.pp}{cp[1]} = {self.world_size} "
                           f"does not equal the world size {world_size}")
        if self.dp % self.ep:
            raise PtdError(f"ep {self.ep} does not divide dp {self.dp} (expert parallelism is "
                           f"carved out of data parallelism)")
        if self.global_batch % (self.micro_batch * self.dp):
            raise PtdError(f"global batch {self.global_batch} is not divisible by "
                           f"micro-batch*dp = {self.micro_batch}*{self.dp}")
        if self.sp and self.tp == 1:
            raise PtdError("sequence parallel needs tp > 1")
        if self.sp and self.seq_len % (self.tp * self.cp):
            what = f"tp*cp = {self.tp}*{self.cp}" if self.cp > 1 else f"tp ({self.tp})"
            raise PtdError(f"sequence parallel needs seq_len ({self.seq_len}) divisible by {what} "
                           f"(each rank's share of the sequence)")
        if self.cp > 1 and self.seq_len % (2 * self.cp):
            raise PtdError(f"context parallel cp {self.cp} needs seq_len ({self.seq_len}) divisible by "
                           f"2*cp = {2 * self.cp} (zig-zag: every sequence is cut into 2*cp chunks)")
        if self.pp == 1 and self.vpp > 1:
            raise PtdError("vpp > 1 (virtual pipeline stages) needs pp > 1")
        if self.pp > 1:
            if self.schedule == "interleaved-1f1b" and self.vpp == 1:
                raise PtdError("interleaved-1f1b needs vpp > 1; use 1f1b for one stage per rank")
            if self.schedule in ("gpipe", "1f1b") and self.vpp > 1:
                raise PtdError(f"{self.schedule} runs one stage per rank; vpp {self.vpp} needs "
                               f"interleaved-1f1b or zero-bubble")
            if self.schedule != "gpipe" and self.n_microbatches < self.pp:
                raise PtdError(f"{self.schedule} needs at least pp = {self.pp} micro-batches per "
                               f"step, got global_batch/(micro_batch*dp) = {self.n_microbatches}")
        if self.grad_compression != "none" and self.zero != 0:
            raise PtdError("gradient compression hooks apply to DDP only (zero 0)")
        if self.offload and self.zero < 3:
            raise PtdError("offload needs zero 3 (it uses FSDP's CPU offload)")
        if model is not None:
            self._validate_against(model)

    def _validate_against(self, m: ModelSpec) -> None:
        t = self.tp_split  # 2d: heads and ffn columns are split over the q mesh columns
        if self.tp_mode == "2d" and m.hidden % t:
            raise PtdError(f"{m.name}: hidden {m.hidden} is not divisible by q = {t} (--tp-mode 2d)")
        tn = f"q = {t} (--tp-mode 2d)" if self.tp_mode == "2d" else f"tp {t}"
        if m.n_heads % t:
            raise PtdError(f"{m.name}: {m.n_heads} attention heads are not divisible by {tn}")
        if m.n_kv_heads % t:
            raise PtdError(f"{m.name}: {m.n_kv_heads} key/value heads are not divisible by {tn}")
        if m.ffn_hidden % t:
            raise PtdError(f"{m.name}: ffn_hidden {m.ffn_hidden} is not divisible by {tn}")
        if self.ep > 1 and not m.is_moe:
            raise PtdError(f"{m.name}: ep {self.ep} needs a mixture-of-experts model (it has no experts)")
        if m.n_experts % self.ep:
            raise PtdError(f"{m.name}: {m.n_experts} experts are not divisible by ep {self.ep}")
        what = f"pp*vpp = {self.pp}*{self.stages_per_rank}" if self.stages_per_rank > 1 else f"pp = {self.pp}"
        if m.n_layers < self.n_stages:
            raise PtdError(f"{m.name}: {m.n_layers} layers cannot fill {what} stages")
        if m.n_layers % self.n_stages and not self.uneven_stages:
            raise PtdError(f"{m.name}: {m.n_layers} layers are not divisible by {what} "
                           f"(allow uneven stages to split them by cost)")
        if self.seq_len > m.max_seq_len:
            raise PtdError(f"seq_len {self.seq_len} exceeds {m.name}'s max_seq_len {m.max_seq_len}")


def plan_from_dict(d: dict[str, Any]) -> ParallelPlan:
    known = {f.name for f in dataclasses.fields(ParallelPlan)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise PtdError(f"unknown plan field(s) {', '.join(unknown)}")
    return ParallelPlan(**d)

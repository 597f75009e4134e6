"""Which parameters live on which rank: shapes, tensor-parallel splits, pipeline stages.

The runtime model allocates exactly these tensors (a test compares them), so the model-state
memory predicted from here is the memory measured, byte for byte:

* tensor parallel (Megatron 1-D): Q/K/V and MLP up/gate matrices are split along their
  output dimension (column parallel), the attention output and MLP down matrices along
  their input dimension (row parallel), the embedding and the output layer along the
  vocabulary (padded to a multiple of ``vocab_multiple x tp`` first, as the runtime does);
  norms, position tables and row-parallel biases are replicated;
* pipeline parallel: :func:`stage_split` assigns contiguous blocks of layers to ``pp * v``
  stages, balancing forward+backward FLOPs with the output layer counted; the first stage
  holds the embeddings, the last the final norm and output layer (a tied output layer is a
  second copy on the last stage when they differ, as Megatron does);
* ZeRO-1/2/3 (FSDP2) shard each tensor's dim 0 into ``dp`` chunks (``torch.chunk`` sizes);
  with expert parallelism the routed experts are first split over ep (``E / ep`` on each
  rank) and then sharded over the ``dp / ep`` ranks holding the same experts (edp; a rank's
  index there is ``dp_rank // ep``, :mod:`ptd.runtime.parallel.ep`) -- by experts when
  ``E / ep`` divides by edp, else evenly by dim 1 (:func:`expert_shard_dim`) -- every other
  tensor over dp as without ep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from . import moe as moe_cost
from ..specs.model import ModelSpec
from ..specs.plan import ParallelPlan
from .memo import memo
from ..specs.stages import is_v_shape, stage_split, stage_to_rank


@dataclass(frozen=True)
class Param:
    """One parameter tensor of the model as a whole (before any sharding)."""

    name: str
    shape: tuple[int, ...]
    tp_dim: int | None
    """Dimension split over the tp group (None: replicated on every tp rank)."""
    decay: bool
    """In the weight-decay parameter group (matrices of the blocks and output layer)."""
    pad: int = 0
    """Vocabulary tensors: dim 0 is padded to a multiple of ``pad x tp`` before the split
    (:meth:`ptd.specs.ModelSpec.padded_vocab`); 0 for every other tensor."""

    def local_shape(self, tp: int, mode: str = "1d") -> tuple[int, ...]:
        """This tensor on one tp rank. ``mode`` "2d" (``runtime/parallel/tp2d.py``, tp = q^2):
        the vocabulary padded per mesh side ``q``; matrices and the token embedding in
        ``q x q`` blocks; vectors (norms, biases) and the learned position table's hidden
        dimension split over the ``q`` mesh columns, replicated over the rows."""
        s = list(self.shape)
        q = math.isqrt(tp) if mode == "2d" else tp
        if self.pad:
            s[0] = -(-s[0] // (self.pad * q)) * self.pad * q
        if mode == "2d":
            if len(s) == 1 or self.name == "pos_embeddings.weight":
                s[-1] //= q
            else:
                s[0], s[1] = s[0] // q, s[1] // q
        elif self.tp_dim is not None:
            s[self.tp_dim] //= tp
        return tuple(s)


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


@memo
def layer_params(model: ModelSpec) -> tuple[Param, ...]:
    """The tensors of one transformer block, in the runtime's registration order."""
    h, q, kv = model.hidden, model.q_dim, model.kv_dim
    ln = model.norm == "layernorm"
    out: list[Param] = [Param("attention_norm.weight", (h,), None, False)]
    if ln:
        out.append(Param("attention_norm.bias", (h,), None, False))
    out += [Param("attention.wq.weight", (q, h), 0, True),
            Param("attention.wk.weight", (kv, h), 0, True),
            Param("attention.wv.weight", (kv, h), 0, True),
            Param("attention.wo.weight", (h, q), 1, True)]
    if model.bias:
        out += [Param("attention.wq.bias", (q,), 0, False),
                Param("attention.wk.bias", (kv,), 0, False),
                Param("attention.wv.bias", (kv,), 0, False),
                Param("attention.wo.bias", (h,), None, False)]
    out.append(Param("ffn_norm.weight", (h,), None, False))
    if ln:
        out.append(Param("ffn_norm.bias", (h,), None, False))
    if model.is_moe:
        out += _moe_params(model)
    else:
        out += _mlp_params(model, "feed_forward.")
    return tuple(out)


def _mlp_params(model: ModelSpec, prefix: str) -> list[Param]:
    h, f = model.hidden, model.ffn_hidden
    names = ("w1", "w3", "w2") if model.mlp == "swiglu" else ("w1", "w2")
    out = [Param(f"{prefix}{n}.weight", (h, f) if n == "w2" else (f, h), 1 if n == "w2" else 0, True)
           for n in names]
    if model.bias:
        out += [Param(f"{prefix}{n}.bias", (h if n == "w2" else f,), None if n == "w2" else 0, False)
                for n in names]
    return out


def _moe_params(model: ModelSpec) -> list[Param]:
    """Router, stacked routed experts ``(E, in, out)`` (runtime.moe.GroupedExperts; not split
    by tp: replicated over it, split over ep by dim 0), then the shared experts' MLPs."""
    h, f, e = model.hidden, model.ffn_hidden, model.n_experts
    names = ("w1", "w2", "w3") if model.mlp == "swiglu" else ("w1", "w2")
    out = [Param("feed_forward.router.weight", (e, h), None, True)]
    out += [Param(f"feed_forward.experts.{n}", (e, f, h) if n == "w2" else (e, h, f), None, True)
            for n in names]
    if model.bias:
        out += [Param(f"feed_forward.experts.{n}_bias", (e, h if n == "w2" else f), None, False)
                for n in names]
    for i in range(model.n_shared_experts):
        out += _mlp_params(model, f"feed_forward.shared.{i}.")
    return out


@memo
def first_stage_params(model: ModelSpec) -> tuple[Param, ...]:
    """Embeddings (on the first pipeline stage)."""
    out = [Param("tok_embeddings.weight", (model.vocab_size, model.hidden), 0, False,
                 model.vocab_multiple)]
    if model.position == "learned":
        out.append(Param("pos_embeddings.weight", (model.max_seq_len, model.hidden), None, False))
    return tuple(out)


@memo
def last_stage_params(model: ModelSpec, separate_output: bool) -> tuple[Param, ...]:
    """Final norm and output layer (on the last stage). ``separate_output``: the output
    matrix is a tensor of its own (untied, or tied but on another stage than the embedding)."""
    out = [Param("norm.weight", (model.hidden,), None, False)]
    if model.norm == "layernorm":
        out.append(Param("norm.bias", (model.hidden,), None, False))
    if separate_output:
        out.append(Param("output.weight", (model.vocab_size, model.hidden), 0, True,
                         model.vocab_multiple))
    return tuple(out)


# ------------------------------------------------------------------ pipeline
def layout_key(plan: ParallelPlan) -> tuple[int, int, bool, int, bool]:
    """The fields that decide which layers sit on which pipeline rank."""
    return (plan.pp, plan.n_stages, is_v_shape(plan), plan.seq_len, plan.uneven_stages)


def layout_plan(key: tuple[int, int, bool, int, bool], **fields: int) -> ParallelPlan:
    """A plan whose :func:`layout_key` is ``key`` (and with ``fields``): stand-in for every
    plan with that layout, for results that depend on nothing else."""
    pp, n_stages, v_shape, seq_len, balanced = key
    if v_shape:
        sched, vpp = "zero-bubble", 1
    else:
        vpp = n_stages // pp
        sched = "interleaved-1f1b" if vpp > 1 else "1f1b"
    plan = ParallelPlan(pp=pp, vpp=vpp, schedule=sched, seq_len=seq_len,  # type: ignore[arg-type]
                        uneven_stages=balanced, **fields)
    assert layout_key(plan) == key
    return plan


@memo
def layout_layers(model: ModelSpec, key: tuple[int, int, bool, int, bool]) -> tuple[int, ...]:
    """Transformer blocks on each pipeline rank, in rank order, of the layout ``key``
    (:func:`layout_key`)."""
    pp, n_stages, v_shape, seq_len, balanced = key
    split = stage_split(model, n_stages, seq_len, balanced)
    per_rank = [0] * pp
    for s, n in enumerate(split):
        r = (s if s < pp else 2 * pp - 1 - s) if v_shape else s % pp
        per_rank[r] += n
    return tuple(per_rank)


def layers_per_rank(model: ModelSpec, plan: ParallelPlan) -> tuple[int, ...]:
    """Transformer blocks held by each pipeline rank of ``plan``, in rank order."""
    return layout_layers(model, layout_key(plan))


@memo
def _widest_plain_rank(model: ModelSpec, key: tuple[int, int, bool, int, bool]) -> int | None:
    first, last = ends_of(key)
    layers = layout_layers(model, key)
    best = None
    for r in range(key[0]):
        if r != first and r != last and (best is None or layers[r] > layers[best]):
            best = r
    return best


def heaviest_rank_candidates(model: ModelSpec, plan: ParallelPlan) -> tuple[int, ...]:
    """In rank order, the pipeline ranks that can be the slowest: the first (embeddings), the
    last (output layer), and the earliest of the others holding the most blocks (the others
    differ only in their block count, so none of them can be slower)."""
    key = layout_key(plan)
    first, last = ends_of(key)
    plain = _widest_plain_rank(model, key)
    return tuple(sorted({first, last} | ({plain} if plain is not None else set())))


def _ends(plan: ParallelPlan) -> tuple[int, int]:
    """Pipeline ranks of the first stage (embeddings) and of the last (output layer)."""
    return stage_to_rank(0, plan), stage_to_rank(plan.n_stages - 1, plan)


def rank_params(model: ModelSpec, plan: ParallelPlan, pp_rank: int) -> list[Param]:
    """Every parameter tensor on pipeline rank ``pp_rank`` (before tp/dp sharding)."""
    first_rank, last_rank = _ends(plan)
    out: list[Param] = []
    if pp_rank == first_rank:
        out += first_stage_params(model)
    out += list(layer_params(model)) * layers_per_rank(model, plan)[pp_rank]
    if pp_rank == last_rank:
        separate = not model.tied_embeddings or first_rank != last_rank
        out += last_stage_params(model, separate)
    return out


@lru_cache(maxsize=4096)
def _numel_of(params: tuple[Param, ...], tp: int, mode: str = "1d") -> int:
    return sum(_numel(p.local_shape(tp, mode)) for p in params)


@memo
def block_numel(model: ModelSpec, tp: int, mode: str = "1d") -> int:
    """Parameters of one block on one tp rank."""
    return _numel_of(layer_params(model), tp, mode)


def local_numel(model: ModelSpec, plan: ParallelPlan, pp_rank: int,
                expert_tp: bool = False) -> int:
    """Parameters on one rank after tensor-parallel and expert-parallel splitting (before any
    ZeRO sharding); ``expert_tp``: routed experts split over tp as well
    (:mod:`ptd.cost.moe`)."""
    n = _local_numels(model, layout_key(plan), plan.tp, plan.tp_mode)[pp_rank]
    missing = moe_cost.ep_missing_numel(model, plan.ep, moe_cost.expert_split(plan.tp, expert_tp))
    return n - missing * layers_per_rank(model, plan)[pp_rank]


def local_expert_numel(model: ModelSpec, plan: ParallelPlan, pp_rank: int,
                       expert_tp: bool = False) -> int:
    """The routed-expert elements among :func:`local_numel`: ``E / ep`` experts per MoE
    block (each ``1 / tp`` of itself under ``expert_tp``)."""
    per_block = moe_cost.routed_expert_numel(model) // (
        plan.ep * moe_cost.expert_split(plan.tp, expert_tp))
    return per_block * layers_per_rank(model, plan)[pp_rank]


def ends_of(key: tuple[int, int, bool, int, bool]) -> tuple[int, int]:
    """:func:`_ends` from a :func:`layout_key` (the first stage is always on rank 0)."""
    pp, n_stages, v_shape = key[:3]
    last = n_stages - 1
    return 0, ((last if last < pp else 2 * pp - 1 - last) if v_shape else last % pp)


@memo
def _local_numels(model: ModelSpec, key: tuple[int, int, bool, int, bool], tp: int,
                  mode: str = "1d") -> tuple[int, ...]:
    """:func:`local_numel` of every pipeline rank (memoised: the planner asks for the same
    layout under many micro-batch, ZeRO and recompute settings)."""
    first_rank, last_rank = ends_of(key)
    layers = layout_layers(model, key)
    out = []
    for r in range(key[0]):
        n = block_numel(model, tp, mode) * layers[r]
        if r == first_rank:
            n += _numel_of(first_stage_params(model), tp, mode)
        if r == last_rank:
            separate = not model.tied_embeddings or first_rank != last_rank
            n += _numel_of(last_stage_params(model, separate), tp, mode)
        out.append(n)
    return tuple(out)


def max_local_numel(model: ModelSpec, plan: ParallelPlan, expert_tp: bool = False) -> int:
    """:func:`local_numel` of the pipeline rank with the most parameters."""
    if plan.ep > 1 or (expert_tp and plan.tp > 1 and model.is_moe):
        return max(local_numel(model, plan, r, expert_tp) for r in range(plan.pp))
    return max(_local_numels(model, layout_key(plan), plan.tp, plan.tp_mode))


ZERO12_UNIT_BYTES = 25 * 1024 * 1024  # ptd.runtime.parallel.fsdp.UNIT_BYTES


def local_block_numel(model: ModelSpec, tp: int, ep: int = 1, expert_tp: bool = False) -> int:
    """Parameters of one block on one rank after tp and ep splitting (its experts ``E / ep``,
    each split over tp under ``expert_tp``): what FSDP gathers for it, its dense part over
    dp and its experts over edp."""
    return block_numel(model, tp) - moe_cost.ep_missing_numel(model, ep, moe_cost.expert_split(tp, expert_tp))


def unit_block_numel(model: ModelSpec, tp: int, ep: int = 1) -> int:
    """Parameters of one block in its dp-sharded FSDP unit: :func:`block_numel`, less the
    routed experts under ep > 1 (there they are FSDP units of their own, over edp)."""
    return block_numel(model, tp) - (moe_cost.routed_expert_numel(model) if ep > 1 else 0)


def zero12_unit_blocks(model: ModelSpec, tp: int, ep: int = 1) -> int:
    """Blocks per FSDP unit under ZeRO-1/2 (``runtime/parallel/fsdp.py``, ``bucket_blocks``):
    consecutive blocks until the unit holds 25 MiB of fp32 parameters (under ep > 1 not
    counting the routed experts, units of their own); a rank's last ``nl % k`` blocks join
    the root's unit (embeddings, final norm, output layer)."""
    return max(1, -(-ZERO12_UNIT_BYTES // (4 * unit_block_numel(model, tp, ep))))


@lru_cache(maxsize=8192)
def _fsdp_numel_of(params: tuple[Param, ...], tp: int, dp: int, dp_rank: int,
                   mode: str = "1d") -> int:
    return fsdp_numel([p.local_shape(tp, mode) for p in params], dp, dp_rank)


def is_routed_expert(p: Param) -> bool:
    """A stacked routed-expert tensor (``feed_forward.experts.*``; not the router, not the
    shared experts): split over ep by dim 0 (``ptd.runtime.parallel.ep.is_expert_param``)."""
    return ".experts." in p.name


@lru_cache(maxsize=8192)
def _block_fsdp_numel(params: tuple[Param, ...], tp: int, dp: int, ep: int, dp_rank: int,
                      mode: str = "1d") -> int:
    """:func:`fsdp_numel` of one block's tensors on ``dp_rank``: with ``ep > 1`` the routed
    experts' ``(E / ep, ...)`` local tensors chunked over edp (``dp / ep`` ranks, this one's
    index ``dp_rank // ep``), the rest over dp."""
    if ep == 1:
        return _fsdp_numel_of(params, tp, dp, dp_rank, mode)
    edp = dp // ep
    dense = tuple(p for p in params if not is_routed_expert(p))
    n = _fsdp_numel_of(dense, tp, dp, dp_rank, mode)
    for p in params:
        if not is_routed_expert(p):
            continue
        local = (p.shape[0] // ep, *p.shape[1:])
        if expert_shard_dim(p.shape, ep, edp) == 1:  # even: dim 1 divides by edp
            n += _numel(local) // edp
        else:
            n += fsdp_numel([local], edp, dp_rank // ep)
    return n


def expert_shard_dim(shape: tuple[int, ...], ep: int, edp: int) -> int:
    """The dimension ZeRO shards a routed-expert tensor of ``shape`` ``(E, ...)`` on over the
    edp ranks (``runtime/parallel/fsdp.py``, ``expert_shard_dim``, the same rule): the
    experts' when a rank's ``E / ep`` divide evenly over edp, else dim 1 if it divides (even
    shards rather than whole experts on some ranks and none on others), else the experts'
    as ``torch.chunk`` splits them."""
    if (shape[0] // ep) % edp and len(shape) > 1 and shape[1] % edp == 0:
        return 1
    return 0


def rank_fsdp_numel(model: ModelSpec, plan: ParallelPlan, pp_rank: int, dp_rank: int) -> int:
    """:func:`fsdp_numel` of :func:`rank_params` on ``pp_rank`` (every tensor is chunked on
    its own, so the sum goes block by block; routed experts under ep: see the module
    docstring)."""
    key = layout_key(plan)
    first_rank, last_rank = ends_of(key)
    tp, dp, mode = plan.tp, plan.dp, plan.tp_mode
    n = (_block_fsdp_numel(layer_params(model), tp, dp, plan.ep, dp_rank, mode)
         * layout_layers(model, key)[pp_rank])
    if pp_rank == first_rank:
        n += _fsdp_numel_of(first_stage_params(model), tp, dp, dp_rank, mode)
    if pp_rank == last_rank:
        separate = not model.tied_embeddings or first_rank != last_rank
        n += _fsdp_numel_of(last_stage_params(model, separate), tp, dp, dp_rank, mode)
    return n


def rank_signature(model: ModelSpec, plan: ParallelPlan, pp_rank: int) -> tuple[int, bool, bool]:
    """``(blocks, holds the embeddings, holds the output layer)`` of a pipeline rank: ranks
    with the same signature hold the same tensors."""
    key = layout_key(plan)
    first_rank, last_rank = ends_of(key)
    return layout_layers(model, key)[pp_rank], pp_rank == first_rank, pp_rank == last_rank


def fsdp_numel(shapes: list[tuple[int, ...]], dp: int, dp_rank: int) -> int:
    """Elements ``dp_rank`` holds when each tensor's dim 0 is split like ``torch.chunk``."""
    total = 0
    for s in shapes:
        chunk = -(-s[0] // dp)
        rows = max(0, min(chunk, s[0] - chunk * dp_rank))
        total += rows * _numel(s[1:])
    return total

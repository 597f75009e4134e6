"""Tensor parallelism (Megatron 1-D) and sequence parallelism, through DTensor.

:func:`apply_tp` splits every matrix of a (possibly pipeline-pruned) meta-device
:class:`~ptd.runtime.model.transformer.Transformer` over the ``tp`` sub-mesh with ``parallelize_module``,
exactly as :mod:`ptd.cost.params` prices it (``Param.tp_dim``):

* attention ``wq``/``wk``/``wv`` and MLP ``w1``/``w3`` are column parallel (output features
  split: each rank holds ``n_heads/tp`` query heads and ``n_kv_heads/tp`` key/value heads, so
  grouped-query attention keeps its head ratio); ``wo`` and ``w2`` are row parallel (input
  features split, partial outputs summed);
* the embedding is vocabulary parallel (``RowwiseParallel`` on ``nn.Embedding``: each rank
  looks up the ids in its vocabulary slice, the partial rows are summed) and the output layer
  column parallel over the vocabulary, returning logits as a ``DTensor`` sharded on the
  vocabulary: the runners compute the loss under ``loss_parallel()``, so the full
  ``(tokens, vocab)`` logits are never gathered;
* norms, position embeddings and row-parallel biases are replicated (learned positions under
  sequence parallelism: the embedding is all-reduced whole, positions and dropout added, and
  block 0 takes its sequence shard -- a slice forward, an all-gather backward);
* mixture of experts: the router and the routed experts are replicated (experts split over
  ep instead), shared experts split like the dense MLP.

Sequence parallel (``plan.sp``): the residual stream between the parallel regions is split
along the sequence (``Shard(1)``); norms run on their sequence shard (``SequenceParallel``),
the block inputs are all-gathered before the column-parallel matmuls (``PrepareModuleInput``)
and the row-parallel outputs are reduce-scattered instead of all-reduced (Korthikanti et al.
2022; torchtitan's Llama plan). Between pipeline stages the activations are then the
sequence shards.

The model code needs no change: attention reshapes with ``-1`` heads, and RoPE tables
(``(seq, head_dim)``, the same for every head) are full on every rank and sliced to the
sequence length inside attention, where the sequence is whole again.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)

from ...specs import ParallelPlan


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, plan: ParallelPlan) -> None:
    """Split ``model``'s parameters over ``tp_mesh`` in place (before FSDP and
    materialisation: DTensor parameters on the meta device, initialised later by name)."""
    sp = plan.sp
    between = Shard(1) if sp else Replicate()  # layout of the residual stream
    # Learned positions are added to the whole sequence (the model indexes them by the
    # tokens' positions), so under sp the embedding stays whole -- all-reduced, positions
    # added, dropout drawn alike on the tp ranks -- and is cut into sequence shards at the
    # first block's input, as Megatron-LM scatters after its embedding
    whole_embedding = sp and model.spec.position == "learned"
    top: dict[str, object] = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Replicate() if whole_embedding else between)
    if model.norm is not None and sp:
        top["norm"] = SequenceParallel()
    if model.output is not None:
        top["output"] = ColwiseParallel(input_layouts=between, output_layouts=Shard(-1),
                                        use_local_output=False)
    if top:
        parallelize_module(model, tp_mesh, top)
    for block in model.layers.values():
        layer: dict[str, object] = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=between),
        }
        ff = block.feed_forward
        # MoE: the routed experts are replicated over tp (split over ep instead); shared
        # experts, dense MLPs on every token, are split like the dense MLP (as Megatron-Core
        # does), their partial outputs all-reduced (sp is refused with MoE)
        if not hasattr(ff, "router"):
            mlps = ["feed_forward."]
        else:
            mlps = [f"feed_forward.shared.{i}." for i in range(len(ff.shared or ()))]
        for prefix in mlps:
            mlp = block.get_submodule(prefix[:-1])
            layer[prefix + "w1"] = ColwiseParallel()
            layer[prefix + "w2"] = RowwiseParallel(output_layouts=between)
            if getattr(mlp, "w3", None) is not None:
                layer[prefix + "w3"] = ColwiseParallel()
        if sp:
            layer.update({
                "attention_norm": SequenceParallel(),
                "attention": PrepareModuleInput(input_layouts=(Shard(1), None),
                                                desired_input_layouts=(Replicate(), None)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),),
                                                   desired_input_layouts=(Replicate(),)),
            })
        parallelize_module(block, tp_mesh, layer)
    if whole_embedding and model.tok_embeddings is not None:
        # (the first stage holds the embeddings and block 0; the slice's backward all-gathers)
        parallelize_module(model.layers["0"], tp_mesh,
                           PrepareModuleInput(input_layouts=(Replicate(), None),
                                              desired_input_layouts=(Shard(1), None),
                                              use_local_output=True))
    # parallelize_module replaced the embedding's parameter: a tied output layer follows it
    # again at materialisation (Transformer.tie_weights); both are Shard(0) over the vocabulary.


class AlignTPGrads:
    """Give every tensor-parallel gradient its parameter's layout.

    * A replicated parameter used on a sequence shard (the norms' weights under ``sp``) gets
      a ``Partial`` gradient: each tp rank holds its shard's contribution; they are summed.
    * The vocabulary-parallel embedding's weight is ``Shard(0)`` but DTensor's embedding
      backward returns a ``Replicate`` gradient (the whole table on every tp rank, seen in
      torch 2.13); keeping only this rank's rows is a local slice, no communication, and
      halves (at tp 2) what the gradient holds, averages over dp and feeds the optimizer.

    FSDP does both itself; without FSDP the runner calls this after the step's last
    backward, before the gradients are averaged over dp, measured and clipped."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = [p for p in params if isinstance(p, DTensor)]

    @torch.no_grad()
    def __call__(self) -> None:
        for p in self.params:
            g = p.grad
            if isinstance(g, DTensor) and tuple(g.placements) != tuple(p.placements):
                p.grad = g.redistribute(g.device_mesh, p.placements)

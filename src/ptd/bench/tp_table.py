"""1D, 2D, 2.5D and 3D tensor parallelism at cluster scale: one transformer block of a model,
predicted from the per-layer factors of :mod:`ptd.cost.tpmodes` (``ptd bench scaling``'s
cluster-scale part; the runtime trains 1D only).

For each tensor-parallel degree ``P`` and each mode that can use it (2d: ``P = q^2``; 2.5d:
``P = q^2 d`` with depth ``d = 2``; 3d: ``P = q^3``), over the block's linear layers (the
attention projections and the MLP) with ``tokens`` rows:

* communication per block, forward and backward: ``sum over layers of latency * alpha +
  bandwidth * M / B`` with ``M`` the bytes of the layer's larger activation (its input or
  output, ``tokens x width x 2`` in bf16), over the links the group spans (inside a node
  while ``P`` fits in one, else the network);
* weights per device: the block's parameters (bf16) times the mode's parameter factor;
* activations per device: the layers' input activations times the mode's activation factor
  (1D keeps them whole on every rank).
"""

from __future__ import annotations

from typing import Any

from ..cost.tpmodes import MODES, tp_mode_cost
from ..errors import PtdError

DEGREES = (4, 8, 16, 27, 64)
DEPTH = 2  # 2.5d's depth in the table


def block_layers(model: Any) -> list[tuple[int, int]]:
    """(in, out) widths of one block's linear layers."""
    h, q, kv, f = model.hidden, model.q_dim, model.kv_dim, model.ffn_hidden
    mlp = [(h, f), (h, f), (f, h)] if model.mlp == "swiglu" else [(h, f), (f, h)]
    return [(h, q), (h, kv), (h, kv), (q, h), *mlp]


def tp_modes_table(model: Any, hw: Any, tokens: int, devices_per_node: int,
                   degrees: tuple[int, ...] = DEGREES, depth: int = DEPTH) -> list[dict[str, Any]]:
    """One row per (degree, mode) that the degree allows; see the module docstring."""
    if tokens < 1:
        raise PtdError(f"tokens must be positive, got {tokens}")
    layers = block_layers(model)
    weights = 2.0 * sum(i * o for i, o in layers)
    acts = 2.0 * tokens * sum(i for i, _ in layers)
    rows = []
    for p in degrees:
        link = hw.intra_node if p <= devices_per_node else hw.inter_node
        for mode in MODES:
            try:
                c = tp_mode_cost(mode, p, depth if mode == "2.5d" else 1)
            except PtdError:
                continue  # this degree is not a square / q^2 d / cube
            comm = sum(c.comm_time(2.0 * tokens * max(i, o), link.latency,
                                   link.effective_bandwidth) for i, o in layers)
            rows.append({"tp": p, "mode": mode, "q": c.q, "depth": c.depth,
                         "comm_per_block_s": comm, "weights_per_device_bytes": weights * c.params,
                         "activations_per_device_bytes": acts * c.activations,
                         "link": "intra-node" if p <= devices_per_node else "inter-node"})
    return rows


def render_tp(cl: dict[str, Any]) -> str:
    from ..fmt import duration, gib, table
    rows = cl["tp_modes"]
    out = [f"tensor-parallel modes, one block of {cl['model']} at {cl['seq_len']} tokens, "
           "predicted (Colossal-AI's per-layer factors; ptd trains 1d and 2d)"]
    out.append(table([(r["tp"], r["mode"] + (f" d{r['depth']}" if r["mode"] == "2.5d" else ""),
                       r["link"], duration(r["comm_per_block_s"]),
                       gib(r["weights_per_device_bytes"]), gib(r["activations_per_device_bytes"]))
                      for r in rows],
                     header=("tp", "mode", "links", "comm / block", "weights / device",
                             "activations / device"), align="lllrrr"))
    return "\n".join(out)


def mode_delta(model: Any, e: Any, mode: str, depth: int = 1) -> dict[str, Any]:
    """What tensor-parallel ``mode`` would change in estimate ``e`` (a 1D plan, which is what
    ptd trains). Step time: ``e``'s tensor-parallel time (ptd's own 1D model: Megatron-style
    blocks, two collectives per block and direction) replaced by the mode's communication per
    layer (:func:`tp_modes_table`) over every block of the slowest pipeline rank and every
    micro-batch. Layer inputs per device: the mode's share against 1D's whole inputs
    (without sequence parallelism)."""
    from ..cost.params import layers_per_rank
    p, cl = e.plan, e.cluster
    tokens = p.seq_len // p.cp * p.micro_batch
    row = _row(model, cl, tokens, p.tp, mode, depth)
    one = _row(model, cl, tokens, p.tp, "1d", 1)
    nl = max(layers_per_rank(model, p))
    mode_comm = nl * p.n_microbatches * row["comm_per_block_s"]
    return {"mode": mode, "q": row["q"], "depth": row["depth"], "priced_only": True,
            "comm_per_block_s": row["comm_per_block_s"],
            "tp_comm_s": mode_comm, "tp_comm_1d_s": e.step.tp_comm,
            "step_time_s": e.step.total - e.step.tp_comm + mode_comm,
            "step_time_1d_s": e.step.total,
            "layer_inputs_per_device_bytes": nl * row["activations_per_device_bytes"],
            "layer_inputs_per_device_1d_bytes": nl * one["activations_per_device_bytes"]}


def _row(model: Any, cluster: Any, tokens: int, tp: int, mode: str, depth: int) -> dict[str, Any]:
    per_node = cluster.devices_per_node
    rows = [r for r in tp_modes_table(model, cluster.hardware, tokens, per_node, (tp,), depth)
            if r["mode"] == mode]
    if not rows:
        tp_mode_cost(mode, tp, depth)  # raises the one-line reason
    return rows[0]

"""Collective communication time, alpha-beta model (Hockney 1994; Thakur, Rabenseifner and
Gropp 2005, "Optimization of collective communication operations in MPICH").

``M`` is the size in bytes of the whole buffer (the full tensor for all-gather and
reduce-scatter, each rank's input for all-to-all), ``n`` the group size, ``alpha`` the
per-message latency, ``B`` the per-device link bandwidth in one direction:

=================  ===============================  ==========================
collective         ring                             tree (double binary)
=================  ===============================  ==========================
all-reduce         2(n-1) alpha + 2 (n-1)/n M/B     2 log2(n) alpha + 2 (n-1)/n M/B
reduce-scatter     (n-1) alpha + (n-1)/n M/B
all-gather         (n-1) alpha + (n-1)/n M/B
broadcast          log2(n) alpha + M/B (pipelined)
all-to-all         (n-1) alpha + (n-1)/n M/B
send/recv          alpha + M/B
=================  ===============================  ==========================

The ``(n-1)/n`` and ``2(n-1)/n`` factors are NCCL's "bus bandwidth" factors, so a link's
bus bandwidth is directly the ``B`` here. All-reduce takes the cheaper of ring and tree, as
NCCL's tuner does.

**Hierarchical.** A group that spans ``N`` nodes with ``k`` members on each runs as
reduce-scatter inside each node, the collective across nodes on ``M/k`` bytes over the
``k`` NICs in parallel, and all-gather inside each node. All-gather and reduce-scatter move
their bytes the same way (inside the node, then ``1/k`` across) but pay the latency of
NCCL's single ring over all ``n`` ranks: ``(n - nodes)`` steps inside nodes and ``(nodes -
1)`` across (NCCL ``src/graph/tuning.cc``). With one member per node (``k = 1``) every hop is
a network hop.

**Calibrated.** When the hardware profile carries a measured fit for the collective
(``ptd calibrate``), ``alpha`` and the bus bandwidth come from it instead of the link specs.
"""

from __future__ import annotations

import math

from ..specs.hardware import HardwareSpec

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all", "send_recv")


def bus_factor(kind: str, n: int) -> float:
    """Bytes each rank moves per byte of ``M`` (the bandwidth term's multiplier)."""
    if n <= 1 and kind != "send_recv":
        return 0.0
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in ("reduce_scatter", "all_gather", "all_to_all"):
        return (n - 1) / n
    if kind in ("broadcast", "send_recv"):
        return 1.0
    raise ValueError(f"unknown collective {kind!r}")


def latency_steps(kind: str, n: int, algo: str = "ring") -> float:
    """How many alphas the collective pays."""
    if kind == "send_recv":
        return 1.0
    if n <= 1:
        return 0.0
    log = math.ceil(math.log2(n))
    if kind == "all_reduce":
        return 2.0 * log if algo == "tree" else 2.0 * (n - 1)
    if kind == "broadcast":
        return float(log)
    return float(n - 1)


def flat_time(kind: str, nbytes: float, n: int, alpha: float, bandwidth: float) -> float:
    """One level: ring (or tree, for all-reduce, whichever is cheaper)."""
    if kind != "send_recv" and n <= 1:
        return 0.0
    bw_term = bus_factor(kind, n) * nbytes / bandwidth
    steps = latency_steps(kind, n, "ring")
    if kind == "all_reduce":
        steps = min(steps, latency_steps(kind, n, "tree"))
    return steps * alpha + bw_term


def collective_time(kind: str, nbytes: float, n: int, hw: HardwareSpec, nodes: int = 1,
                    per_node: int | None = None) -> float:
    """Seconds for one collective of ``nbytes`` over ``n`` ranks spread over ``nodes`` nodes
    with ``per_node`` members on each (default ``n / nodes``)."""
    if nbytes <= 0 or (n <= 1 and kind != "send_recv"):
        return 0.0
    fit = hw.collective_fit(kind, n)
    if fit is not None:
        return fit.alpha * _scale_latency(kind, n, fit.group_size) + bus_factor(kind, n) * nbytes / fit.bus_bandwidth
    intra, inter = hw.intra_node, hw.inter_node
    if kind == "send_recv":
        link = inter if nodes > 1 else intra
        return link.latency + nbytes / link.effective_bandwidth
    if nodes <= 1:
        return flat_time(kind, nbytes, n, intra.latency, intra.effective_bandwidth)
    k = per_node if per_node is not None else max(1, n // nodes)
    if k <= 1:
        return flat_time(kind, nbytes, n, inter.latency, inter.effective_bandwidth)
    # hierarchical: inside the node on the full buffer, across nodes on 1/k of it
    t_inter = flat_time(kind if kind != "all_to_all" else "all_to_all", nbytes / k, nodes,
                        inter.latency, inter.effective_bandwidth)
    if kind == "all_reduce":
        return (flat_time("reduce_scatter", nbytes, k, intra.latency, intra.effective_bandwidth)
                + t_inter
                + flat_time("all_gather", nbytes, k, intra.latency, intra.effective_bandwidth))
    if kind == "broadcast":
        return t_inter + flat_time("broadcast", nbytes, k, intra.latency, intra.effective_bandwidth)
    if kind == "all_to_all":
        # 1/N of each rank's data stays in its node; the rest crosses the network
        return (flat_time("all_to_all", nbytes / nodes, k, intra.latency, intra.effective_bandwidth)
                + (nodes - 1) / nodes * nbytes / inter.effective_bandwidth + (nodes - 1) * inter.latency)
    # reduce-scatter / all-gather: NCCL runs one ring over all n ranks; its n - 1 steps
    # include nodes - 1 network hops, the rest inside nodes (NCCL src/graph/tuning.cc,
    # ``(nsteps - nInterSteps) * intraLat + nInterSteps * interLat``). Bytes: the node's
    # share over NVLink, then 1/k of the buffer over each of the k NICs.
    latency = (n - nodes) * intra.latency + (nodes - 1) * inter.latency
    return (latency + bus_factor(kind, k) * nbytes / intra.effective_bandwidth
            + bus_factor(kind, nodes) * nbytes / k / inter.effective_bandwidth)


def _scale_latency(kind: str, n: int, measured_n: int) -> float:
    """A measured alpha is for the whole collective at ``measured_n`` ranks; scale it by the
    ring's step count when used at another size."""
    if n == measured_n:
        return 1.0
    return max(latency_steps(kind, n), 1.0) / max(latency_steps(kind, measured_n), 1.0)

"""Synchronous parameter server against the ring all-reduce, alpha-beta model.

``N`` workers, ``S`` servers, ``M`` bytes of gradients (and as many of parameters), every
link ``B`` bytes/s in each direction with per-message latency ``alpha``. The parameters are
sharded evenly over the servers (Li et al. 2014, "Scaling Distributed Machine Learning with
the Parameter Server", OSDI, section 3). One synchronous step is a push and then a pull:

* push: every worker sends ``M/S`` to every server. A worker's link sends ``M`` in ``S``
  messages; a server's link receives ``N M / S`` in ``N`` messages. The busier end bounds
  the phase: ``max(N, S) alpha + max(N/S, 1) M / B``;
* pull: the same bytes the other way, after the servers have summed the pushes.

So ``t_ps = 2 (max(N, S) alpha + max(N/S, 1) M/B)`` and each server's link carries
``2 M N / S`` bytes per step (in plus out). The ring all-reduce moves ``2 (N-1)/N M`` per
link in ``2 (N-1)`` steps (Thakur et al. 2005). With ``S = N`` servers the bandwidth terms
are ``2 M/B`` against ``2 (N-1)/N M/B``: the parameter server needs as many server links as
workers to match the ring (the comparison of Jiang et al. 2020, "BytePS", OSDI, section 2).
"""

from __future__ import annotations


def ps_server_link_bytes(nbytes: float, n: int, servers: int) -> float:
    """Bytes through one server's link per step: ``2 M N / S``."""
    return 2.0 * nbytes * n / servers


def ps_time(nbytes: float, n: int, servers: int, alpha: float, bandwidth: float) -> float:
    """Seconds of one synchronous push + pull (see the module docstring)."""
    if servers < 1:
        raise ValueError(f"servers must be >= 1, got {servers}")
    if nbytes <= 0 or n < 1:
        return 0.0
    return 2.0 * (max(n, servers) * alpha + max(n / servers, 1.0) * nbytes / bandwidth)


def ring_allreduce_time(nbytes: float, n: int, alpha: float, bandwidth: float) -> float:
    """``2 (N-1) alpha + 2 (N-1)/N M/B`` (0 for one rank)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2.0 * (n - 1) * alpha + 2.0 * (n - 1) / n * nbytes / bandwidth



def dp_ps_time(nbytes: float, n: int, servers: int, hw) -> float:  # type: ignore[no-untyped-def]
    """Data-parallel gradients of ``n`` replicas through ``servers`` parameter servers, which
    are other hosts: every transfer crosses the network (``hw.inter_node``'s per-device
    latency and bandwidth, as the collectives' inter-node level uses)."""
    if n <= 1:
        return 0.0
    link = hw.inter_node
    return ps_time(nbytes, n, servers, link.latency, link.effective_bandwidth)

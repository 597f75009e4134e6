"""Parameter server against all-reduce as the cluster grows: the data-parallel gradient
exchange of one model, predicted (``ptd bench scaling``'s cluster-scale part).

For each device count ``N`` (pure data parallelism, fp32 gradients of the whole model):
the all-reduce of :func:`ptd.cost.comm.collective_time` (hierarchical over the nodes the
layout gives) against a synchronous parameter server (:mod:`ptd.cost.ps`; servers are other
hosts, reached over the inter-node links) with ``S = N/8, N/2, N, 2N`` servers, and the
fewest servers (powers of two up to ``4N``) with which the parameter server is no slower.
"""

from __future__ import annotations

from typing import Any

from ..cost.comm import collective_time
from ..cost.ps import dp_ps_time, ps_server_link_bytes


def ps_crossover(model: Any, hw: Any, sizes: list[int], devices_per_node: int) -> list[dict[str, Any]]:
    grad = 4.0 * model.param_count()
    rows = []
    for n in sizes:
        nodes = max(1, n // devices_per_node)
        t_ar = collective_time("all_reduce", grad, n, hw, nodes, min(n, devices_per_node))
        ps = {s: dp_ps_time(grad, n, s, hw) for s in (max(1, n // 8), max(1, n // 2), n, 2 * n)}
        need = None
        s = 1
        while s <= 4 * n:
            if dp_ps_time(grad, n, s, hw) <= t_ar:
                need = s
                break
            s *= 2
        rows.append({"n": n, "grad_bytes": grad, "allreduce_s": t_ar,
                     "ps_s": {str(k): v for k, v in ps.items()},
                     "server_link_bytes_at_n": ps_server_link_bytes(grad, n, n),
                     "servers_to_match": need})
    return rows


def render_ps(cl: dict[str, Any]) -> str:
    from ..fmt import duration, table
    rows = cl["ps"]
    keys = [list(r["ps_s"]) for r in rows]
    out = [f"data-parallel gradients of {cl['model']} ({rows[0]['grad_bytes'] / 2**30:.1f} GiB fp32) "
           "per step, predicted: all-reduce vs synchronous parameter server with S servers"]
    out.append(table([(r["n"], duration(r["allreduce_s"]),
                       *(f"S={s}: {duration(r['ps_s'][s])}" for s in k),
                       r["servers_to_match"] or "none <= 4N")
                      for r, k in zip(rows, keys)],
                     header=("N", "all-reduce", "PS N/8", "PS N/2", "PS N", "PS 2N",
                             "servers to match"), align="lrrrrrr"))
    return "\n".join(out)

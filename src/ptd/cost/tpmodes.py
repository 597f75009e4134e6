"""1D, 2D, 2.5D and 3D tensor parallelism of one linear layer ``Y = X A``: per-device cost
factors relative to the unsplit layer, forward plus backward, ring collectives.

The factors are the ones Colossal-AI's documentation tabulates for its implementations
("Efficiency" tables of docs/source/en/features/{1D,2D,2p5D,3D}_tensor_parallel.md, by the
papers' authors), taken with their constants:

=======  ===========  ==========  =======  ===========  ==================  ==========
mode     devices P    compute     params   activations  bandwidth           latency
=======  ===========  ==========  =======  ===========  ==================  ==========
1d       P            1/P         1/P      1            2(P-1)/P            2(P-1)
2d       q^2          1/q^2       1/q^2    1/q^2        6(q-1)/q            6(q-1)
2.5d     q^2 d        1/(d q^2)   1/q^2    1/(d q^2)    3(q-1)(d+1)/(d q)   6(q-1)
3d       q^3          1/q^3       1/q^3    1/q^3        6(q-1)/q^3          6(q-1)
=======  ===========  ==========  =======  ===========  ==================  ==========

1D: Megatron-LM (Shoeybi et al. 2019; Narayanan et al. 2021). 2D: Optimus, Xu et al. 2021,
arXiv 2104.05343 (SUMMA on a q x q mesh). 2.5D: Tesseract, Wang et al. 2021, arXiv
2105.14500 (d stacked q x q layers). 3D: Bian et al. 2021, arXiv 2105.14450 (q x q x q
cube). The bandwidth factor multiplies the bytes of the layer's activation tensor ``M`` and
the latency factor the per-message ``alpha``: ``t = latency * alpha + bandwidth * M / B``.
These are the documented asymptotic costs, not a byte-exact account of any one kernel.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import PtdError

MODES = ("1d", "2d", "2.5d", "3d")


@dataclass(frozen=True)
class TPModeCost:
    """Per-device factors of one linear layer (see the module docstring)."""

    mode: str
    devices: int
    q: int
    """Mesh side (``P`` for 1d)."""
    depth: int
    """2.5D's d (1 otherwise)."""
    compute: float
    params: float
    activations: float
    bandwidth: float
    latency: float

    def comm_time(self, nbytes: float, alpha: float, bandwidth: float) -> float:
        return self.latency * alpha + self.bandwidth * nbytes / bandwidth

    def to_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def _root(p: int, k: int) -> int | None:
    r = round(p ** (1.0 / k))
    for c in (r - 1, r, r + 1):
        if c >= 1 and c ** k == p:
            return c
    return None


def tp_mode_cost(mode: str, p: int, depth: int = 1) -> TPModeCost:
    """The factors of ``mode`` on ``p`` devices; :class:`PtdError` when ``p`` is not a
    square (2d), ``q^2 d`` (2.5d) or a cube (3d)."""
    if mode not in MODES:
        raise PtdError(f"tp mode must be one of {', '.join(MODES)}, got {mode!r}")
    if p < 1 or depth < 1:
        raise PtdError("tp and depth must be positive")
    if mode != "2.5d" and depth != 1:
        raise PtdError("--depth applies to --tp-mode 2.5d only")
    if mode == "1d":
        return TPModeCost(mode, p, p, 1, 1 / p, 1 / p, 1.0, 2 * (p - 1) / p, 2 * (p - 1))
    if mode == "2d":
        q = _root(p, 2)
        if q is None:
            raise PtdError(f"2d tensor parallelism needs tp = q^2, got {p}")
        return TPModeCost(mode, p, q, 1, 1 / p, 1 / p, 1 / p, 6 * (q - 1) / q, 6 * (q - 1))
    if mode == "2.5d":
        q = _root(p // depth, 2) if p % depth == 0 else None
        if q is None:
            raise PtdError(f"2.5d tensor parallelism needs tp = q^2 * depth, got tp {p}, depth {depth}")
        if q < 2:  # the factors leave out the gradient sum over depth, all there is at q = 1
            raise PtdError(f"2.5d tensor parallelism needs q >= 2 (tp {p} at depth {depth} is "
                           f"q = 1: data parallelism over the depth, not tensor parallelism)")
        d = depth
        return TPModeCost(mode, p, q, d, 1 / (d * q * q), 1 / (q * q), 1 / (d * q * q),
                          3 * (q - 1) * (d + 1) / (d * q), 6 * (q - 1))
    q = _root(p, 3)
    if q is None:
        raise PtdError(f"3d tensor parallelism needs tp = q^3, got {p}")
    return TPModeCost(mode, p, q, 1, 1 / p, 1 / p, 1 / p, 6 * (q - 1) / q ** 3, 6 * (q - 1))


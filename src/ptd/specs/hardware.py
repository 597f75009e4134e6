"""HardwareSpec (one device and the fabric of its node) and ClusterSpec (how many of them).

Peak FLOP/s are **dense** figures. Vendors also print sparse (2:4 structured sparsity)
figures, twice as large; MFU divided by those is half of what it should be, so they are kept
only in ``sparse_peak_flops`` for display and never used in a formula.

Achievable fractions are not tuning knobs. ``gemm_efficiency`` is the best large-GEMM rate a
public microbenchmark measured divided by the dense peak (Bekman, *Machine Learning
Engineering*, "Maximum Achievable Matmul FLOPS comparison table", bf16, mamf-finder.py);
``link_efficiency`` is the fraction of a link's per-direction bandwidth that NCCL's bus
bandwidth typically reaches. Where no measurement is published the field says so in
``sources``. A profile written by ``ptd calibrate`` replaces them with what it measured.

Bandwidths are bytes/s in **one direction per device** (NVIDIA quotes NVLink bidirectional:
900 GB/s on H100 is 450 GB/s each way).
"""

from __future__ import annotations

import math

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import PtdError, ptd_home

_SPINE: dict[int, tuple[Any, Any]] = {}
"""HardwareSpec.across_spine's derived specs by the id of the one they derive from (kept
with it, so an id is never reused while its entry lives)."""

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}

T, G = 1e12, 1e9
GiB = 2**30


EAGER_KERNELS = ("activation", "add", "broadcast", "cast_down", "cast_up", "cat", "copy",
                 "elementwise", "norm", "softmax")
"""The kinds of eager memory-bound kernel ``ptd.cost.eager`` prices (its ``BW_FRACTION`` keys
and ``norm``), which ``HardwareSpec.eager_bandwidth_fraction`` may name."""


@dataclass(frozen=True)
class LinkSpec:
    """One kind of link between devices."""

    bandwidth: float
    """Bytes/s per device, one direction."""
    latency: float
    """Seconds per message (the alpha of the alpha-beta model)."""
    efficiency: float = 0.8
    """Fraction of ``bandwidth`` a large collective reaches (bus bandwidth / link)."""

    @property
    def effective_bandwidth(self) -> float:
        return self.bandwidth * self.efficiency


@dataclass(frozen=True)
class CollectiveFit:
    """A measured alpha-beta fit of one collective at one group size (``ptd calibrate``).

    time(M) = alpha + M / bus_bandwidth * factor(kind, n), M the message in bytes; see
    ``ptd.cost.comm`` for the factors. Stored as bus bandwidth so that one number per link
    is comparable across group sizes.
    """

    kind: str
    group_size: int
    alpha: float
    """Seconds."""
    bus_bandwidth: float
    """Bytes/s (algorithm bandwidth times the collective's ring factor)."""


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator (or CPU worker) and the node it sits in."""

    name: str
    """Preset or profile name."""
    peak_flops: dict[str, float]
    """Dense peak FLOP/s per dtype (``fp32``, ``tf32``, ``bf16``, ``fp16``, ``fp8``)."""
    memory_bytes: float
    """Device memory, bytes."""
    memory_bandwidth: float
    """Device memory bandwidth, bytes/s."""
    intra_node: LinkSpec
    """Device-to-device link inside a node (NVLink, Infinity Fabric, HCCS, shared memory)."""
    inter_node: LinkSpec
    """Network between nodes, per device (e.g. one 400 Gb/s NIC per GPU = 50 GB/s)."""
    devices_per_node: int = 8
    """Devices that share the intra-node fabric."""
    gemm_efficiency: float = 0.8
    """Fraction of the dense peak a large matmul reaches (see ``sources``)."""
    memory_efficiency: float = 0.9
    """Fraction of ``memory_bandwidth`` a large copy reaches (memory-bound kernels)."""
    attention_efficiency: float = 1.0
    """Rate of the fused (flash) attention kernel relative to the large-GEMM rate; attention
    has a short inner dimension (the head width) and a softmax between its two products."""
    op_overhead: float = 0.0
    """Seconds each kernel/operator costs beyond its work: launch and dispatch. Zero on GPUs
    (launches are asynchronous and hide behind large kernels); measured on CPU."""
    sm_count: int = 0
    """Streaming multiprocessors (vendor datasheet). Non-zero turns on the matmul shape model
    of :func:`ptd.cost.compute.shape_efficiency` (tile and wave quantisation); 0: every
    product at ``gemm_efficiency`` of the peak."""
    kernel_launch: float = 0.0
    """Seconds a matmul kernel costs beyond its work when launched back to back (measured:
    10.5 us on an H100 from PyTorch); used with the shape model."""
    comm_sms: int = 0
    """Multiprocessors a running collective occupies (NCCL launches one thread block per
    channel). Products that run beside an overlapped collective get the rest, with the shape
    model's wave quantisation over fewer multiprocessors; 0: overlap costs nothing."""
    host_bandwidth: float = 25 * G
    """Device-host link (PCIe) bytes/s, used for CPU offload."""
    memory_reserved: float = 0.0
    """Bytes of device memory training cannot use: the CUDA context, NCCL communicator
    buffers, library workspaces. A plan fits if its total is at most ``usable_memory``."""
    sparse_peak_flops: dict[str, float] = field(default_factory=dict)
    """Vendor 2:4-sparse peaks, for display only: never an MFU denominator."""
    kind: str = "gpu"
    """``gpu`` or ``cpu``: which kernels PyTorch runs (a CPU's RMSNorm is composite)."""
    cpus: int = 0
    """A CPU node's logical CPUs (``ptd calibrate`` records ``os.cpu_count()``): the run
    queues the operating system spreads its workers over, which decides how fast a worker
    computes while only some of them do (``ptd.cost.step._shared_time``). 0: not recorded
    (GPUs; older profiles, where the worker count at which the measured aggregate matmul
    rate peaks stands in)."""
    gemm_flops_measured: dict[str, dict[int, float]] = field(default_factory=dict)
    """From ``ptd calibrate``: achieved matmul FLOP/s per worker, by dtype, then by how many
    workers ran at once on the node (cores and memory are shared). Overrides peak*efficiency."""
    gemm_shapes_measured: dict[str, dict[str, float]] = field(default_factory=dict)
    """From ``ptd calibrate``: the rate each product shape ``"MxNxK"`` ((m x k) @ (k x n))
    reached, by dtype, relative to the matmul rate ``R`` of ``gemm_flops_measured`` at the
    same worker count (may exceed 1). Where present, each product of the cost model runs at
    ``R`` times its shape's value (:func:`ptd.cost.compute.shape_fraction`), instead of the
    shape model or ``R`` itself."""
    attention_shapes_measured: dict[str, dict[str, float]] = field(default_factory=dict)
    """From ``ptd calibrate``: causal attention (SDPA forward + backward) of each shape
    ``"BxHxSxD"`` (batch, heads, sequence, head dimension), by dtype, as a fraction of the
    matmul rate ``R`` at the same worker count. Where present, attention runs at the fraction
    measured for the model's head dimension, or interpolated between the head dimensions
    measured (:func:`ptd.cost.compute.attention_fraction`), instead of
    ``attention_efficiency``: small heads run far below large ones on a CPU."""
    memory_bandwidth_measured: dict[int, float] = field(default_factory=dict)
    """From ``ptd calibrate``: achieved copy bandwidth per worker (bytes/s) by workers at once.
    Overrides memory_bandwidth*memory_efficiency."""
    op_overhead_measured: dict[int, float] = field(default_factory=dict)
    """From ``ptd calibrate``: seconds per operator dispatch by workers at once."""
    eager_bandwidth_fraction: dict[str, float] = field(default_factory=dict)
    """From ``ptd calibrate``: the share of the copy bandwidth a kind of eager kernel reaches
    on this machine, by kind of :mod:`ptd.cost.eager` (``activation``: SiLU/GELU forward and
    backward, which a CPU's exponential, not its memory, bounds: 0.31 measured on a
    2-core EPYC). Overrides the GPU table ``ptd.cost.eager.BW_FRACTION`` (and 1, elsewhere) for the
    kinds it names."""
    collectives: tuple[CollectiveFit, ...] = ()
    """From ``ptd calibrate``: measured alpha-beta per collective and group size."""
    overheads_measured: dict[str, dict[int, float]] = field(default_factory=dict)
    """From ``ptd calibrate`` (CPU): seconds of framework overhead by kind, then by workers at
    once: ``dtensor_op`` (one operator on a ``DTensor`` beyond the same operator on a plain
    tensor: sharding propagation and wrapping), ``dtensor_compute_share`` (not seconds: how
    much slower a model's work runs on DTensors, a tp rank's blocks and output layer priced
    that share slower), ``optimizer_tensor`` (one parameter tensor's share of the optimizer phase -- gradient-norm, clipping, single-tensor AdamW -- on plain
    tensors), ``optimizer_tensor_dtensor`` (the same on DTensor parameters, as FSDP and
    tensor parallelism make them) and ``optimizer_param`` (what each parameter adds to that
    phase, timed on 256 x 256 tensors; it replaces the bytes at the copy bandwidth),
    ``optimizer_param_dtensor`` (the same on DTensor shards), ``fsdp_unit_forward`` / ``_backward`` and ``fsdp_unit_keep_*`` (FSDP2's own work per unit
    and micro-batch, resharded and kept, on a group of the worker count where there is one:
    ``ptd.cost.dp.fsdp_unit_time``), ``ep_layer_forward``
    / ``_backward`` (expert parallelism's own work per MoE layer and micro-batch) and
    ``ep_all_to_all_forward`` / ``_backward`` (one rows' all-to-all call's share of it:
    ``ptd.cost.step.ep_layer_overheads``). Absent: 0 for ``dtensor_op``, the FSDP and ep
    entries, operator counts times ``op_overhead`` and bytes over the bandwidth for the
    optimizer. A ``blocking_collective`` entry (one wait per
    collective, whatever the chunk before it) is used only where ``blocking_wait_measured``
    is absent."""
    blocking_wait_measured: dict[int, tuple[tuple[float, float], ...]] = field(
        default_factory=dict)
    """From ``ptd calibrate`` (CPU): what a blocking collective costs beyond the
    ``collectives`` fit when it follows a chunk of computation, as tensor parallelism's
    activation all-reduces do -- by workers at once, points ``(chunk seconds, wait
    seconds)``. The fits are timed back to back; after a chunk, gloo's threads have gone to
    sleep and must be woken, and where workers outnumber cores a peer descheduled during
    its chunk arrives late. Both grow with the chunk. Read by linear interpolation, flat
    past the measured chunks; absent: no wait (GPUs, presets)."""
    blocking_wait_group_measured: dict[int, tuple[tuple[float, float], ...]] = field(
        default_factory=dict)
    """From ``ptd calibrate`` (CPU, more than 2 workers): the same loop as
    ``blocking_wait_measured`` in one group of all the workers, keyed by that group's
    size, points ``(chunk seconds, wait seconds)`` beyond that group's all-reduce fit. A
    collective waits for the latest of its peers, so a group of 4 waits longer than a pair
    with 4 workers busy (2026-11-28, 4 workers on 2 cores, 1 MiB after ~20 ms of matmuls:
    14-19 ms in a group of 4, 8-9 in pairs). Read for collectives of a group at least
    that large (the largest measured size not above the group's); smaller groups, or
    none measured: ``blocking_wait_measured``."""
    dtensor_reduce_measured: dict[int, tuple[tuple[float, float], ...]] = field(
        default_factory=dict)
    """From ``ptd calibrate`` (CPU): what one tensor-parallel all-reduce costs beyond the
    ``collectives`` fit because ptd's tp layers issue it through DTensor (a ``Partial``
    tensor redistributed to ``Replicate``: DTensor's redistribution and the functional
    collective's out-of-place copy, on the calling thread) -- beyond, too, what the same
    call costs on the one-rank mesh that ``overheads_measured["dtensor_op"]`` is timed on.
    By workers at once, points ``(bytes, seconds)``, measured in pairs. Read along the
    least-squares line through them (a fixed part and the copy, which grows with the
    bytes); absent: nothing (GPUs, presets)."""
    tp_situ_measured: dict[int, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    """From ``ptd calibrate`` (CPU): what each all-reduce of ptd's tensor-parallel model
    costs in place beyond its ``collectives`` fit, ``dtensor_reduce_measured`` and
    ``blocking_wait_measured`` as the cost model adds them -- the calibration's own tp
    model (``runtime/calibrate/tp_situ.py``) timed on a pair and on a one-rank mesh, the
    difference shared among its all-reduces. By workers at once, points ``(bytes,
    seconds)``, measured in pairs; it may be negative where the parts charge more. Read
    along the least-squares line through the points and added to the DTensor extra of each
    collective of a tensor-parallel pair (the sum not below 0), with at most as many
    workers busy as measured (the calibration measures 2: with four busy on the 2-core
    EPYC it read 1.1-1.3 ms at 2 MiB where two read 0.5-0.7, and a pipeline keeps only some
    of its workers busy, so neither stands for the other); larger groups, whose collectives
    wait for more peers, get none (not measured in place); absent: nothing (GPUs,
    presets).
    (2026-11-29, 2 cores: the parts left ~24% of the tp collectives' cost out at 1 and
    2 MiB.)"""
    fsdp_situ_measured: dict[int, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    """From ``ptd calibrate`` (CPU): what each gather of ptd's ZeRO-3 costs in place beyond
    what the cost model charges it from the other tables (its ``collectives`` fit, the
    late-peer wait, FSDP's copies at the measured memory bandwidth, the per-unit hooks of
    ``overheads_measured["fsdp_unit_*"]``) -- the calibration's own model under ZeRO-3
    (``runtime/calibrate/fsdp_situ.py``) timed on a pair and without FSDP, the difference
    less the priced parts shared among its gathers (a unit's forward and its backward each
    gather it once a micro-batch). By workers at once, points ``(bytes a unit gathers,
    seconds)``, measured in pairs; it may be negative. Read along the least-squares line
    through the points (one point: flat) and charged on every ZeRO-3 gather of a
    data-parallel pair (a unit's per-unit cost not below 0), with at most as many workers
    busy as measured; larger groups and ZeRO-1/2 get none (not measured in place); absent:
    nothing (GPUs, presets). (2026-11-30, 2 cores: 2.3-3.1 ms a gather in three probes,
    0.13-2.36 in six calibrations, ``docs/data/epyc2-2026-11-30b/``.)"""
    moe_layer_measured: dict[str, dict[int, tuple[tuple[float, float, float], ...]]] = field(
        default_factory=dict)
    """From ``ptd calibrate --model M`` (CPU; M a mixture-of-experts model): M's MoE layer --
    router, auxiliary losses, sort, gather, grouped experts, weighting, scatter back --
    timed forward and backward at a few token counts, keyed by
    :func:`ptd.cost.moe.moe_layer_key` (its shape and dtype), then by workers at once:
    points ``(tokens, forward s, backward s)``. Where present for a model, the cost model
    prices that layer by them (linear between the points, along the nearest two past them)
    instead of operator by operator: a CPU's kernels for it follow neither bytes nor FLOPs
    (a softmax over 8 router columns took 74 us for 512 tokens, one over 16 took 13;
    docs/moe.md)."""
    nodes_per_leaf: int = 0
    """Nodes whose NICs one leaf switch layer joins without the spine; 0: one non-blocking
    fabric (the spine never slows a collective). The topology sets it: rail-optimised
    (each GPU's NIC on its rail's leaf, so a leaf holds one NIC of every node under it and
    reaches as many nodes as it has downlinks: 20 in a DGX A100 SuperPOD scalable unit,
    32 in a DGX H100 one) or top of rack (every NIC of a node on one leaf: downlinks over
    NICs per node). Read only with ``spine_oversubscription`` above 1."""
    spine_oversubscription: float = 1.0
    """Leaf downlink over uplink bandwidth (1: full bisection, as DGX SuperPODs are built).
    A collective whose group spans more than ``nodes_per_leaf`` nodes crosses the spine; a
    training step's collectives run on every node at once, so each of its network hops
    gets ``inter_node.bandwidth / spine_oversubscription`` (a ring is as fast as its
    slowest hop; :func:`ptd.cost.comm.collective_time`)."""
    sources: dict[str, str] = field(default_factory=dict)
    """Where each number comes from."""

    def __post_init__(self) -> None:
        from .typecheck import check_hardware
        check_hardware(self)  # types, finiteness and ranges of every value, named
        if not self.peak_flops or any(v <= 0 for v in self.peak_flops.values()):
            raise PtdError(f"hardware {self.name}: peak_flops needs positive values")
        for f in ("memory_bytes", "memory_bandwidth", "host_bandwidth"):
            if getattr(self, f) <= 0:
                raise PtdError(f"hardware {self.name}: {f} must be positive")
        if not 0 <= self.memory_reserved < self.memory_bytes:
            raise PtdError(f"hardware {self.name}: memory_reserved must be in [0, memory_bytes)")
        if self.devices_per_node < 1:
            raise PtdError(f"hardware {self.name}: devices_per_node must be at least 1")
        if isinstance(self.cpus, bool) or not isinstance(self.cpus, int) \
                or not 0 <= self.cpus <= 2**20:
            raise PtdError(f"hardware {self.name}: cpus must be an integer in 0..2**20 "
                           f"(0: not recorded), got {self.cpus!r}")
        for f in ("gemm_efficiency", "memory_efficiency", "attention_efficiency"):
            if not 0 < getattr(self, f) <= 1:
                raise PtdError(f"hardware {self.name}: {f} must be in (0, 1]")
        if self.op_overhead < 0:
            raise PtdError(f"hardware {self.name}: op_overhead must be non-negative")
        if isinstance(self.nodes_per_leaf, bool) or not isinstance(self.nodes_per_leaf, int) \
                or not 0 <= self.nodes_per_leaf <= 2**20:
            raise PtdError(f"hardware {self.name}: nodes_per_leaf must be an integer in "
                           f"0..2**20, got {self.nodes_per_leaf!r}")
        if not 1 <= self.spine_oversubscription <= 1000:
            raise PtdError(f"hardware {self.name}: spine_oversubscription must be in [1, 1000] "
                           f"(downlink over uplink bandwidth), got {self.spine_oversubscription!r}")
        for n, pts in self.blocking_wait_measured.items():
            if not pts or any(c < 0 or w < 0 for c, w in pts):
                raise PtdError(f"hardware {self.name}: blocking_wait_measured[{n}] needs "
                               "(chunk, wait) points with non-negative seconds")

    def across_spine(self, span_nodes: int) -> "HardwareSpec":
        """This hardware as a collective spanning ``span_nodes`` consecutive nodes sees it:
        itself, or, where the group crosses an oversubscribed spine, with the network
        link's bandwidth divided by the oversubscription (the same object each time, so
        the cost model's memos keep working)."""
        if self.spine_oversubscription <= 1 or not self.nodes_per_leaf \
                or span_nodes <= self.nodes_per_leaf:
            return self
        key = id(self)
        hit = _SPINE.get(key)
        if hit is None or hit[0] is not self:
            if len(_SPINE) > 256:
                _SPINE.clear()
            link = dataclasses.replace(self.inter_node, bandwidth=self.inter_node.bandwidth
                                       / self.spine_oversubscription)
            hit = _SPINE[key] = (self, dataclasses.replace(self, inter_node=link,
                                                             spine_oversubscription=1.0))
        return hit[1]

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype`` (the MFU denominator)."""
        key = dtype if dtype in self.peak_flops else {"fp16": "bf16", "bf16": "fp16"}.get(dtype, "")
        if key not in self.peak_flops:
            raise PtdError(f"hardware {self.name} has no peak for dtype {dtype}; "
                           f"known: {', '.join(self.peak_flops)}")
        return self.peak_flops[key]

    def gemm_rate(self, dtype: str, workers_per_node: int = 1) -> float:
        """Achievable matmul FLOP/s of one device (worker) while ``workers_per_node`` run.

        A calibrated profile gives the measured rate for the nearest worker count not below
        the one asked (more workers never run faster); presets give peak times efficiency.
        """
        return _per_worker(self.gemm_flops_measured.get(dtype, {}), workers_per_node,
                           self.peak(dtype) * self.gemm_efficiency, share=True)

    @property
    def usable_memory(self) -> float:
        """``memory_bytes - memory_reserved``: what a plan's memory must fit in."""
        return self.memory_bytes - self.memory_reserved

    @property
    def effective_memory_bandwidth(self) -> float:
        return self.memory_bandwidth * self.memory_efficiency

    def memory_bandwidth_at(self, workers_per_node: int = 1) -> float:
        """Achievable memory bandwidth of one worker while ``workers_per_node`` run."""
        return _per_worker(self.memory_bandwidth_measured, workers_per_node,
                           self.effective_memory_bandwidth, share=True)

    def op_overhead_at(self, workers_per_node: int = 1) -> float:
        """Seconds per operator dispatch while ``workers_per_node`` run."""
        return _per_worker(self.op_overhead_measured, workers_per_node, self.op_overhead,
                           share=False)

    def overhead_at(self, kind: str, workers_per_node: int = 1) -> float | None:
        """A measured framework overhead (see ``overheads_measured``), or None."""
        table = self.overheads_measured.get(kind)
        if not table:
            return None
        return _per_worker(table, workers_per_node, 0.0, share=False)

    def blocking_wait_at(self, chunk: float, workers_per_node: int = 1, group: int = 2) -> float:
        """Seconds a blocking collective of ``group`` ranks waits beyond its alpha-beta time
        after ``chunk`` seconds of computation while ``workers_per_node`` run
        (``blocking_wait_group_measured`` for groups of more than 2 where measured, else
        ``blocking_wait_measured``)."""
        sizes = [g for g in self.blocking_wait_group_measured if 2 < g <= group]
        if sizes:
            table, pick = self.blocking_wait_group_measured, max(sizes)
        elif not self.blocking_wait_measured:
            return self.overhead_at("blocking_collective", workers_per_node) or 0.0
        else:
            table = self.blocking_wait_measured
            pick = _pick_workers(table, workers_per_node)
        pts = sorted(table[pick])
        if chunk <= pts[0][0]:
            wait = pts[0][1]
        elif chunk >= pts[-1][0]:
            wait = pts[-1][1]
        else:
            (c0, w0), (c1, w1) = next((a, b) for a, b in zip(pts, pts[1:]) if chunk <= b[0])
            wait = w0 + (w1 - w0) * (chunk - c0) / (c1 - c0) if c1 > c0 else w1
        # past the largest measured count, a wait for a descheduled peer grows as workers
        return wait * workers_per_node / pick if workers_per_node > pick else wait

    def dtensor_reduce_at(self, nbytes: float, workers_per_node: int = 1) -> float:
        """Seconds a tensor-parallel all-reduce of ``nbytes`` adds through DTensor while
        ``workers_per_node`` run (``dtensor_reduce_measured``; 0 where absent): the least-
        squares line through the points (each a median of noisy differences), not below 0."""
        return _line_at(self.dtensor_reduce_measured, nbytes, workers_per_node)

    def tp_situ_at(self, nbytes: float, workers_per_node: int = 1) -> float:
        """Seconds a tensor-parallel all-reduce of ``nbytes`` costs in place beyond its
        priced parts while ``workers_per_node`` run (``tp_situ_measured``): the least-squares
        line through the points, negative where they are; 0 where absent or where more
        workers run than any measured count (not extrapolated: see the field)."""
        if not self.tp_situ_measured or workers_per_node > max(self.tp_situ_measured):
            return 0.0
        return _line_at(self.tp_situ_measured, nbytes, workers_per_node, floor=False)

    def fsdp_situ_at(self, nbytes: float, workers_per_node: int = 1) -> float:
        """Seconds a ZeRO-3 gather of a unit of ``nbytes`` costs in place beyond its priced
        parts while ``workers_per_node`` run (``fsdp_situ_measured``): as
        :meth:`tp_situ_at`, negative where the points are, 0 where absent or where more
        workers run than any measured count."""
        if not self.fsdp_situ_measured or workers_per_node > max(self.fsdp_situ_measured):
            return 0.0
        return _line_at(self.fsdp_situ_measured, nbytes, workers_per_node, floor=False)

    def moe_layer_at(self, key: str, tokens: float, workers_per_node: int = 1
                     ) -> tuple[float, float] | None:
        """(forward, backward) seconds of the MoE layer ``key`` on ``tokens`` tokens while
        ``workers_per_node`` run (``moe_layer_measured``), or None where not measured."""
        table = self.moe_layer_measured.get(key)
        if not table:
            return None
        pick = _pick_workers(table, workers_per_node)
        pts = sorted(table[pick])
        if len(pts) == 1:
            f, b = pts[0][1], pts[0][2]
        else:
            # the segment that holds ``tokens``, else the nearest one, extended
            i = next((i for i in range(len(pts) - 1) if tokens <= pts[i + 1][0]), len(pts) - 2)
            (t0, f0, b0), (t1, f1, b1) = pts[i], pts[i + 1]
            u = (tokens - t0) / (t1 - t0)
            f, b = max(0.0, f0 + u * (f1 - f0)), max(0.0, b0 + u * (b1 - b0))
        scale = workers_per_node / pick if workers_per_node > pick else 1.0
        return f * scale, b * scale

    def collective_fit(self, kind: str, group_size: int) -> CollectiveFit | None:
        """The measured fit for ``kind`` at the closest group size, if calibrated."""
        fits = [c for c in self.collectives if c.kind == kind]
        if not fits:
            return None
        return min(fits, key=lambda c: (abs(c.group_size - group_size), -c.group_size))

    def replace(self, **changes: Any) -> "HardwareSpec":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["gemm_flops_measured"] = {k: {str(n): r for n, r in v.items()}
                                    for k, v in self.gemm_flops_measured.items()}
        d["overheads_measured"] = {k: {str(n): r for n, r in v.items()}
                                   for k, v in self.overheads_measured.items()}
        for k in ("memory_bandwidth_measured", "op_overhead_measured"):
            d[k] = {str(n): v for n, v in getattr(self, k).items()}
        d["blocking_wait_measured"] = {str(n): [list(p) for p in pts]
                                       for n, pts in self.blocking_wait_measured.items()}
        d["blocking_wait_group_measured"] = {
            str(n): [list(p) for p in pts] for n, pts in self.blocking_wait_group_measured.items()}
        for k in ("dtensor_reduce_measured", "tp_situ_measured", "fsdp_situ_measured"):
            d[k] = {str(n): [list(p) for p in pts] for n, pts in getattr(self, k).items()}
        d["moe_layer_measured"] = {k: {str(n): [list(p) for p in pts] for n, pts in t.items()}
                                   for k, t in self.moe_layer_measured.items()}
        return d


def _line_at(table: dict[int, tuple[tuple[float, float], ...]], x: float, workers: int,
             floor: bool = True) -> float:
    """The least-squares line through the ``(x, y)`` points of ``table``'s entry for
    ``workers`` (:func:`_pick_workers`), at ``x``: not below 0 unless ``floor`` is False; 0
    where the table is empty."""
    if not table:
        return 0.0
    pts = table[_pick_workers(table, workers)]
    n = len(pts)
    mx, my = sum(b for b, _ in pts) / n, sum(e for _, e in pts) / n
    var = sum((b - mx) ** 2 for b, _ in pts)
    slope = sum((b - mx) * (e - my) for b, e in pts) / var if var > 0 else 0.0
    y = my + slope * (x - mx)
    return max(0.0, y) if floor else y


def _pick_workers(table: dict[int, Any], workers: int) -> int:
    """The measured worker count that stands for ``workers`` at once: the nearest at or
    above it, else the largest (more workers never run faster)."""
    counts = sorted(table)
    return next((n for n in counts if n >= workers), counts[-1])


def _per_worker(table: dict[int, float], workers: int, default: float, share: bool) -> float:
    """Look a measured per-worker quantity up for ``workers`` running at once: the entry for
    the nearest measured count at or above it; past the largest, a rate is shared out
    (``share``: bandwidths and FLOP/s fall as 1/workers) and a time grows as workers."""
    if not table:
        return default
    pick = _pick_workers(table, workers)
    value = table[pick]
    if workers > pick:
        value = value * pick / workers if share else value * workers / pick
    return value


@dataclass(frozen=True)
class ClusterSpec:
    """``n_devices`` devices of one kind, ``devices_per_node`` to a node."""

    hardware: HardwareSpec
    """The device and its node fabric."""
    n_devices: int
    """Total devices (GPUs, or CPU worker processes)."""
    devices_per_node: int = 0
    """Devices per node; 0 takes the hardware's own."""

    def __post_init__(self) -> None:
        if self.devices_per_node == 0:
            object.__setattr__(self, "devices_per_node",
                               min(self.hardware.devices_per_node, self.n_devices))
        if self.n_devices < 1:
            raise PtdError(f"the cluster needs at least one device, got {self.n_devices}")
        if self.devices_per_node < 1:
            raise PtdError(f"devices per node must be at least 1, got {self.devices_per_node}")
        if self.n_devices > self.devices_per_node and self.n_devices % self.devices_per_node:
            raise PtdError(f"{self.n_devices} devices do not fill whole nodes of "
                           f"{self.devices_per_node}")

    @property
    def n_nodes(self) -> int:
        return max(1, self.n_devices // self.devices_per_node)

    @property
    def workers_per_node(self) -> int:
        return min(self.devices_per_node, self.n_devices)

    def gemm_rate(self, dtype: str) -> float:
        return self.hardware.gemm_rate(dtype, self.workers_per_node)

    @property
    def memory_bandwidth(self) -> float:
        """Achievable memory bandwidth per device with the node's workers running."""
        return self.hardware.memory_bandwidth_at(self.workers_per_node)

    @property
    def op_overhead(self) -> float:
        return self.hardware.op_overhead_at(self.workers_per_node)

    def overhead(self, kind: str) -> float | None:
        """A measured framework overhead with the node's workers running, or None."""
        return self.hardware.overhead_at(kind, self.workers_per_node)

    def moe_layer(self, key: str, tokens: float) -> tuple[float, float] | None:
        """The measured MoE layer ``key`` on ``tokens`` tokens with the node's workers
        running (``HardwareSpec.moe_layer_at``), or None."""
        return self.hardware.moe_layer_at(key, tokens, self.workers_per_node)

    def dtensor_reduce(self, nbytes: float) -> float:
        """What a tensor-parallel all-reduce of ``nbytes`` adds through DTensor, with the
        node's workers running (0 where not calibrated)."""
        return self.hardware.dtensor_reduce_at(nbytes, self.workers_per_node)

    def tp_situ(self, nbytes: float) -> float:
        """What a tensor-parallel all-reduce of ``nbytes`` costs in place beyond its priced
        parts, with the node's workers running (0 where not calibrated; may be negative)."""
        return self.hardware.tp_situ_at(nbytes, self.workers_per_node)

    def fsdp_situ(self, nbytes: float) -> float:
        """What a ZeRO-3 gather of a unit of ``nbytes`` costs in place beyond its priced
        parts, with the node's workers running (0 where not calibrated; may be negative)."""
        return self.hardware.fsdp_situ_at(nbytes, self.workers_per_node)

    def blocking_wait(self, chunk: float, group: int = 2) -> float:
        """The wait a blocking collective of ``group`` ranks adds after ``chunk`` seconds of
        computation, with the node's workers running (0 where not calibrated)."""
        return self.hardware.blocking_wait_at(chunk, self.workers_per_node, group)


# ------------------------------------------------------------------ presets
_MAMF = ("Bekman, Machine Learning Engineering, 'Maximum Achievable Matmul FLOPS comparison "
         "table' (mamf-finder.py, bf16)")
_BUSBW = "assumed: NCCL bus bandwidth typically reaches ~80% of the per-direction link rate"
_FA2_A100 = ("Dao 2023, FlashAttention-2 (arXiv 2307.08691): 50-73% of peak on A100; 60% "
             "of dense peak taken")
_FA2_H100 = ("Shah et al. 2024, FlashAttention-3 (arXiv 2407.08608): FlashAttention-2 reaches "
             "~35% of peak on H100 (FlashAttention-3 up to 75%); 35% taken")


def _gpu(name: str, *, fp32: float, tf32: float, bf16: float, fp8: float | None, mem_gib: float,
         bw: float, nvlink: float, nic: float, gemm_eff: float, gemm_src: str,
         mem_eff: float = 0.9, mem_src: str = "assumed: large copies reach ~90% of HBM bandwidth",
         attn_peak_frac: float = 0.5, attn_src: str = "assumed: no published fused-attention rate",
         pcie: float = 25 * G, node: int = 8, spec_src: str = "vendor datasheet",
         sms: int = 0, comm_sms: int = 0, comm_sms_src: str = "") -> HardwareSpec:
    peak = {"fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": bf16}
    if fp8:
        peak["fp8"] = fp8
    return HardwareSpec(
        name=name, peak_flops=peak, memory_bytes=mem_gib * GiB, memory_bandwidth=bw,
        intra_node=LinkSpec(nvlink, 5e-6, 0.8), inter_node=LinkSpec(nic, 10e-6, 0.8),
        devices_per_node=node, gemm_efficiency=gemm_eff, memory_efficiency=mem_eff,
        memory_reserved=2 * GiB,
        attention_efficiency=min(1.0, attn_peak_frac / gemm_eff),
        host_bandwidth=pcie, sm_count=sms, kernel_launch=_LAUNCH if sms else 0.0,
        comm_sms=comm_sms,
        sparse_peak_flops={k: 2 * v for k, v in peak.items() if k in ("tf32", "bf16", "fp16", "fp8")},
        sources={"peaks": spec_src, "gemm_efficiency": gemm_src, "memory_efficiency": mem_src,
                 "attention_efficiency": attn_src,
                 "memory_reserved": "assumed: ~2 GiB for the CUDA context (~0.5 GiB), NCCL "
                                    "buffers and cuBLAS/cuDNN workspaces",
                 "link_efficiency": _BUSBW, "latency": "assumed: 5 us NVLink, 10 us network hop",
                 "sm_count": (f"{sms} SMs, vendor datasheet; shape model: tile shapes of the "
                              "cuBLAS kernels seen on an H100 (docs/gpu-h100.md)") if sms else
                             "no matmul shape model (tile shapes of this device not examined)",
                 "kernel_launch": _LAUNCH_SRC if sms else "not modelled",
                 "comm_sms": comm_sms_src or "not modelled: overlapped communication is free"})


# One NCCL collective beside a matmul: an Nsight Systems trace on an H100 (132 SMs) shows
# ncclAllGather running 24 thread blocks while the product waits for them (NVIDIA developer
# forum, "Compute-communication overlap causes severe GEMM performance degradation because
# of tail effect", 2025: forums.developer.nvidia.com/t/337991).
_COMM_SMS_H100 = ("measured by others: ncclAllGather runs 24 thread blocks on an H100 beside a "
                  "GEMM (Nsight Systems; NVIDIA developer forum thread 337991, 2025)")
_COMM_SMS_A100 = ("assumed: the H100 figure (24 blocks); NCCL logs of 8-GPU A100 NVSwitch nodes "
                  "show 20+ collective channels (NVIDIA/Megatron-LM#516)")

_LAUNCH = 10.5e-6
_LAUNCH_SRC = ("measured: 10.5 us per kernel launched back to back from PyTorch on an H100 80GB "
               "HBM3, 2026-11-24 (scripts/gpu_microbench.py)")


PRESETS: dict[str, HardwareSpec] = {
    h.name: h
    for h in [
        # V100 SXM2 32 GB: 125 TFLOP/s fp16 tensor, NVLink2 300 GB/s total (150 each way),
        # 100 Gb/s EDR per GPU in DGX-1 class systems.
        _gpu("v100", fp32=15.7 * T, tf32=15.7 * T, bf16=125 * T, fp8=None, mem_gib=32,
             bw=900 * G, nvlink=150 * G, nic=12.5 * G, gemm_eff=0.8,
             gemm_src="assumed: no published MAMF for V100; 0.8 like its successors"),
        # A100 SXM: 312 TFLOP/s bf16 dense (624 sparse); NVLink3 600 GB/s (300 each way);
        # 200 Gb/s HDR per GPU (DGX A100).
        _gpu("a100-40g", fp32=19.5 * T, tf32=156 * T, bf16=312 * T, fp8=None, mem_gib=40,
             bw=1555 * G, nvlink=300 * G, nic=25 * G, gemm_eff=267.9 / 312, gemm_src=_MAMF,
             attn_peak_frac=0.6, attn_src=_FA2_A100, sms=108, comm_sms=24,
             comm_sms_src=_COMM_SMS_A100),
        _gpu("a100-80g", fp32=19.5 * T, tf32=156 * T, bf16=312 * T, fp8=None, mem_gib=80,
             bw=2039 * G, nvlink=300 * G, nic=25 * G, gemm_eff=267.9 / 312, gemm_src=_MAMF,
             attn_peak_frac=0.6, attn_src=_FA2_A100, sms=108, comm_sms=24,
             comm_sms_src=_COMM_SMS_A100),
        # H100 SXM5: 989 TFLOP/s bf16 dense (1979 sparse); HBM3 3.35 TB/s; NVLink4 900 GB/s
        # (450 each way); 400 Gb/s NDR per GPU. MAMF 792.1; one reading here: an 8192^3
        # bf16 matmul at ~798 TFLOP/s and a device copy at ~3.0 TB/s (0.9 of HBM).
        _gpu("h100-sxm", fp32=67 * T, tf32=494.7 * T, bf16=989.4 * T, fp8=1978.9 * T, mem_gib=80,
             bw=3350 * G, nvlink=450 * G, nic=50 * G, gemm_eff=792.1 / 989.4, gemm_src=_MAMF,
             mem_eff=3.0 / 3.35, mem_src="measured: device-to-device copy ~3.0 TB/s on H100 SXM",
             attn_peak_frac=0.35, attn_src=_FA2_H100, pcie=55 * G, sms=132, comm_sms=24,
             comm_sms_src=_COMM_SMS_H100),
        # H200 SXM: H100 compute with 141 GB HBM3e at 4.8 TB/s.
        _gpu("h200", fp32=67 * T, tf32=494.7 * T, bf16=989.4 * T, fp8=1978.9 * T, mem_gib=141,
             bw=4800 * G, nvlink=450 * G, nic=50 * G, gemm_eff=794.5 / 989.4,
             gemm_src=_MAMF + " (H100/H200 row)", attn_peak_frac=0.35, attn_src=_FA2_H100,
             pcie=55 * G, sms=132, comm_sms=24, comm_sms_src=_COMM_SMS_H100),
        # B200 (HGX): 2.25 PFLOP/s bf16 dense; 180 GB usable HBM3e at 8 TB/s; NVLink5
        # 1.8 TB/s (900 each way); 400 Gb/s per GPU.
        _gpu("b200", fp32=75 * T, tf32=1100 * T, bf16=2250 * T, fp8=4500 * T, mem_gib=180,
             bw=8000 * G, nvlink=900 * G, nic=50 * G, gemm_eff=1745.0 / 2250, gemm_src=_MAMF,
             pcie=55 * G),
        # MI300X: 1307.4 TFLOP/s bf16 dense; 192 GB HBM3 at 5.3 TB/s; 7 Infinity Fabric links
        # of 64 GB/s each way (448 GB/s); 400 Gb/s per GPU.
        _gpu("mi300x", fp32=163.4 * T, tf32=653.7 * T, bf16=1307.4 * T, fp8=2614.9 * T,
             mem_gib=192, bw=5300 * G, nvlink=448 * G, nic=50 * G, gemm_eff=781.9 / 1307.4,
             gemm_src=_MAMF, pcie=55 * G),
        # Ascend 910B: public figures vary by bin; ~320 TFLOP/s fp16 dense, 64 GB HBM2e at
        # 1.6 TB/s, HCCS 392 GB/s total per chip (196 each way), 200 Gb/s RoCE per chip.
        _gpu("ascend-910b", fp32=80 * T, tf32=160 * T, bf16=320 * T, fp8=None, mem_gib=64,
             bw=1600 * G, nvlink=196 * G, nic=25 * G, gemm_eff=0.8,
             gemm_src="assumed: no published MAMF for the 910B",
             spec_src="public reports (Huawei publishes few figures); approximate"),
        # 2 cores of an AMD EPYC (Zen 3, AVX2 only -- no AVX-512, no bf16 units, so bf16
        # matmuls are emulated and ~18x slower than fp32), gloo over shared memory, measured
        # with `ptd calibrate --workers 1,2,4`; values per worker with N workers at once
        # (cores shared past 2). This machine's own profile (measured on the first run, or
        # by `ptd calibrate`) replaces them.
        HardwareSpec(
            name="cpu", kind="cpu", peak_flops={"fp32": 90.8 * G, "bf16": 5.07 * G, "fp16": 5.07 * G},
            memory_bytes=24 * GiB, memory_bandwidth=19.3 * G,
            intra_node=LinkSpec(1.24 * G, 664e-6, 1.0), inter_node=LinkSpec(1.0 * G, 100e-6, 1.0),
            devices_per_node=8, gemm_efficiency=1.0, memory_efficiency=1.0, op_overhead=1.79e-6,
            attention_efficiency=0.33, host_bandwidth=19.3 * G,
            gemm_flops_measured={"fp32": {1: 90.8 * G, 2: 90.4 * G, 4: 43.0 * G},
                                 "bf16": {1: 5.07 * G, 2: 5.06 * G, 4: 2.67 * G}},
            memory_bandwidth_measured={1: 19.3 * G, 2: 14.0 * G, 4: 6.45 * G},
            op_overhead_measured={1: 1.79e-6, 2: 1.77e-6, 4: 3.47e-6},
            overheads_measured={"dtensor_op": {1: 32.5e-6, 2: 34.2e-6, 4: 71.8e-6},
                                "optimizer_tensor": {1: 49.7e-6, 2: 49.6e-6, 4: 107e-6},
                                "optimizer_tensor_dtensor": {1: 337e-6, 2: 332e-6, 4: 702e-6}},
            # (chunk, wait) seconds: a 1 MiB all-reduce in pairs after a chunk of matmuls
            blocking_wait_measured={
                2: ((0.0, 0.0), (1.08e-3, 0.23e-3), (3.48e-3, 0.30e-3), (11.1e-3, 1.51e-3),
                    (27.2e-3, 2.42e-3)),
                4: ((0.0, 0.19e-3), (0.99e-3, 0.60e-3), (4.52e-3, 1.91e-3), (16.9e-3, 3.85e-3),
                    (46.8e-3, 6.68e-3))},
            sources={"all": "ptd calibrate --workers 1,2,4 on a 2-core AMD EPYC (AVX2), "
                            "2026-11-22; collectives: gloo all-reduce fit, group of 2; "
                            "overheads_measured and blocking_wait_measured: ptd calibrate, "
                            "2026-11-23 (docs/benchmarks.md)",
                     "inter_node": "assumed: no second node was measured"}),
    ]
}


def hardware_home() -> Path:
    """Where ``ptd calibrate`` writes profiles: ``$PTD_HOME/hardware`` (``~/.ptd/hardware``)."""
    return ptd_home() / "hardware"


def _number(v: Any) -> float:
    """A TOML number as float; a string or boolean is refused (``float("5")`` would take it)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(v)
    return float(v)


def _link(d: Any, what: str) -> LinkSpec:
    if isinstance(d, LinkSpec):
        return d
    try:
        return LinkSpec(**d)
    except (TypeError, ValueError) as e:
        raise PtdError(f"hardware {what}: bad link table ({e})") from None


def hardware_from_dict(d: dict[str, Any], name: str = "custom") -> HardwareSpec:
    """Build from a TOML/JSON table (``preset = "..."`` plus overrides, or every field)."""
    d = dict(d)
    base = d.pop("preset", None)
    from .typecheck import from_table, refuse_unknown
    refuse_unknown(HardwareSpec, d, name, "hardware")
    for k in ("intra_node", "inter_node"):
        if k in d:
            d[k] = _link(d[k], name)
    try:
        for key in ("gemm_flops_measured", "overheads_measured"):
            if key in d:
                d[key] = {dt: {int(n): _number(r) for n, r in t.items()} for dt, t in d[key].items()}
        for k in ("memory_bandwidth_measured", "op_overhead_measured"):
            if k in d:
                d[k] = {int(n): _number(v) for n, v in d[k].items()}
    except (TypeError, ValueError, AttributeError):
        raise PtdError(f"{name}: measured tables want workers = number (e.g. 1 = 2.5e10)") from None
    if "gemm_shapes_measured" in d:
        try:
            d["gemm_shapes_measured"] = {dt: {str(k): _number(r) for k, r in t.items()}
                                         for dt, t in d["gemm_shapes_measured"].items()}
        except (TypeError, ValueError, AttributeError):
            raise PtdError(f"{name}: gemm_shapes_measured must be a table of dtype tables "
                           '"MxNxK" = number (e.g. fp32."1024x256x64" = 0.8)') from None
    if "attention_shapes_measured" in d:
        try:
            d["attention_shapes_measured"] = {
                dt: {str(k): _number(r) for k, r in t.items() if len(str(k).split("x")) == 4}
                for dt, t in d["attention_shapes_measured"].items()}
        except (TypeError, ValueError, AttributeError):
            raise PtdError(f"{name}: attention_shapes_measured must be a table of dtype tables "
                           '"BxHxSxD" = number (e.g. fp32."4x8x256x32" = 0.3)') from None
        bad = [k for t in d["attention_shapes_measured"].values() for k, r in t.items()
               if not 0 < r < math.inf]
        if bad:
            raise PtdError(f"{name}: attention_shapes_measured[{bad[0]!r}] must be a positive number")
    if "eager_bandwidth_fraction" in d:
        try:
            d["eager_bandwidth_fraction"] = {str(k): _number(v)
                                             for k, v in d["eager_bandwidth_fraction"].items()}
        except (TypeError, ValueError, AttributeError):
            raise PtdError(f"{name}: eager_bandwidth_fraction wants kind = number "
                           "(e.g. activation = 0.2)") from None
    # (key, value) point tables keyed by an integer: workers at once, or a group's size
    waits = "[[chunk, wait], ...] (seconds)"
    for field_name, keyed, point in (("blocking_wait_measured", "workers", waits),
                                     ("blocking_wait_group_measured", "group", waits),
                                     ("dtensor_reduce_measured", "workers", "[[bytes, seconds], ...]"),
                                     ("tp_situ_measured", "workers", "[[bytes, seconds], ...]"),
                                     ("fsdp_situ_measured", "workers", "[[bytes, seconds], ...]")):
        if field_name in d:
            try:
                d[field_name] = {int(n): tuple((float(a), float(b)) for a, b in pts)
                                 for n, pts in d[field_name].items()}
            except (TypeError, ValueError, AttributeError):
                raise PtdError(f"{name}: {field_name} wants {keyed} = {point}") from None
    if "moe_layer_measured" in d:
        try:
            d["moe_layer_measured"] = {
                str(k): {int(n): tuple((float(t), float(f), float(b)) for t, f, b in pts)
                         for n, pts in per.items()}
                for k, per in d["moe_layer_measured"].items()}
        except (TypeError, ValueError, AttributeError):
            raise PtdError(f"{name}: moe_layer_measured wants layer.workers = [[tokens, "
                           "forward s, backward s], ...]") from None
    if "collectives" in d:
        try:
            d["collectives"] = tuple(c if isinstance(c, CollectiveFit) else CollectiveFit(**c)
                                     for c in d["collectives"])
        except TypeError as e:
            raise PtdError(f"{name}: bad collectives table ({e})") from None
    return from_table(HardwareSpec, d, name, base, get_hardware_preset, "hardware")


def get_hardware_preset(name: str) -> HardwareSpec:
    try:
        return PRESETS[name]
    except KeyError:
        raise PtdError(f"unknown hardware {name!r}; choose a preset ({', '.join(PRESETS)}), "
                       f"a calibrated profile in {hardware_home()}, or a .toml file") from None


def load_hardware(ref: str | HardwareSpec) -> HardwareSpec:
    """A preset name, a calibrated profile name (``$PTD_HOME/hardware/NAME.toml``), or a path."""
    if isinstance(ref, HardwareSpec):
        return ref
    if ref in PRESETS:
        return PRESETS[ref]
    path = Path(ref)
    if path.suffix != ".toml":
        candidate = hardware_home() / f"{ref}.toml"
        if candidate.is_file():
            path = candidate
        else:
            return get_hardware_preset(ref)  # raises with the choices
    from .typecheck import read_text_file
    text = read_text_file(path, "hardware")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PtdError(f"cannot parse {path}: {e}") from None
    table = data.get("hardware", data)
    if not isinstance(table, dict):
        raise PtdError(f"hardware {str(path)!r}: [hardware] must be a table")
    try:
        return hardware_from_dict(table, path.stem)
    except PtdError as e:  # name the file the user gave, not only its stem
        import re
        msg = re.sub(r"^(hardware [^:]+: |" + re.escape(path.stem) + ": )", "", str(e))
        raise PtdError(f"hardware {str(path)!r}: {msg}") from None

"""Start the calibration workers together, collect what they measured.

One pool of ``max(workers)`` processes (spawned once: importing torch costs seconds) runs
every phase; for a phase of ``n`` workers the first ``n`` measure and the rest sleep on a
barrier (a semaphore, not a spinning collective). Each worker is one thread
(``OMP_NUM_THREADS=1``), as ptd's training workers are.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from ...children import die_with_parent, terminate_on_sigterm
from .profile import BLOCKING_SIDE
from .fsdp_situ import FSDP_SITU_ROUNDS
from .tp_situ import SITU_ROUNDS

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv")
KiB, MiB = 2**10, 2**20


def op_model(spec: Any = None) -> dict:
    """The model whose forward and backward price one operator on a CPU
    (:func:`ptd.runtime.calibrate.bench.model_op_cost`): ``spec``'s architecture -- its MLP,
    norm, positions, biases, dropout and experts (count, top-k, shared, capacity) -- at
    negligible widths (2 layers, hidden 64, 4 heads, 2 kv heads where it groups them, F 64,
    vocabulary 256), so that its time is the operators' fixed cost, not their work; the
    ``tiny`` preset's without a model. Fields, for the workers."""
    import dataclasses
    from ...specs import get_preset
    s = spec or get_preset("tiny")
    kv = 4 if s.n_kv_heads == s.n_heads else 2
    return dataclasses.asdict(s.replace(name=f"{s.name}-ops", n_layers=2, hidden=64, n_heads=4,
                                        n_kv_heads=kv, ffn_hidden=64, vocab_size=256,
                                        max_seq_len=64))


def make_plan(workers: list[int], dtypes: list[str], quick: bool, device: str,
              model_shapes: list[tuple[int, int, int]] | None = None,
              model_attention: list[tuple[int, int, int, int]] | None = None,
              op_spec: dict | None = None, moe_spec: dict | None = None) -> dict:
    """Sizes, windows and repeats: the default calibration is ~3 minutes on a 2-core CPU,
    ``quick`` ~15 s. ``op_spec``: :func:`op_model`'s fields (CPU; default the tiny
    preset's). ``model_shapes``: products (m, n, k) of a model, measured beside the
    sweep; ``model_attention``: its attention shapes (b, heads, s, head_dim), measured beside
    the default ones (on the smallest worker count, like the sweep); ``moe_spec``: a
    mixture-of-experts model's fields, whose MoE layer is timed (CPU,
    :func:`.bench.moe_layer_times`)."""
    cuda = device == "cuda"
    # pipeline send/recv is always between pairs, so 2 is measured whenever it can be
    group_sizes = sorted({n for n in workers if n >= 2} | ({2} if max(workers) >= 2 else set()))
    if quick:
        # GPUs: sizes whose products and attention are not bound by their launch from Python
        # (at 2 x 16 x 1024 x 128 an H200's SDPA step measured 0.07 of the matmul rate, at
        # 2 x 32 x 4096 x 128 0.58: docs/gpu-h100.md)
        gemm = [2048, 4096, 8192] if cuda else [64, 128, 256, 512]
        coll = [KiB, 32 * KiB, MiB, 4 * MiB]
        attn = [(2, 32, 4096, 128)] if cuda else [(2, 4, 128, 32)]
        p = dict(window_s=0.02, repeats=3, max_call_s=0.03, mem_bytes=(256 if cuda else 48) * MiB,
                 coll_budget=8 * MiB, coll_reps=(2, 10), blocking_chunks={0: 20, 4: 8, 16: 4})
    else:
        gemm = ([512, 1024, 2048, 4096, 8192] if cuda
                else [64, 96, 128, 192, 256, 384, 512, 768])
        coll = [KiB, 4 * KiB, 32 * KiB, 256 * KiB, MiB, 4 * MiB, 16 * MiB]
        if cuda:
            coll += [64 * MiB, 256 * MiB]
        # the default CPU training model (``small``: 8 heads of 32, seq 256, micro-batch 4)
        # and a wider one; on GPUs, Llama-like heads of 128
        attn = ([(4, 16, 2048, 128), (2, 32, 4096, 128)] if cuda
                else [(4, 8, 256, 32), (2, 8, 512, 64)])
        p = dict(window_s=0.03 if cuda else 0.1, repeats=3, max_call_s=0.1,
                 mem_bytes=(1024 if cuda else 64) * MiB,
                 coll_budget=(1024 if cuda else 48) * MiB, coll_reps=(3, 40),
                 # 256x256 matmuls per chunk -> all-reduces timed after it (CPU only); 4
                 # workers on 2 cores: chunks of 0 (back to back), ~1, 5, 20 and 55 ms
                 blocking_chunks={0: 100, 2: 60, 8: 30, 24: 15, 64: 8})
    # the blocking all-reduce: the default CPU model's tensor-parallel activation (4 x 256
    # tokens x 256 hidden, fp32)
    # GPUs: short windows, each after a rest, so that no window runs at the power limit
    # that back-to-back products reach within half a second (bench.Sync.pause)
    return dict(p, device=device, workers=sorted(set(workers)), dtypes=list(dtypes),
                pause_s=0.15 if cuda else 0.0, warmup_s=0.2 if quick else 1.0,
                gemm_shapes=gemm_sweep(cuda, quick, model_shapes),
                blocking_bytes=MiB, blocking_side=BLOCKING_SIDE,
                # tp's all-reduce through DTensor (CPU): the default model's activations are
                # 0.5-2 MiB (bench.dtensor_reduce_curve)
                dtensor_reduce_sizes=([64 * KiB, MiB] if quick
                                      else [16 * KiB, 256 * KiB, MiB, 2 * MiB, 4 * MiB]),
                dtensor_reduce_pairs=20 if quick else 60,
                # FSDP2's per-unit work on a real group (bench.fsdp_unit_group_costs: a
                # one-rank mesh runs none of its collectives); CPU, where it is priced. 60
                # rounds took 4.8 s with two workers and 23 s with four on the 2-core EPYC.
                # Not in a quick one: over 8 rounds four quick calibrations read 0.11-0.56
                # ms a unit forward, 0-0.55 kept backward (gloo's small all-reduces there
                # took 0.23-3.9 ms each); it keeps the one-rank figure
                fsdp_group_rounds=0 if cuda or quick else 20,
                # ptd's tp model on a pair, its collectives in place (tp_situ.py): ~10 s on
                # the 2-core EPYC; left to the full one
                tp_situ_rounds=0 if cuda or quick else SITU_ROUNDS,
                # ptd's ZeRO-3 on that model on a pair (fsdp_situ.py): ~4 s; the full one only
                fsdp_situ_rounds=0 if cuda or quick else FSDP_SITU_ROUNDS,
                gemm_sizes=gemm, attn_shapes=attn,
                attn_model_shapes=_with_small_heads(list(model_attention or []), cuda),
                op_model=None if cuda else (op_spec or op_model()),
                # how much slower a model's work runs on DTensors (bench.model_dtensor_share:
                # 106 -> 127 s for the 2-core EPYC's 1, 2 and 4 workers): left to the full one
                dtensor_share=not quick,
                moe_model=None if cuda else moe_spec,
                coll_sizes=coll, kinds=list(KINDS),
                group_sizes=group_sizes)


SMALL_HEADS = [(8, 8, 128, 8)]
"""On a CPU, also heads of 8 (the tiny models'): the attention kernel runs them far below
the default shapes' heads of 32 and 64 (fp32, 0.08-0.12 of the matmul rate against 0.19-0.39,
on a 2-core AMD EPYC and a 16-core Xeon: docs/calibration.md), and the cost model
interpolates between the head dimensions measured (:func:`ptd.cost.compute.
attention_fraction`). Measured like a model's own shapes: beside the default ones, not in
the median that gives ``attention_efficiency``."""


def _with_small_heads(shapes: list[tuple[int, int, int, int]], cuda: bool
                      ) -> list[tuple[int, int, int, int]]:
    """A model's attention shapes, and on a CPU :data:`SMALL_HEADS` not among them."""
    return shapes if cuda else shapes + [s for s in SMALL_HEADS if s not in shapes]


def gemm_sweep(cuda: bool, quick: bool, extra: list[tuple[int, int, int]] | None = None
               ) -> list[tuple[int, int, int]]:
    """Product shapes (m, n, k) whose rates go to the profile's ``gemm_shapes_measured``,
    smallest first (a worker stops where one call takes too long): on a GPU m, n, k each
    over 256..16384; on a CPU tokens 256..4096 against widths 64..1024. ``quick`` (the
    first-run calibration) measures none, unless a model's shapes are given."""
    if quick:
        grid: list[tuple[int, int, int]] = []
    elif cuda:
        dims = (256, 1024, 4096, 16384)
        grid = [(m, n, k) for m in dims for n in dims for k in dims]
    else:
        grid = [(m, n, k) for m in (256, 1024, 4096) for n in (64, 256, 1024)
                for k in (64, 256, 1024)]
    shapes = set(grid) | {tuple(int(max(1, d)) for d in s) for s in (extra or [])}
    return sorted(shapes, key=lambda s: (s[0] * s[1] * s[2], s))  # type: ignore[return-value]


def stage_labels(plan: dict) -> list[str]:
    """What rank 0 reports as it goes (the progress bar's steps)."""
    out = []
    for n in plan["workers"]:
        out += [f"matmul {dt} x{n}" for dt in plan["dtypes"]]
        if plan.get("gemm_shapes") and n == plan["workers"][0]:
            out += [f"matmul shapes {dt}" for dt in plan["dtypes"]]
        if plan["device"] == "cpu":
            out.append(f"overhead x{n}")
        out += [f"attention {dt} x{n}" for dt in plan["dtypes"]]
        if plan.get("attn_model_shapes") and n == plan["workers"][0]:
            out += [f"attention shapes {dt}" for dt in plan["dtypes"]]
        out.append(f"memory {plan['workers'].index(n) + 1}/{memory_rounds(plan)}")
    for g in plan["group_sizes"]:
        out += [f"{k} g={g}" for k in plan["kinds"] if k != "send_recv" or g == 2]
        if g == 2 and plan["device"] == "cpu":
            out += ["blocking collectives", "DTensor all-reduce"]
            if plan.get("tp_situ_rounds"):
                out.append("tp collectives in place")
            if plan.get("fsdp_situ_rounds"):
                out.append("ZeRO-3 in place")
            if plan.get("fsdp_group_rounds"):
                out.append("FSDP units g=2")
        if g == max(plan["workers"]) and g > 2 and plan["device"] == "cpu":
            if plan.get("fsdp_group_rounds"):
                out.append(f"FSDP units g={g}")
            out.append(f"blocking collectives g={g}")
    out.append(f"memory {memory_rounds(plan)}/{memory_rounds(plan)}")
    return out


def memory_rounds(plan: dict) -> int:
    """Moments at which every worker count's memory bandwidth is timed: after each worker
    count's other stages, and once at the end (after the collectives) -- spread over the
    calibration, because a shared machine's bandwidth changes mode over tens of seconds
    (:func:`.bench.memory_point`)."""
    return len(plan["workers"]) + 1


def _worker(rank: int, nproc: int, plan: dict, store: str, barriers: dict, counters: dict,
            flags: dict, q: Any, timeout: float) -> None:
    try:
        die_with_parent()  # a calibration killed outright takes its workers with it
        import torch
        import torch.distributed as dist

        from . import bench
        torch.set_num_threads(1)
        cuda = plan["device"] == "cuda"
        device = torch.device(f"cuda:{rank}" if cuda else "cpu")
        sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
        if cuda:
            torch.cuda.set_device(device)
        tick = (lambda label: q.put(("tick", label))) if rank == 0 else (lambda label: None)
        out: dict[str, Any] = {"compute": {}, "collectives": {}, "missing": {}}
        # one Sync a worker count for the whole run: its window count is shared by its ranks
        syncs = {n: bench.Sync(n, rank, barriers[n], counters[n], flags[n], sync, timeout,
                               pause=plan.get("pause_s", 0.0))
                 for n in plan["workers"] if rank < n}
        points: dict[int, list[dict[str, float]]] = {n: [] for n in syncs}

        def memory_round(i: int) -> None:
            for n in plan["workers"]:
                barriers[nproc].wait(timeout)
                if rank < n:
                    points[n].append(bench.memory_point(plan, device, syncs[n]))
            tick(f"memory {i}/{memory_rounds(plan)}")

        for i, n in enumerate(plan["workers"], 1):
            barriers[nproc].wait(timeout)
            if rank < n:
                out["compute"][str(n)] = bench.compute_suite(n, plan, device, syncs[n], tick)
            memory_round(i)
        if plan["group_sizes"]:
            barriers[nproc].wait(timeout)
            import datetime
            dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{store}",
                                    rank=rank, world_size=nproc,
                                    timeout=datetime.timedelta(seconds=timeout))
            try:
                out["collectives"], out["missing"] = bench.collective_suite(
                    rank, nproc, plan, device, barriers[nproc], timeout, tick)
            finally:
                dist.destroy_process_group()
        memory_round(memory_rounds(plan))
        for n, pts in points.items():
            out["compute"][str(n)]["memory_points"] = pts  # (the profile takes their mean)
        q.put(("result", rank, out))
    except BaseException:  # noqa: BLE001 - reported to the parent, which stops the rest
        q.put(("error", rank, traceback.format_exc()))


def run_workers(plan: dict, on_tick: Callable[[str], None] = lambda s: None,
                timeout: float = 600.0) -> list[dict]:
    """Run the plan on ``max(workers)`` processes; one result dict per rank."""
    with terminate_on_sigterm():  # SIGTERM: the finally below stops the workers
        return _run_workers(plan, on_tick, timeout)


def _run_workers(plan: dict, on_tick: Callable[[str], None], timeout: float) -> list[dict]:
    nproc = max(plan["workers"])
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    barriers = {n: ctx.Barrier(n) for n in set(plan["workers"]) | {nproc}}
    counters = {n: ctx.Value("l", 0) for n in plan["workers"]}
    flags = {n: ctx.Value("b", 0) for n in plan["workers"]}
    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(prefix="ptd-calibrate-") as tmp:
        store = str(Path(tmp) / "store")
        procs = [ctx.Process(target=_worker, daemon=True, name=f"ptd-calibrate-{r}",
                             args=(r, nproc, plan, store, barriers, counters, flags, q, timeout))
                 for r in range(nproc)]
        try:
            for p in procs:
                p.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        results: dict[int, dict] = {}
        deadline = time.monotonic() + timeout
        try:
            while len(results) < nproc:
                try:
                    msg = q.get(timeout=0.5)
                except queue.Empty:
                    dead = [p for p in procs if p.exitcode not in (None, 0)]
                    if dead:
                        raise RuntimeError(f"calibration worker {dead[0].name} died "
                                           f"(exit code {dead[0].exitcode})") from None
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"calibration did not finish in {timeout:.0f} s")
                    continue
                if msg[0] == "tick":
                    on_tick(msg[1])
                elif msg[0] == "result":
                    results[msg[1]] = msg[2]
                else:
                    raise RuntimeError(f"calibration worker {msg[1]} failed:\n{msg[2]}")
            for p in procs:
                p.join(30)
        finally:
            for p in procs:
                if p.is_alive():
                    p.terminate()
                    p.join(5)
    return [results[r] for r in range(nproc)]

"""ptd calibrate: measure this machine and write a hardware profile for --hardware.

For each worker count N in --workers, N single-threaded worker processes run at once (the
cores and memory are shared, so each gets its share, not a whole core): matmul rate per
dtype (a fit of t = c + FLOPs/R over sizes, each call the three products of a linear
layer's training step), memory bandwidth (large copy and add), per-operator dispatch cost,
and fused causal attention against the matmul rate. Then the
collectives -- all-reduce, all-gather, reduce-scatter, broadcast, all-to-all, send/recv --
over the real backend (gloo on CPU, NCCL on GPUs) for each group size in --workers, with
every worker busy in some group, fitted as t = alpha + bus_factor * bytes / busbw.

The profile overrides --base (default: cpu, or the detected GPU's preset) and goes to
$PTD_HOME/hardware/NAME.toml (~/.ptd/hardware/ without PTD_HOME) unless --out says
otherwise; `--hardware NAME` then finds it. NAME.json beside it keeps every raw timing.

Examples:
  ptd calibrate                                   # ~1.5 min on a 2-core CPU
  ptd calibrate --quick --workers 1,2 --out /tmp/x.toml
  ptd estimate --model small --hardware calibrated --gpus 4 --seq-len 256 --dtype fp32
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import time
from pathlib import Path

from .args import emit_json, path_arg, positive_int, positive_ints
from ..errors import PtdError
from ..fmt import duration, si, table

MODE_SPREAD = 1.25
"""A worker count whose memory bandwidth moved more than this between the calibration's
moments is named (the 2-core VM of docs/calibration.md: 1.9x with 2 workers)."""

HELP = "measure this machine (matmul, memory, overhead, attention, collectives) into a profile"
MAX_WORKERS = 8
CALIBRATED_DTYPES = ("fp32", "bf16", "fp16")


def worker_list(s: str) -> list[int]:
    return positive_ints(s, MAX_WORKERS)


def dtype_list(s: str) -> list[str]:
    v = [x.strip() for x in s.split(",") if x.strip()]
    bad = [x for x in v if x not in CALIBRATED_DTYPES]
    if not v or bad:
        raise argparse.ArgumentTypeError(f"dtypes must be among {','.join(CALIBRATED_DTYPES)}, "
                                         f"got {s!r}")
    return list(dict.fromkeys(v))


def add(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=worker_list, metavar="N,N,...",
                   help=f"worker counts to measure at once (default 1,2,4 on CPU; 1 and the "
                        f"GPU count on GPUs; at most {MAX_WORKERS})")
    p.add_argument("--dtypes", type=dtype_list, metavar="DT,DT",
                   help="matmul/attention dtypes (default fp32,bf16 on CPU; bf16,fp32 on GPUs)")
    p.add_argument("--name", default="calibrated", help="profile name (default calibrated)")
    p.add_argument("--out", type=path_arg, help="profile path, .toml (default $PTD_HOME/hardware/NAME.toml)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing --out file (the default profile is always refreshed)")
    p.add_argument("--base", help="preset the profile overrides (default cpu, or the GPU's)")
    p.add_argument("--quick", action="store_true",
                   help="small sizes, few repeats, no shape sweep (~15 s)")
    p.add_argument("--model", help="also measure this model's own matmul shapes (one block and "
                   "the output layer at --tokens rows, tp 1) and attention shapes (its heads "
                   "at sequence lengths 128, 512, 2048 and its longest; on a CPU, a "
                   "mixture-of-experts model's MoE layer whole, at 64, 512 and 2048 tokens)")
    p.add_argument("--tokens", type=positive_int, default=4096,
                   help="rows of the --model products: micro-batch x sequence (default 4096)")
    p.add_argument("--json", action="store_true", help="print JSON")


def _validate(a: argparse.Namespace) -> Path:
    from ..specs.hardware import PRESETS, hardware_home
    if a.tokens != 4096 and not a.model:
        raise PtdError("--tokens sets the rows of --model's products; give --model too")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", a.name):
        raise PtdError(f"--name must be letters, digits, '_', '-' or '.', got {a.name!r}")
    if a.name in PRESETS:
        raise PtdError(f"--name {a.name!r} is a preset, which --hardware would pick first; "
                       f"choose another")
    if a.base is not None and a.base not in PRESETS:
        raise PtdError(f"unknown --base {a.base!r}; choose a preset ({', '.join(PRESETS)})")
    out = Path(a.out) if a.out else hardware_home() / f"{a.name}.toml"
    if out.suffix != ".toml":
        raise PtdError(f"--out must end in .toml (what --hardware reads as a file), got {out}")
    if out.exists() and out.is_dir():
        raise PtdError(f"--out {out} is a directory")
    if a.out:  # a file the user names is never replaced without --force
        from ..safeio import refuse_overwrite
        refuse_overwrite(out, "--out", a.force)
    from ..safeio import check_writable
    check_writable(out, "--out", kind="file")  # before minutes of measuring, not after
    return out


def model_shapes(ref: str, tokens: int) -> list[tuple[int, int, int]]:
    """(m, n, k) of one block's linear products and the output layer of model ``ref``."""
    from ..cost.compute import Gemm, block_gemms
    from ..specs.model import load_model
    model = load_model(ref)
    if tokens > 2**20:
        raise PtdError(f"--tokens must be at most 2**20, got {tokens}")
    lin, _ = block_gemms(model, tokens, min(tokens, model.max_seq_len), 1, 1)
    lin.append(Gemm(tokens, model.padded_vocab(1), model.hidden))
    return sorted({(int(g.m), int(g.n), int(g.k)) for g in lin if g.m >= 1})


def model_attention_shapes(ref: str, tokens: int) -> list[tuple[int, int, int, int]]:
    """(b, heads, s, head_dim) of model ``ref``'s attention at sequence lengths 128, 512 and
    2048 (those within its ``max_seq_len``) and at ``max_seq_len``, ``b`` holding about
    ``tokens`` tokens: the cost model interpolates between them by sequence length."""
    from ..specs.model import load_model
    model = load_model(ref)
    seqs = sorted({s for s in (128, 512, 2048) if s <= model.max_seq_len}
                  | {min(model.max_seq_len, 8192)})
    return [(max(1, tokens // s), model.n_heads, s, model.head_dim) for s in seqs]


def run(a: argparse.Namespace) -> int:
    out = _validate(a)
    from ..runtime.calibrate import calibrate, detect, gpu_preset, make_plan, stage_labels
    info = detect()
    if info["device"] == "cuda":
        workers = a.workers or sorted({1, info["count"]})
        if workers[-1] > info["count"]:
            raise PtdError(f"--workers {workers[-1]}: only {info['count']} GPU(s) here")
        base = a.base or gpu_preset(info["name"], info["memory_bytes"])
        if base is None:
            raise PtdError(f"no preset matches GPU {info['name']!r}; name one with --base")
        dtypes = a.dtypes or ["bf16", "fp32"]
    else:
        workers, base, dtypes = a.workers or [1, 2, 4], a.base or "cpu", a.dtypes or ["fp32", "bf16"]
    shapes = model_shapes(a.model, a.tokens) if a.model else None
    att = model_attention_shapes(a.model, min(a.tokens, 2048)) if a.model else None
    from ..runtime.calibrate.workers import op_model
    from ..specs.model import load_model
    spec = load_model(a.model) if a.model else None
    ops = op_model(spec) if spec else None
    # a mixture-of-experts model's layer is timed whole (its CPU kernels follow neither
    # bytes nor FLOPs: ptd.specs.hardware, moe_layer_measured)
    moe = dataclasses.asdict(spec) if spec and spec.is_moe else None
    labels = stage_labels(make_plan(workers, dtypes, a.quick, info["device"], shapes, att, ops))
    print(f"ptd calibrate: {info['device']} ({info['name']}), workers {workers}, dtypes {dtypes}"
          f"{', quick' if a.quick else ''}; {len(labels)} stages", file=sys.stderr)
    with _Progress(len(labels)) as tick:
        result = calibrate(workers, dtypes, a.quick, base, a.name, info, tick, model_shapes=shapes,
                           model_attention=att, op_spec=ops, moe_spec=moe)
    from ..runtime.calibrate.quiet import warning
    shared = warning(result["meta"].get("other_load", []), result["meta"]["cpu_count"])
    if shared:  # still written: the user decides, and the JSON keeps every stage's figure
        print(f"ptd calibrate: {shared}", file=sys.stderr, flush=True)
    if info["device"] == "cpu" and not a.quick:
        # the same copy and add from this one process, right after: on a virtual machine
        # where a buffer lands moves the figure (docs/calibration.md), and the pool's
        # processes and a training worker do not always land alike
        from ..runtime.calibrate import drift
        result["meta"]["memory_one_process"] = drift.measure_now()["memory_bandwidth"]
    from ..runtime.calibrate import write_profile
    write_profile(result, out)
    if a.out is None and a.name == "calibrated" and info["device"] == "cpu":
        from ..runtime.calibrate.first_run import machine_profile
        write_profile(result, machine_profile())  # what --hardware auto uses on this machine
    if a.json:
        emit_json({"path": str(out), **{k: result[k] for k in ("hardware", "meta", "summary")}})
    else:
        print(render(result, out))
    return 0


class _Progress:
    """A tqdm bar on a terminal; one line per stage otherwise (logs, tests)."""

    def __init__(self, total: int):
        self.total, self.done, self.t0, self.bar = total, 0, time.monotonic(), None
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, desc="calibrate", unit="stage", file=sys.stderr)
            except ImportError:
                pass

    def __enter__(self):
        return self

    def __call__(self, label: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(label)
            self.bar.update(1)
        else:
            print(f"calibrate [{self.done}/{self.total}] {label} "
                  f"({time.monotonic() - self.t0:.1f} s)", file=sys.stderr, flush=True)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()


def render(result: dict, path: Path) -> str:
    """The printed summary of a calibration."""
    s, hw, meta = result["summary"], result["hardware"], result["meta"]
    lines = [f"calibrated {meta['device_name']} ({meta['device']}, {meta['cpu_count']} cores, "
             f"torch {meta['torch']}) in {meta['seconds']} s; base preset {hw['preset']}",
             f"load average before it started: {meta['load_before']} on {meta['cpu_count']} cores"
             f"{' (other processes shared the machine)' if meta['load_before'] >= 0.5 else ''}"]
    rows = []
    for dt, per_n in s["gemm"].items():
        for n, g in per_n.items():
            rows.append((dt, n, si(g["rate"], "FLOP/s"), duration(g["call_overhead"]),
                         f"{100 * g['rms_rel_err']:.1f}% / {100 * g['max_rel_err']:.1f}%",
                         "  ".join(f"{k}:{v / 1e9:.3g}" for k, v in g["sizes"].items())))
    lines += ["", "matmul per worker, N at once, a training step's three layouts (X W^T, dY W, "
              "dY^T X): t = c + FLOPs/R per product (fit error rms / max; GFLOP/s by size)",
              table(rows, header=("dtype", "N", "R", "c", "fit err", "by size"), align="lrrrrl")]
    for dt, shapes in s.get("gemm_shapes", {}).items():
        r0 = s["gemm"][dt][min(s["gemm"][dt])]["rate"]
        rows = [(key, si(v * r0, "FLOP/s"), f"{v:.2f}") for key, v in shapes.items()]
        lines += ["", f"matmul {dt} by shape (m x n x k), {min(s['gemm'][dt])} worker(s): the "
                  "rate each product of the cost model takes, relative to R",
                  table(rows, header=("shape", "rate", "/ R"), align="lrr")]
    rows = [(n, si(m["copy"], "B/s"), si(m["add"], "B/s"), si(m["value"], "B/s"),
             f"{si(min(m['moments']), 'B/s')}..{si(max(m['moments']), 'B/s')}"
             if m.get("moments") else "-",
             si(m["activation"], "B/s") if "activation" in m else "-",
             *([duration(s["overhead"][n][k]) if k in s["overhead"][n] else "-"
                for k in ("add", "view", "add_autograd", "model", "value")]
               if n in s["overhead"] else ["-"] * 5))
            for n, m in s["memory"].items()]
    lines += ["", "memory bandwidth and operator overhead per worker, N at once (op in model: "
              "ptd's model forward and backward at 8 tokens, per operator; moments: the "
              "bandwidth at each moment it was timed, the kept figure their time's mean)",
              table(rows, header=("N", "copy", "add", "kept", "moments", "SiLU fwd+bwd",
                                  "op add", "op view", "op add+grad", "op in model", "kept"))]
    moved = [(n, m["moments"]) for n, m in s["memory"].items()
             if m.get("moments") and max(m["moments"]) > MODE_SPREAD * min(m["moments"])]
    for n, pts in moved:
        lines.append(f"memory bandwidth with {n} worker(s) moved {max(pts) / min(pts):.2f}x "
                     "during the calibration: runs here will vary as much (a shared "
                     "machine's modes; docs/calibration.md)")
    one = meta.get("memory_one_process")
    if one and s["memory"]:
        kept = s["memory"][min(s["memory"], key=int)]["value"]
        lines += [f"memory from this one process right after: {si(one, 'B/s')} "
                  f"({one / kept:.2f}x the one-worker figure kept)",
                  "  (more than ~10% apart: buffers land unlike on this machine; "
                  "docs/calibration.md)"]
    rows = [(dt, n, shape, si(a["flops_per_s"], "FLOP/s"), f"{a['ratio']:.2f}")
            for dt, per_n in s["attention"].items() for n, att in per_n.items()
            for shape, a in att.items()]
    ratio = s["attention_ratio"]
    lines += ["", "causal SDPA forward+backward (b x h x s x d) vs matmul rate R",
              table(rows, header=("dtype", "N", "shape", "rate", "/ R")),
              f"attention_efficiency = {hw.get('attention_efficiency', '-')}"
              + (f" (measured {ratio:.2f}, clipped to 1)" if ratio and ratio > 1 else "")]
    if s["collectives"]:
        rows = [(c["kind"], c["group_size"], duration(c["alpha"]), si(c["bus_bandwidth"], "B/s"),
                 f"{100 * c['rms_rel_err']:.0f}% / {100 * c['max_rel_err']:.0f}%",
                 f"{len(c['times'])}: {si(min(c['times']), 'B')}..{si(max(c['times']), 'B')}")
                for c in s["collectives"]]
        lines += ["", "collectives: t = alpha + bus_factor * M / busbw (all groups busy at once)",
                  table(rows, header=("kind", "group", "alpha", "busbw", "fit err", "sizes"))]
    def wait_rows(curves: dict) -> list[tuple]:
        return [(n, duration(p[3]) if len(p) > 3 else "-", duration(p[4]) if len(p) > 4 else "-",
                 duration(p[0]), duration(p[2]), duration(p[1]))
                for n, pts in curves.items() for p in pts]
    if s.get("blocking"):
        lines += ["", "a 1 MiB all-reduce in pairs after a chunk of matmuls (tensor parallelism's "
                  "pattern), N at once: wait = chunk + all-reduce as timed - the same chunk timed "
                  "alone just before - the all-reduce fit; priced: the chunk at the N-worker "
                  "matmul rate, where the cost model looks the wait up",
                  table(wait_rows(s["blocking"]),
                        header=("N", "chunk", "alone", "priced", "all-reduce", "wait"))]
    if s.get("blocking_group"):
        lines += ["", "the same in one group of all the workers (G its size), less the group's "
                  "all-reduce fit",
                  table(wait_rows(s["blocking_group"]),
                        header=("G", "chunk", "alone", "priced", "all-reduce", "wait"))]
    if s.get("dtensor_reduce"):
        rows = [(n, si(p[0], "B"), duration(p[2]), duration(p[3]), duration(p[4]), duration(p[1]))
                for n, pts in s["dtensor_reduce"].items() for p in pts]
        lines += ["", "tensor parallelism's all-reduce through DTensor (Partial -> Replicate) in "
                  "pairs, N at once: extra = DTensor - plain - one-rank mesh (medians)",
                  table(rows, header=("N", "bytes", "plain", "DTensor", "one rank", "extra"))]
    if s.get("tp_situ") and hw.get("tp_situ_measured"):
        rows = []
        for n, pts in s["tp_situ"].items():
            for p, (nbytes, resid) in zip(pts, hw["tp_situ_measured"][str(n)]):
                calls = sum(c for _, c in p["all_reduces"])
                rows.append((n, p["tokens"], si(nbytes, "B"), duration(p["tp"]), duration(p["one"]),
                             calls, duration((p["tp"] - p["one"]) / calls),
                             duration(resid)))
        lines += ["", "ptd's tp model in pairs (2 blocks, hidden 256), N at once: a forward and "
                  "backward on the pair and on a one-rank mesh; in place = their difference a "
                  "collective; residual = in place - what the fits, DTensor's extra and the "
                  "blocking wait price it at (added to each collective of a tp pair)",
                  table(rows, header=("N", "tokens", "bytes", "pair", "one rank", "all-reduces",
                                      "in place", "residual"))]
    if s.get("fsdp_situ") and hw.get("fsdp_situ_measured"):
        rows = [(n, p["tokens"], p["units"], duration(sum(p["fsdp"])), duration(sum(p["plain"])),
                 duration((sum(p["fsdp"]) - sum(p["plain"])) / (2 * p["units"])), duration(resid))
                for n, pts in s["fsdp_situ"].items()
                for p, (_, resid) in zip(pts, hw["fsdp_situ_measured"][str(n)])]
        lines += ["", "the same model under ptd's ZeRO-3 in pairs (a unit a block and the root), "
                  "N at once: a forward and backward with and without FSDP; in place = their "
                  "difference a gather (each unit twice); residual = in place - what ptd "
                  "estimate prices ZeRO-3 at (charged on each ZeRO-3 gather of a pair)",
                  table(rows, header=("N", "tokens", "units", "ZeRO-3", "plain", "in place",
                                      "residual"))]
    fw = s.get("framework", {})
    if fw.get("fsdp_unit_forward"):
        rows = [(n, duration(fw["fsdp_unit_forward"][n]), duration(fw["fsdp_unit_backward"][n]),
                 duration(fw["fsdp_unit_keep_forward"][n]), duration(fw["fsdp_unit_keep_backward"][n]),
                 "group of N" if n in s.get("fsdp_group", {}) else "one-rank mesh")
                for n in sorted(fw["fsdp_unit_forward"])]
        lines += ["", "FSDP2's own work a unit and micro-batch, N at once, beyond the model and "
                  "the collectives (ZeRO-3 resharded; ZeRO-1/2 kept)",
                  table(rows, header=("N", "forward", "backward", "kept fwd", "kept bwd",
                                      "timed on"))]
    if s.get("moe_layer"):
        rows = [(key, n, int(t), duration(f), duration(b))
                for key, per in s["moe_layer"].items() for n, pts in per.items()
                for t, f, b in pts]
        lines += ["", "the model's MoE layer as ptd trains it, N at once (the cost model prices "
                  "the layer by these, linear in tokens)",
                  table(rows, header=("layer", "N", "tokens", "forward", "backward"))]
    for kind, err in s["missing"].items():
        lines.append(f"not measured: {kind} ({err}); the cost model uses the link for it")
    from ..specs.hardware import hardware_home
    home = path.parent.resolve() == hardware_home().resolve()
    lines += ["", f"wrote {path}  (use: --hardware {path.stem if home else path}); raw timings "
              f"and fits in {path.with_suffix('.json').name}"]
    return "\n".join(lines)

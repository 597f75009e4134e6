"""ptd estimate: memory, step time, throughput and MFU of one plan, predicted in pure Python.

Knobs left out are chosen, not defaulted: without --micro-batch, --zero, --recompute,
--vpp, --schedule or --sp/--no-sp, the cost model picks the fastest value that fits in
memory and says what it picked. --dp defaults to gpus / (tp * pp).

Examples:
  ptd estimate --model llama3-8b --hardware h100-sxm --gpus 8
  ptd estimate --model llama3-70b --hardware h100-sxm --gpus 512 --tp 8 --pp 4 --json
  ptd estimate --model gpt2 --hardware cpu --gpus 4 --seq-len 256 --global-batch 32 --dtype fp32
"""

from __future__ import annotations

import argparse

from ..cost.stacks import STACKS
from .args import emit_json, nonneg_int, positive_float, positive_int
from ..errors import PtdError
from ..fmt import duration, gib, pct, si, table

HELP = "predict memory, step time, throughput and MFU of a plan (instant, no torch)"


def add_plan_flags(p: argparse.ArgumentParser, *, world_flag: str = "--gpus") -> None:
    """Model/hardware/plan flags shared by ``estimate`` and ``plan``."""
    p.add_argument("--model", default="llama3-8b",
                   help="preset, ptd .toml or Hugging Face config.json (default llama3-8b)")
    p.add_argument("--hardware", default="h100-sxm",
                   help="preset, calibrated profile name, or .toml (default h100-sxm)")
    p.add_argument(world_flag, dest="gpus", type=positive_int, default=8, help="devices in all (8)")
    p.add_argument("--gpus-per-node", type=positive_int, help="devices per node (hardware's own)")
    p.add_argument("--nodes-per-leaf", type=positive_int, metavar="N",
                   help="nodes one leaf switch layer joins without the spine (rail-optimised: "
                   "the leaf's downlinks, e.g. 32; top of rack: downlinks / NICs per node); "
                   "with --spine-oversubscription")
    p.add_argument("--spine-oversubscription", type=positive_float, metavar="R",
                   help="leaf downlink:uplink bandwidth, e.g. 2 for 2:1 (default 1, full "
                   "bisection): collectives spanning more than --nodes-per-leaf nodes get "
                   "the network bandwidth / R")
    p.add_argument("--global-batch", type=positive_int,
                   help="sequences per step (default: ~4M tokens, a multiple of dp)")
    p.add_argument("--seq-len", type=positive_int, help="tokens per sequence (model's, at most 8192)")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    p.add_argument("--tokens", type=positive_float,
                   help="tokens to train, for time to train (default 20 per parameter)")
    p.add_argument("--stack", choices=list(STACKS), default="ptd",
                   help="framework whose behaviour to price (attention kernels, overlap, "
                        "schedules, ZeRO-3 gathers): ptd (default), megatron-2021, "
                        "megatron-core, torchtitan, deepspeed, deepspeed-2021; see "
                        "docs/validation.md")
    p.add_argument("--attention", choices=["flash", "scores"],
                   help="fused attention (flash) or one that stores s*s scores (default: the "
                        "stack's; ptd: flash)")
    p.add_argument("--convention", choices=["ptd", "zero", "megatron"],
                   help="model-state bytes: ptd runtime (4+4+8), ZeRO paper (2+2+12) or "
                        "Megatron-LM (2+4+12, distributed optimizer over dp*cp); default: "
                        "the stack's (megatron-core: megatron, the others: ptd)")
    p.add_argument("--dp-comm", choices=["allreduce", "ps"], default="allreduce",
                   help="data-parallel gradients by all-reduce (default) or through a "
                        "synchronous parameter server (--servers S; zero 0/1)")
    p.add_argument("--servers", type=positive_int, help="parameter servers S (--dp-comm ps)")
    p.add_argument("--no-dp-overlap", action="store_true",
                   help="gradient reduction runs after backward instead of overlapping it")
    p.add_argument("--moe-imbalance", type=float, default=1.0, metavar="X",
                   help="MoE: busiest expert-parallel rank's load over the mean, from 1 to "
                        "n_experts / top_k (every token on the same experts) (1)")
    p.add_argument("--json", action="store_true", help="print JSON")


def add(p: argparse.ArgumentParser) -> None:
    add_plan_flags(p)
    # (estimate's own: ptd plan prices modes with --tp-modes, 2.5d at depth 2)
    p.add_argument("--tp-mode", choices=["1d", "2d", "2.5d", "3d"], default="1d",
                   help="also price tensor parallelism as 2D (tp = q^2), 2.5D (q^2 x --depth) or "
                        "3D (q^3) beside the 1D plan (priced only; ptd train runs 1d, and 2d with --tp-mode 2d)")
    p.add_argument("--depth", type=positive_int, default=1, help="2.5D's depth d (--tp-mode 2.5d)")
    p.add_argument("--dp", type=positive_int, help="data parallel (default gpus/(tp*pp))")
    p.add_argument("--tp", type=positive_int, default=1, help="tensor parallel (1)")
    p.add_argument("--pp", type=positive_int, default=1, help="pipeline parallel (1)")
    p.add_argument("--ep", type=positive_int, default=1,
                   help="expert parallel (MoE; carved out of dp, docs/moe.md) (1)")
    p.add_argument("--cp", type=positive_int, default=1,
                   help="context parallel (1): sequence split over cp ranks, K/V exchanged per layer")
    p.add_argument("--vpp", type=positive_int, help="virtual stages per pipeline rank (chosen)")
    p.add_argument("--zero", type=nonneg_int, choices=[0, 1, 2, 3], help="ZeRO stage (chosen)")
    p.add_argument("--sp", action=argparse.BooleanOptionalAction, default=None,
                   help="sequence parallel (chosen when tp > 1)")
    p.add_argument("--micro-batch", type=positive_int, help="sequences per micro-batch (chosen)")
    p.add_argument("--recompute", choices=["none", "selective", "full"], help="(chosen)")
    p.add_argument("--schedule", choices=["gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"],
                   help="pipeline schedule (chosen when pp > 1)")
    p.add_argument("--offload", action="store_true", help="optimizer/params in host memory (zero>=2)")
    p.add_argument("--uneven-stages", action="store_true",
                   help="allow layers not divisible by pp*vpp (split balanced by cost)")


def resolve(a: argparse.Namespace):
    """(model, cluster, options, tokens) from the shared flags."""
    import dataclasses

    from ..cost.stacks import stack_options
    from ..specs import ClusterSpec, load_hardware, load_model

    model = load_model(a.model)
    hw = load_hardware(a.hardware)
    leaf, over = getattr(a, "nodes_per_leaf", None), getattr(a, "spine_oversubscription", None)
    if (leaf is None) != (over is None):
        raise PtdError("--nodes-per-leaf and --spine-oversubscription go together")
    if leaf is not None:
        hw = dataclasses.replace(hw, nodes_per_leaf=leaf, spine_oversubscription=over)
    cluster = ClusterSpec(hw, a.gpus, a.gpus_per_node or 0)
    check_moe_imbalance(a.moe_imbalance, model)
    dp_comm, servers = getattr(a, "dp_comm", "allreduce"), getattr(a, "servers", None)
    if (dp_comm == "ps") != (servers is not None):
        raise PtdError("--dp-comm ps and --servers S go together")
    opts = dataclasses.replace(stack_options(a.stack), moe_imbalance=a.moe_imbalance,
                               ps_servers=servers or 0)
    if a.convention:
        opts = dataclasses.replace(opts, convention=a.convention)
    if a.attention:
        opts = dataclasses.replace(opts, attention=a.attention)
    if a.no_dp_overlap:
        opts = dataclasses.replace(opts, dp_overlap=False)
    return model, cluster, opts


def check_moe_imbalance(x: float, model) -> None:
    """The busiest expert-parallel rank's load over the mean: at least 1, and at most what
    sending every token to the same ``top_k`` experts gives (``n_experts / top_k``)."""
    if x == 1.0:
        return
    if not model.n_experts:
        raise PtdError(f"--moe-imbalance applies to mixture-of-experts models; {model.name} is dense")
    most = model.n_experts / model.top_k  # (a model with experts has top_k >= 1)
    if not 1.0 <= x <= most:  # also refuses nan and inf
        raise PtdError(f"--moe-imbalance must be between 1 and n_experts / top_k = {most:g} "
                       f"(max/mean load), got {x}")


def default_seq_len(model) -> int:
    return min(model.max_seq_len, 8192)


def run(a: argparse.Namespace) -> int:
    from ..cost.estimate import choose, default_global_batch, estimate
    from ..specs import ParallelPlan

    model, cluster, opts = resolve(a)
    tp, pp, cp = a.tp, a.pp, a.cp
    if a.dp is None:
        if a.gpus % (tp * pp * cp):
            raise PtdError(f"{a.gpus} devices are not divisible by tp*pp*cp = {tp}*{pp}*{cp}")
        dp = a.gpus // (tp * pp * cp)
    else:
        dp = a.dp
    from ..flagcheck import pipeline_only
    pipeline_only(a.schedule, a.uneven_stages, pp)
    seq = a.seq_len or default_seq_len(model)
    gb = a.global_batch or default_global_batch(seq, dp)
    free = []
    fixed = dict(dp=dp, tp=tp, pp=pp, ep=a.ep, cp=cp, global_batch=gb, seq_len=seq, dtype=a.dtype, offload=a.offload,
                 uneven_stages=a.uneven_stages)
    zero = a.zero
    if opts.ps_servers:  # a parameter server replaces DDP's all-reduce; ZeRO-1/2/3 reduce-scatter
        if zero:
            raise PtdError(f"--dp-comm ps prices zero 0 (gradients pushed whole), not zero {zero}")
        zero = 0 if zero is None else zero
    for knob, val, default in [("micro_batch", a.micro_batch, 1), ("zero", zero, 0),
                               ("recompute", a.recompute, "none"), ("vpp", a.vpp, 1),
                               ("schedule", a.schedule, "1f1b"), ("sp", a.sp, False)]:
        if val is None:
            free.append(knob)
            fixed[knob] = default
        else:
            fixed[knob] = val
    if fixed["vpp"] > 1 and a.schedule is None:
        fixed["schedule"] = "interleaved-1f1b"
    base = ParallelPlan(**fixed)
    # as ptd plan does: layers that do not divide over the stages are split by cost (stated,
    # not refused); each candidate of a free vpp or schedule decides for its own stages
    auto_uneven = pp > 1 and not a.uneven_stages
    if auto_uneven and model.n_layers % base.n_stages:
        base = base.replace(uneven_stages=True)
    base.validate(model if a.ep > 1 else None, cluster.n_devices)
    if free:
        from ..runtime.launch.limits import plan_problem  # (imports no torch)
        e = choose(model, cluster, base, free, a.tokens, opts,
                   refuse=lambda p: plan_problem(model, p), auto_uneven=auto_uneven)
    else:
        e = estimate(model, cluster, base, a.tokens, opts)
    extra: dict[str, str] = {}
    if auto_uneven and e.plan.uneven_stages:
        extra["uneven_stages"] = (f"True ({model.n_layers} layers do not divide over "
                                  f"{e.plan.n_stages} stages)")
    from ..planner.search import runtime_refuses
    runtime_refuses(model, e.plan)  # the rules ptd train applies (one validator)
    mode = _tp_mode(a, model, e)
    if a.json:
        emit_json(e.to_json() | {"dp_comm": a.dp_comm, "servers": a.servers,
                                 "vocab": {"size": model.vocab_size, "multiple": model.vocab_multiple,
                                           "padded": model.padded_vocab(e.plan.tp)},
                                 "activation_convention": activation_figures(
                                     e.model, e.plan, opts, cluster.hardware)}
                  | ({"tp_mode": mode} if mode else {}))
    else:
        print(render(e, extra, opts))
        if mode:
            print(render_tp_mode(mode))
        if opts.ps_servers:
            print(f"(data-parallel gradients through {opts.ps_servers} synchronous parameter "
                  f"server{'s' if opts.ps_servers > 1 else ''}: dp_comm above)")
    return 0


def _tp_mode(a: argparse.Namespace, model, e) -> dict | None:  # type: ignore[no-untyped-def]
    """The 2D/2.5D/3D pricing of ``--tp-mode`` (None for 1d); bad shapes are one line."""
    if a.depth != 1 and a.tp_mode != "2.5d":
        raise PtdError("--depth applies to --tp-mode 2.5d only")
    if a.tp_mode == "1d":
        return None
    if e.plan.tp < 2:
        raise PtdError(f"--tp-mode {a.tp_mode} needs --tp > 1")
    from ..bench.tp_table import mode_delta
    return mode_delta(model, e, a.tp_mode, a.depth)


def render_tp_mode(d: dict) -> str:  # type: ignore[type-arg]
    """The ``--tp-mode`` lines under the estimate."""
    shape = f"q = {d['q']}" + (f", depth {d['depth']}" if d["mode"] == "2.5d" else "")
    return "\n".join([
        "", f"tensor parallelism as {d['mode']} ({shape}), priced only: ptd train runs 1d, "
            f"and 2d with --tp-mode 2d",
        f"  tp communication  {duration(d['tp_comm_s'])} per step "
        f"({duration(d['comm_per_block_s'])} per block; 1d above: {duration(d['tp_comm_1d_s'])})",
        f"  step time         {duration(d['step_time_s'])} (1d above: {duration(d['step_time_1d_s'])})",
        f"  layer inputs      {gib(d['layer_inputs_per_device_bytes'])} per device "
        f"(1d without sp: {gib(d['layer_inputs_per_device_1d_bytes'])})"])


def render(e, extra: dict[str, str] | None = None, opts=None) -> str:
    """The human report of one :class:`~ptd.cost.estimate.Estimate` (``extra``: settings
    made for the user, shown on the ``chosen:`` line)."""
    m, c, p = e.model, e.cluster, e.plan
    lines = [f"{m.name} ({si(m.param_count())} params) on {c.n_devices} x {c.hardware.name} "
             f"({c.n_nodes} node{'s' if c.n_nodes > 1 else ''} of {c.devices_per_node})",
             f"plan: {p.describe()}  seq {p.seq_len}  {p.dtype}  "
             f"({p.n_microbatches} micro-batch{'es' if p.n_microbatches > 1 else ''}/step)"]
    chosen = {**(e.chosen or {}), **(extra or {})}
    if p.uneven_stages and p.pp > 1:
        from ..cost.params import layers_per_rank
        chosen["layers per pipeline rank"] = "/".join(map(str, layers_per_rank(m, p)))
    if chosen:
        lines.append("chosen: " + ", ".join(f"{k}={v}" for k, v in chosen.items()))
    if note := m.padding_note(p.tp):
        lines.append(note)
    mem = e.memory
    rows = [(k, gib(getattr(mem, k)), pct(getattr(mem, k) / mem.total if mem.total else 0))
            for k in ("params", "grads", "optimizer", "activations", "buffers")]
    rows.append(("total", gib(mem.total),
                 f"{'fits' if mem.fits else 'DOES NOT FIT'} in {gib(c.hardware.usable_memory)}"
                 + (f" of {gib(c.hardware.memory_bytes)}" if c.hardware.memory_reserved else "")))
    lines += ["", "memory per device", table(rows, header=("part", "bytes", "share"), align="lrr")]
    lines.append(activation_convention(m, p, opts, c.hardware))
    st = e.step
    rows = [(k, duration(getattr(st, k)), pct(getattr(st, k) / st.total))
            for k in ("compute", "tp_comm", "pp_comm", "dp_comm_exposed", "bubble", "optimizer")
            + (("ep_comm",) if p.ep > 1 else ())]
    if st.overlap > 0:  # hidden collectives taking multiprocessors from the products
        rows.append(("overlap", duration(st.overlap), pct(st.overlap / st.total)))
    if p.cp > 1:
        rows.append(("cp_comm", duration(st.cp_comm),
                     f"{pct(st.cp_comm / st.total)} (of {duration(st.cp_comm_total)} K/V exchange)"))
    rows.append(("total", duration(st.total), ""))
    lines += ["", "step time", table(rows, header=("part", "time", "share"), align="lrr"),
              st.bound()]
    n = c.n_devices
    rows = [("tokens/s", si(e.tokens_per_s)), ("tokens/s per device", si(e.tokens_per_s / n)),
            ("model TFLOP/s per device", f"{e.flops.model * e.tokens_per_s / n / 1e12:.1f}"),
            ("MFU", pct(e.mfu)), ("HFU", pct(e.hfu)),
            (f"time to train {si(e.tokens)} tokens", duration(e.time_to_train_s))]
    lines += ["", "throughput", table(rows, align="lr")]
    return "\n".join(lines)


def activation_figures(m, p, opts=None, hw=None) -> dict:
    """Which activation count the report uses, and both counts for the same plan under the
    one recompute setting Megatron-LM's formula describes (selective, with sp when tp > 1).
    ptd's count follows the estimate's options (``opts``, ``hw``: autocast, fused norms)."""
    from ..cost.estimate import CostOptions, autocast, fused_norm
    from ..cost.megatron_memory import megatron_activation_bytes
    from ..cost.memory import activation_bytes
    opts = opts or CostOptions()
    sel = p.replace(recompute="selective", sp=p.tp > 1)
    ours = activation_bytes(m, sel, opts.attention, opts.gqa_expanded,
                            fused_norm=fused_norm(opts, hw) if hw is not None else True,
                            autocast=autocast(opts, sel), fused_swiglu=opts.fused_swiglu,
                            expert_tp=opts.expert_tp, sp_gathered=opts.sp_gathered)
    fused = "fused" if opts.fused_swiglu and m.mlp == "swiglu" else "unfused"
    return {"used": "ptd", "ptd": f"tensor by tensor ({m.mlp} MLP {fused})",
            "megatron": "Megatron-LM's formula (a GPT block)",
            "selective_sp": sel.sp, "ptd_selective_bytes": ours,
            "megatron_selective_bytes": megatron_activation_bytes(m, sel)}


def activation_convention(m, p, opts=None, hw=None) -> str:
    """The report's line for :func:`activation_figures`."""
    f = activation_figures(m, p, opts, hw)
    return (f"activations: ptd's count, {f['ptd']}; with selective "
            f"recompute{' + sp' if f['selective_sp'] else ''} it gives "
            f"{gib(f['ptd_selective_bytes'])}, {f['megatron']} {gib(f['megatron_selective_bytes'])}")

"""ptd plan --export: ptd configs load and validate; torchtitan, Megatron-LM and DeepSpeed
exports use only those projects' documented option names (written down here, with where
they come from; nothing is installed)."""

import json
import re

import pytest

from helpers import cluster, export_spread
from ptd.cost.estimate import CostOptions
from ptd.planner import export as X
from ptd.planner import export_deepspeed
from ptd.planner.search import search
from ptd.specs import get_preset, load_config
from ptd.errors import PtdError

# ---------------------------------------------------------------- torchtitan
# torchtitan 0.3.0: the flags of `python -m torchtitan.config.manager --module llama3
# --config llama3_8b --help` that ptd writes (fields of torchtitan/config/configs.py and the
# optimizer/lr-scheduler containers). tests/test_export_interop.py parses them with
# torchtitan itself; this spread of plans (MoE, GPT-2, fp16/fp32) is checked by name only.
TORCHTITAN_FLAGS = {
    "--module", "--config", "--parallelism.data-parallel-replicate-degree",
    "--parallelism.data-parallel-shard-degree", "--parallelism.fsdp-reshard-after-forward",
    "--parallelism.tensor-parallel-degree", "--parallelism.enable-sequence-parallel",
    "--parallelism.no-enable-sequence-parallel", "--parallelism.pipeline-parallel-degree",
    "--parallelism.pipeline-parallel-schedule", "--parallelism.pipeline-parallel-microbatch-size",
    "--parallelism.module-fqns-per-model-part", "--training.local-batch-size",
    "--training.disable-cuda-graphs", "--training.global-batch-size", "--training.seq-len",
    "--training.steps", "--training.mixed-precision-param", "--training.enable-cpu-offload",
    "--training.no-enable-cpu-offload", "--training.max-norm",
    "--optimizer.param-groups.0.optimizer-kwargs.lr",
    "--optimizer.param-groups.0.optimizer-kwargs.betas",
    "--optimizer.param-groups.0.optimizer-kwargs.eps",
    "--optimizer.param-groups.0.optimizer-kwargs.weight-decay", "--lr-scheduler.warmup-steps",
    "--lr-scheduler.decay-type", "--lr-scheduler.min-lr-factor", "--debug.seed",
    "--parallelism.expert-parallel-degree", "--parallelism.context-parallel-degree",
    "--parallelism.context-parallel-load-balancer",
}
# torch.distributed.pipelining.schedules.get_schedule_class (torch 2.13)
TORCHTITAN_SCHEDULES = {"1F1B", "Interleaved1F1B", "GPipe", "LoopedBFS", "InterleavedZeroBubble",
                        "PipelineScheduleSingle", "PipelineScheduleMulti", "ZBVZeroBubble",
                        "DualPipeV"}


def parse_torchtitan(text):
    """{flag: [values]} and the activation-checkpoint subcommand of a launch script."""
    import shlex
    toks = shlex.split(text.split("-m torchtitan.train", 1)[1].replace("\\\n", " "))
    args, flag, sub = {}, None, None
    for t in toks:
        if t.startswith("--"):
            flag = t
            args[flag] = []
        elif t.startswith("activation-checkpoint:"):
            sub = t.split(":", 1)[1]
        else:
            args[flag].append(t)
    return args, sub


# ----------------------------------------------------------------- Megatron-LM
# megatron/training/arguments.py (NVIDIA/Megatron-LM, core_r0.19.0): every flag ptd writes,
# with its choices where the parser restricts them (None: free value or store_true).
MEGATRON_FLAGS = {
    "--num-layers": None, "--hidden-size": None, "--ffn-hidden-size": None,
    "--num-attention-heads": None, "--group-query-attention": None, "--num-query-groups": None,
    "--kv-channels": None, "--seq-length": None, "--max-position-embeddings": None,
    "--position-embedding-type": {"learned_absolute", "rope", "mrope", "relative", "none"},
    "--rotary-base": None, "--normalization": {"LayerNorm", "RMSNorm"}, "--norm-epsilon": None,
    "--swiglu": None, "--untie-embeddings-and-output-weights": None,
    "--disable-bias-linear": None, "--attention-dropout": None, "--hidden-dropout": None,
    "--num-experts": None, "--moe-router-topk": None, "--init-method-std": None,
    "--tokenizer-type": {"BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer",
                         "SentencePieceTokenizer", "GPTSentencePieceTokenizer",
                         "HuggingFaceTokenizer", "Llama2Tokenizer", "TikTokenizer",
                         "MultimodalTokenizer", "NullTokenizer", "NullMultimodalTokenizer",
                         "SFTTokenizer"},
    "--vocab-size": None, "--make-vocab-size-divisible-by": None,
    "--attention-backend": {"flash", "fused", "unfused", "local", "auto"},
    "--tensor-model-parallel-size": None, "--pipeline-model-parallel-size": None,
    "--sequence-parallel": None, "--num-layers-per-virtual-pipeline-stage": None,
    "--num-virtual-stages-per-pipeline-rank": None, "--decoder-first-pipeline-num-layers": None,
    "--decoder-last-pipeline-num-layers": None, "--micro-batch-size": None,
    "--global-batch-size": None, "--bf16": None, "--fp16": None,
    "--recompute-granularity": {"full", "selective"}, "--recompute-method": {"uniform", "block"},
    "--recompute-num-layers": None, "--use-distributed-optimizer": None,
    "--use-megatron-fsdp": None,
    "--data-parallel-sharding-strategy": {"no_shard", "optim", "optim_grads", "optim_grads_params"},
    "--optimizer-cpu-offload": None, "--use-precision-aware-optimizer": None,
    "--ckpt-format": {"torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor"},
    "--overlap-grad-reduce": None,
    "--overlap-param-gather": None, "--train-iters": None, "--lr": None, "--min-lr": None,
    "--lr-decay-style": {"constant", "linear", "cosine", "inverse-square-root", "WSD"},
    "--lr-warmup-iters": None, "--weight-decay": None, "--adam-beta1": None,
    "--adam-beta2": None, "--adam-eps": None, "--clip-grad": None, "--seed": None,
}

# core_r0.19: the exact stage split, Megatron-FSDP's checkpoint format, offload's optimizer
MEGATRON_FLAGS.update({"--pipeline-model-parallel-layout": None,
                       "--use-precision-aware-optimizer": None,
                       "--ckpt-format": {"torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor"}})
# experts, routing and the context-parallel exchange (moe and parallelism groups)
MEGATRON_FLAGS.update({"--moe-ffn-hidden-size": None, "--moe-shared-expert-intermediate-size": None,
                       "--moe-router-load-balancing-type": {"aux_loss", "seq_aux_loss",
                                                            "global_aux_loss", "sinkhorn", "none"},
                       "--moe-aux-loss-coeff": None, "--moe-z-loss-coeff": None,
                       "--moe-expert-capacity-factor": None,
                       "--moe-token-dispatcher-type": {"allgather", "alltoall", "flex"},
                       "--expert-model-parallel-size": None, "--context-parallel-size": None,
                       # passed on to Transformer Engine's attention, whose names these are
                       "--cp-comm-type": {"p2p", "all_gather", "a2a", "a2a+p2p"}})
for _gone in ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
              "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"):
    del MEGATRON_FLAGS[_gone]  # ptd states the split with the layout instead

# ------------------------------------------------------------------- DeepSpeed
# docs/_pages/config-json.md (deepspeedai/DeepSpeed): the ds_config keys ptd writes.
DS_TOP = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
          "gradient_clipping", "zero_optimization", "optimizer", "steps_per_print", "bf16",
          "fp16", "tensor_parallel", "activation_checkpointing", "scheduler", "seed"}
DS_NESTED = {
    "zero_optimization": {"stage", "overlap_comm", "contiguous_gradients", "offload_optimizer",
                          "offload_param", "reduce_scatter", "allgather_partitions"},
    "optimizer": {"type", "params"}, "scheduler": {"type", "params"},
    "bf16": {"enabled"}, "fp16": {"enabled"},
    "tensor_parallel": {"autotp_size", "preset_model", "tp_overlap_comm", "partition_config"},
    "activation_checkpointing": {"partition_activations", "cpu_checkpointing",
                                 "contiguous_memory_optimization", "number_checkpoints",
                                 "synchronize_checkpoint_boundary", "profile"},
}
DS_ADAMW_PARAMS = {"lr", "betas", "eps", "weight_decay"}
DS_OFFLOAD = {"device", "nvme_path", "pin_memory", "buffer_count", "fast_init", "ratio"}
# deepspeed/runtime/pipe/module.py: PipelineModule.__init__ keyword arguments
PIPELINE_MODULE_KWARGS = {"num_stages", "topology", "loss_fn", "seed_layers", "seed_fn",
                          "base_seed", "partition_method", "activation_checkpoint_interval",
                          "activation_checkpoint_func", "checkpointable_layers",
                          "dynamic_shape"}


@pytest.fixture(scope="module")
def plans():
    """helpers.EXPORT_SPREAD: winners and runners-up covering every feature (below)."""
    return export_spread()


def test_spread_covers_the_features(plans):
    ps = [e.plan for e in plans]
    assert {p.zero for p in ps} == {0, 1, 2, 3}
    assert {p.recompute for p in ps} == {"none", "selective", "full"}
    assert {p.schedule for p in ps if p.pp > 1} == {"gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"}
    assert any(p.uneven_stages for p in ps) and any(p.offload for p in ps)
    assert any(p.sp for p in ps) and any(p.tp > 1 and not p.sp for p in ps)
    assert {p.dtype for p in ps} == {"fp32", "bf16", "fp16"}


def test_ptd_export_loads_and_validates(plans, tmp_path):
    for i, e in enumerate(plans):
        text = X.export(e, "ptd", hardware="h100-sxm", steps=7, out="runs/x")
        path = tmp_path / f"p{i}.toml"
        path.write_text(text)
        cfg = load_config(path)
        cfg.validate(e.plan.world_size)
        assert cfg.plan == e.plan and cfg.model == e.model
        assert cfg.steps == 7 and cfg.out == "runs/x" and cfg.hardware == "h100-sxm"
        assert cfg == X.train_config(e, "h100-sxm", 7, "runs/x")


def test_torchtitan_export_uses_documented_flags(plans):
    for e in plans:
        p = e.plan
        text = X.export(e, "torchtitan")
        assert text.startswith("#!/usr/bin/env bash") and "torchrun" in text
        args, sub = parse_torchtitan(text)
        assert set(args) <= TORCHTITAN_FLAGS, set(args) - TORCHTITAN_FLAGS
        assert sub == p.recompute
        one = {k: v[0] for k, v in args.items() if v}
        assert int(one["--parallelism.tensor-parallel-degree"]) == p.tp
        assert int(one["--parallelism.pipeline-parallel-degree"]) == p.pp
        assert (int(one["--parallelism.data-parallel-replicate-degree"])
                * int(one["--parallelism.data-parallel-shard-degree"])) == p.dp
        assert int(one["--training.global-batch-size"]) == p.global_batch
        assert int(one["--training.seq-len"]) == p.seq_len
        if p.pp > 1:
            assert one["--parallelism.pipeline-parallel-schedule"] in TORCHTITAN_SCHEDULES
            parts = args["--parallelism.module-fqns-per-model-part"]
            assert len(parts) == p.n_stages
            assert [sum(m.startswith("layers.") for m in part.split(",")) for part in parts] \
                == list(X.stages(e))
            local, mb = int(one["--training.local-batch-size"]), int(one["--parallelism.pipeline-parallel-microbatch-size"])
            assert local // mb == p.n_microbatches
        else:
            assert p.global_batch // (int(one["--training.local-batch-size"]) * p.dp) == p.n_microbatches


def parse_megatron(text):
    import shlex
    body = text.split("pretrain_gpt.py", 1)[1].replace("\\\n", " ")
    tokens = [t for t in shlex.split(body) if t != "$@"]
    args, flag = {}, None
    for t in tokens:
        if t.startswith("--"):
            flag = t
            args[flag] = None
        else:
            assert flag is not None and args[flag] is None, t
            args[flag] = t
    return args


def test_megatron_export_uses_documented_arguments(plans):
    seen = set()
    for e in plans:
        p = e.plan
        args = parse_megatron(X.export(e, "megatron"))
        for flag, value in args.items():
            assert flag in MEGATRON_FLAGS, flag
            allowed = MEGATRON_FLAGS[flag]
            if allowed is not None:
                assert value in allowed, (flag, value)
        seen |= set(args)
        assert int(args["--tensor-model-parallel-size"]) == p.tp
        assert int(args["--pipeline-model-parallel-size"]) == p.pp
        assert int(args["--micro-batch-size"]) == p.micro_batch
        assert int(args["--global-batch-size"]) == p.global_batch
        assert int(args["--seq-length"]) == p.seq_len
        assert int(args["--vocab-size"]) == e.model.vocab_size  # NullTokenizer: EOD is V-1
        # Megatron's _vocab_size_with_padding: up to a multiple of divisible-by x tp, which
        # for GPT-2's 50257 at tp 8 is 51200 (worked by hand), as ptd's runtime pads
        div = int(args["--make-vocab-size-divisible-by"])
        assert -(-e.model.vocab_size // (div * p.tp)) * div * p.tp == e.model.padded_vocab(p.tp)
        assert int(args["--num-layers"]) == e.model.n_layers
        assert ("--sequence-parallel" in args) == p.sp
        assert ("--bf16" in args) == (p.dtype == "bf16") and ("--fp16" in args) == (p.dtype == "fp16")
        if p.zero == 1:
            assert "--use-distributed-optimizer" in args
        if p.pp > 1:  # ptd's exact split, stage by stage
            layout = args["--pipeline-model-parallel-layout"]
            assert [int(x.strip("EL").split("*")[1]) for x in layout.split("|")] == list(X.stages(e))
    assert {"--use-megatron-fsdp", "--recompute-method", "--optimizer-cpu-offload",
            "--pipeline-model-parallel-layout", "--num-experts"} <= seen


def test_deepspeed_export_uses_documented_keys(plans):
    for e in plans:
        p = e.plan
        ex = X.export_files(e, "deepspeed")
        ds = json.loads(ex.text)  # the plain ds_config, no wrapper
        launch = ex.beside["ds_config.launch.sh"]
        assert set(ds) <= DS_TOP, set(ds) - DS_TOP
        for k, allowed in DS_NESTED.items():
            if k in ds:
                assert set(ds[k]) <= allowed, (k, set(ds[k]) - allowed)
        assert set(ds["optimizer"]["params"]) <= DS_ADAMW_PARAMS
        for k in ("offload_optimizer", "offload_param"):
            assert set(ds["zero_optimization"].get(k, {})) <= DS_OFFLOAD
        # DeepSpeed's rule: train_batch_size = micro batch * accumulation steps * data parallel
        assert ds["train_batch_size"] == (ds["train_micro_batch_size_per_gpu"]
                                          * ds["gradient_accumulation_steps"] * p.dp)
        assert ds["zero_optimization"]["stage"] == p.zero
        assert f"# parallel degrees: data {p.dp}" in launch
        assert f"x tensor {p.tp} x pipeline {p.pp} = {p.world_size} ranks" in launch
        if p.pp > 1:
            kw, _ = export_deepspeed.pipeline(e, X.stages(e))
            assert set(kw) <= PIPELINE_MODULE_KWARGS and kw["num_stages"] == p.pp
            assert f"PipelineModule(layers, num_stages={p.pp}" in launch
        if p.tp > 1:
            assert ds["tensor_parallel"]["autotp_size"] == p.tp


def test_exports_say_what_they_cannot_express(plans):
    zb = next(e for e in plans if e.plan.schedule == "zero-bubble")
    assert "zero-bubble has no Megatron-LM core schedule" in X.export(zb, "megatron")
    z1 = next(e for e in plans if e.plan.zero == 1 and e.plan.dp > 1)
    assert "ZeRO-1 has no torchtitan setting" in X.export(z1, "torchtitan")
    nosp = next(e for e in plans if e.plan.tp > 1 and not e.plan.sp)
    assert "--parallelism.no-enable-sequence-parallel" in X.export(nosp, "torchtitan")
    z3pp = next(e for e in plans if e.plan.zero >= 2 and e.plan.pp > 1)
    ex = X.export_files(z3pp, "deepspeed")
    assert any("supports ZeRO 0 and 1 only" in n for n in ex.notes)
    assert "# not expressible: DeepSpeed's pipeline engine supports ZeRO 0 and 1 only" in \
        ex.beside["ds_config.launch.sh"]
    assert set(X.LIMITS) == set(X.FORMATS) and all(X.LIMITS.values())


def test_cli_export(ptd_cli, tmp_path):
    argv = ["plan", "--model", "tiny", "--hardware", "cpu", "--gpus", "4", "--seq-len", "256",
            "--global-batch", "32", "--dtype", "fp32"]
    rc, out, _ = ptd_cli(*argv, "--export", "ptd", "--steps", "5")
    assert rc == 0 and out.startswith("# ptd plan:")  # the export alone, to redirect
    path = tmp_path / "plan.toml"
    path.write_text(out)
    cfg = load_config(path)
    cfg.validate(4)
    assert cfg.steps == 5 and cfg.model == get_preset("tiny")
    rc, out, _ = ptd_cli(*argv, "--export", "megatron", "-o", str(tmp_path / "m.txt"))
    assert rc == 0 and "top " in out and "wrote the megatron export" in out
    assert parse_megatron((tmp_path / "m.txt").read_text())["--global-batch-size"] == "32"
    rc, out, _ = ptd_cli(*argv, "--export", "deepspeed", "--json")
    d = json.loads(out)
    assert d["export"]["format"] == "deepspeed"
    assert json.loads(d["export"]["text"])["train_batch_size"] == 32
    with pytest.raises(PtdError, match="unknown export format 'jax'"):
        X.export(plans_first(), "jax")


def plans_first():
    r = search(get_preset("tiny"), cluster("cpu", 4), 32, 256)
    return r.best


def test_options_follow_the_cost_model():
    r = search(get_preset("tiny"), cluster("cpu", 4), 32, 256, fixed={"dp": 4})
    flash = parse_megatron(X.export(r.best, "megatron"))
    scores = parse_megatron(X.export(r.best, "megatron", options=CostOptions(attention="scores",
                                                                             dp_overlap=False)))
    assert flash["--attention-backend"] == "flash" and "--overlap-grad-reduce" in flash
    assert scores["--attention-backend"] == "unfused" and "--overlap-grad-reduce" not in scores
    assert re.search(r"--lr \d", X.export(r.best, "megatron"))

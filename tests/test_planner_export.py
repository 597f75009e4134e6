"""ptd plan --export: ptd configs load and validate; torchtitan, Megatron-LM and DeepSpeed
exports use only those projects' documented option names (written down here, with where
they come from; nothing is installed)."""

import json
import re
import tomllib

import pytest

from ptd.cost.estimate import CostOptions
from ptd.cost.params import layers_per_rank
from ptd.planner import export as X
from ptd.planner.search import search
from ptd.specs import ClusterSpec, get_preset, load_config, load_hardware
from ptd.errors import PtdError

# ---------------------------------------------------------------- torchtitan
# torchtitan/config/job_config.py (pytorch/torchtitan, commit 000204a4a8bf), the dataclasses
# behind the job-config TOML: section -> field names (only the sections ptd writes).
TORCHTITAN_KEYS = {
    "job": {"config_file", "dump_folder", "description", "use_for_integration_test", "print_args"},
    "model": {"name", "flavor", "tokenizer_path", "converters", "print_after_conversion"},
    "optimizer": {"name", "lr", "beta1", "beta2", "eps", "weight_decay", "implementation",
                  "early_step_in_backward"},
    "lr_scheduler": {"warmup_steps", "decay_ratio", "decay_type", "lr_min"},
    "training": {"dataset", "dataset_path", "local_batch_size", "global_batch_size", "seq_len",
                 "max_norm", "steps", "enable_cpu_offload", "mixed_precision_param",
                 "mixed_precision_reduce", "compile", "gc_freq", "gc_debug", "seed",
                 "deterministic"},
    "parallelism": {"data_parallel_replicate_degree", "enable_compiled_autograd",
                    "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                    "tensor_parallel_degree", "disable_loss_parallel",
                    "enable_async_tensor_parallel", "pipeline_parallel_degree",
                    "pipeline_parallel_split_points", "pipeline_parallel_layers_per_stage",
                    "pipeline_parallel_schedule", "pipeline_parallel_schedule_csv",
                    "pipeline_parallel_microbatch_size", "context_parallel_degree",
                    "context_parallel_rotate_method", "expert_parallel_degree"},
    "activation_checkpoint": {"mode", "selective_ac_option",
                              "per_op_sac_force_recompute_mm_shapes_by_fqns"},
}
TORCHTITAN_CHOICES = {
    ("training", "mixed_precision_param"): {"bfloat16", "float32"},
    ("parallelism", "fsdp_reshard_after_forward"): {"default", "always", "never"},
    ("activation_checkpoint", "mode"): {"selective", "full", "none"},
    ("lr_scheduler", "decay_type"): {"linear", "sqrt", "cosine"},
    # torch.distributed.pipelining.schedules.get_schedule_class (torch 2.13)
    ("parallelism", "pipeline_parallel_schedule"): {
        "1F1B", "Interleaved1F1B", "GPipe", "LoopedBFS", "InterleavedZeroBubble",
        "PipelineScheduleSingle", "PipelineScheduleMulti", "ZBVZeroBubble", "DualPipeV"},
}

# ----------------------------------------------------------------- Megatron-LM
# megatron/training/arguments.py (NVIDIA/Megatron-LM, tag core_v0.14.0): every flag ptd writes,
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
    "--optimizer-cpu-offload": None, "--overlap-grad-reduce": None,
    "--overlap-param-gather": None, "--train-iters": None, "--lr": None, "--min-lr": None,
    "--lr-decay-style": {"constant", "linear", "cosine", "inverse-square-root", "WSD"},
    "--lr-warmup-iters": None, "--weight-decay": None, "--adam-beta1": None,
    "--adam-beta2": None, "--adam-eps": None, "--clip-grad": None, "--seed": None,
}

# ------------------------------------------------------------------- DeepSpeed
# docs/_pages/config-json.md (deepspeedai/DeepSpeed): the ds_config keys ptd writes.
DS_TOP = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
          "gradient_clipping", "zero_optimization", "optimizer", "steps_per_print", "bf16",
          "fp16", "tensor_parallel", "activation_checkpointing"}
DS_NESTED = {
    "zero_optimization": {"stage", "overlap_comm", "contiguous_gradients", "offload_optimizer",
                          "offload_param", "reduce_scatter", "allgather_partitions"},
    "optimizer": {"type", "params"},
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


def cluster(hw, n, per_node=0):
    return ClusterSpec(load_hardware(hw), n, per_node)


@pytest.fixture(scope="module")
def plans():
    """A spread of winners and runners-up: every ZeRO stage, recompute kind, schedule,
    uneven stages, sequence parallel on and off, offload, GQA and MoE, fp16/bf16/fp32."""
    out = []
    cases = [
        ("llama3.1-405b", "h100-sxm", 16384, 2048, 8192, {}, "bf16", 6),
        ("llama3.1-405b", "h100-sxm", 16384, 2048, 8192, {"schedule": "1f1b", "zero": 1}, "bf16", 2),
        ("mixtral-8x7b", "h100-sxm", 64, 256, 4096, {}, "bf16", 3),
        # gpt2 ties its embeddings and ptd's pipeline has no fp16 loss scaling: ptd train
        # refuses both with pp > 1, so the planner (one validator) offers neither
        ("gpt2", "a100-80g", 16, 64, 1024, {"pp": 1}, "fp16", 2),
        ("tiny", "cpu", 4, 32, 256, {"pp": 2, "schedule": "gpipe"}, "fp32", 2),
        ("tiny", "cpu", 4, 32, 256, {}, "fp32", 4),
        ("tiny", "cpu", 4, 32, 256, {"zero": 3, "offload": True, "recompute": "selective"}, "fp32", 2),
        ("tiny", "cpu", 4, 32, 256, {"tp": 2, "sp": False, "zero": 0}, "bf16", 2),
        ("tiny", "cpu", 4, 32, 256, {"pp": 2, "vpp": 2}, "fp32", 2),
        ("tiny", "cpu", 4, 32, 256, {"pp": 4, "schedule": "1f1b", "zero": 2}, "fp32", 2),
        ("llama3-8b", "h100-sxm", 32, 256, 8192, {"pp": 4, "schedule": "1f1b", "tp": 8}, "bf16", 2),
    ]
    for name, hw, n, gb, s, fix, dtype, k in cases:
        r = search(get_preset(name), cluster(hw, n), gb, s, dtype=dtype, fixed=fix)
        out += r.ranked[:k]
    return out


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


def test_torchtitan_export_uses_documented_keys(plans):
    for e in plans:
        p = e.plan
        doc = tomllib.loads(X.export(e, "torchtitan"))
        for section, keys in doc.items():
            assert section in TORCHTITAN_KEYS, section
            assert set(keys) <= TORCHTITAN_KEYS[section], (section, set(keys) - TORCHTITAN_KEYS[section])
        for (section, key), allowed in TORCHTITAN_CHOICES.items():
            if key in doc.get(section, {}):
                assert doc[section][key] in allowed, (section, key, doc[section][key])
        par, tr = doc["parallelism"], doc["training"]
        assert par["tensor_parallel_degree"] == p.tp and par["pipeline_parallel_degree"] == p.pp
        assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] == p.dp
        assert tr["global_batch_size"] == p.global_batch and tr["seq_len"] == p.seq_len
        assert doc["activation_checkpoint"]["mode"] == p.recompute
        if p.pp > 1:
            assert len(par["pipeline_parallel_split_points"]) == p.n_stages - 1
            assert tr["local_batch_size"] // par["pipeline_parallel_microbatch_size"] == p.n_microbatches
        else:  # gradient accumulation: global / (local * dp)
            assert tr["global_batch_size"] // (tr["local_batch_size"] * p.dp) == p.n_microbatches


def parse_megatron(text):
    body = [l for l in text.splitlines() if not l.startswith("#")]
    tokens = " ".join(l.rstrip("\\").strip() for l in body).split()
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
        assert int(args["--vocab-size"]) + 1 == e.model.vocab_size  # NullTokenizer adds EOD
        assert int(args["--num-layers"]) == e.model.n_layers
        assert ("--sequence-parallel" in args) == p.sp
        assert ("--bf16" in args) == (p.dtype == "bf16") and ("--fp16" in args) == (p.dtype == "fp16")
        if p.zero == 1:
            assert "--use-distributed-optimizer" in args
        if p.pp > 1 and p.schedule in ("1f1b", "gpipe") and "--decoder-first-pipeline-num-layers" in args:
            per_rank = layers_per_rank(e.model, p)
            assert int(args["--decoder-first-pipeline-num-layers"]) == per_rank[0]
            assert int(args["--decoder-last-pipeline-num-layers"]) == per_rank[-1]
    assert {"--use-megatron-fsdp", "--recompute-method", "--optimizer-cpu-offload",
            "--num-layers-per-virtual-pipeline-stage", "--num-experts"} <= seen


def test_deepspeed_export_uses_documented_keys(plans):
    for e in plans:
        p = e.plan
        d = json.loads(X.export(e, "deepspeed"))
        assert set(d) <= {"ds_config", "pipeline_module", "parallel", "notes"}
        ds = d["ds_config"]
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
        assert d["parallel"] == {"data_parallel": p.dp, "tensor_parallel": p.tp,
                                 "pipeline_parallel": p.pp, "world_size": p.world_size}
        if p.pp > 1:
            assert set(d["pipeline_module"]) <= PIPELINE_MODULE_KWARGS
            assert d["pipeline_module"]["num_stages"] == p.pp
        if p.tp > 1:
            assert ds["tensor_parallel"]["autotp_size"] == p.tp


def test_exports_say_what_they_cannot_express(plans):
    zb = next(e for e in plans if e.plan.schedule == "zero-bubble")
    assert "zero-bubble has no Megatron-LM core schedule" in X.export(zb, "megatron")
    z1 = next(e for e in plans if e.plan.zero == 1 and e.plan.dp > 1)
    assert "ZeRO-1 has no torchtitan setting" in X.export(z1, "torchtitan")
    nosp = next(e for e in plans if e.plan.tp > 1 and not e.plan.sp)
    assert "sequence parallel off cannot be expressed" in X.export(nosp, "torchtitan")
    z3pp = next(e for e in plans if e.plan.zero >= 2 and e.plan.pp > 1)
    assert "supports ZeRO 0 and 1 only" in X.export(z3pp, "deepspeed")
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
    assert d["export"]["format"] == "deepspeed" and json.loads(d["export"]["text"])["ds_config"]
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

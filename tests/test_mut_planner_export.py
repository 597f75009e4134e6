"""``ptd plan --export``: the exact arguments and keys each exporter writes for small,
hand-chosen plans (``ptd.planner.export``, ``export_megatron``, ``export_deepspeed``,
``export_torchtitan``).

Written from the mutation survivors of those modules (samples of 25, seed 20261127).
tests/test_planner_export.py checks that only documented names are written and that the
degrees multiply out; here every value is written down by hand from the plan, the model and
``TrainConfig``'s defaults (200 steps, seed 0; AdamW lr 3e-3, betas 0.9/0.95, eps 1e-8,
weight decay 0.1, clip 1.0, 20 warm-up steps, cosine to 0.1 x lr), mapped onto each
framework's documented option (Megatron-LM core_r0.19 ``arguments.py``, DeepSpeed
``config-json.md``, torchtitan 0.3 ``configs.py``)."""

from __future__ import annotations

from types import SimpleNamespace

from helpers import cluster
from ptd.cost.estimate import CostOptions
from ptd.planner import export as X
from ptd.planner import export_deepspeed as DS
from ptd.planner import export_megatron as MG
from ptd.planner import export_torchtitan as TT
from ptd.specs import ParallelPlan, get_preset
from ptd.specs.config import TrainConfig

TINY = get_preset("tiny")  # 4 layers, hidden 64, 8 heads (head_dim 8), 4 kv heads, MLP 128,
# vocab 256 (multiple 128), max seq 256, SwiGLU, RMSNorm (1e-5), RoPE 10000, untied, no bias
GPT = get_preset("tiny-gpt")  # 4 heads = kv heads (head_dim 16), MLP 256, GELU, LayerNorm,
# learned positions, tied embeddings, biases
MOE = get_preset("tiny-moe")  # tiny with 8 experts, top-2, expert MLP 64, aux 0.01, z 0.001
CFG = TrainConfig()


def P(**kw):
    base = dict(global_batch=8, seq_len=64, dtype="bf16")
    return ParallelPlan(**{**base, **kw})


def E(model, plan, n=None, per_node=0):
    """A stand-in estimate: the exporters read its model, plan and cluster."""
    return SimpleNamespace(model=model, plan=plan,
                           cluster=cluster("cpu", n or plan.world_size, per_node))


TRAINING_MEGATRON = [  # TrainConfig's defaults as pretrain_gpt.py arguments
    ("--train-iters", 200), ("--lr", 3e-3), ("--min-lr", 3e-3 * 0.1),
    ("--lr-decay-style", "cosine"), ("--lr-warmup-iters", 20), ("--weight-decay", 0.1),
    ("--adam-beta1", 0.9), ("--adam-beta2", 0.95), ("--adam-eps", 1e-8), ("--clip-grad", 1.0),
    ("--seed", 0)]


# ------------------------------------------------------------------ Megatron-LM
def test_megatron_arguments_of_a_gqa_tp_pp_plan():
    p = P(dp=2, tp=2, pp=2, zero=1, sp=True, recompute="selective")
    args, notes = MG.arguments(E(TINY, p), (2, 2), None, CFG)
    assert args == [
        ("--num-layers", 4), ("--hidden-size", 64), ("--ffn-hidden-size", 128),
        ("--num-attention-heads", 8),
        ("--group-query-attention", None), ("--num-query-groups", 4),  # 4 kv heads != 8
        # no --kv-channels: head_dim 8 * 8 heads = 64 = hidden (Megatron's default)
        ("--seq-length", 64), ("--max-position-embeddings", 256),
        ("--position-embedding-type", "rope"), ("--rotary-base", 10000),
        ("--normalization", "RMSNorm"), ("--norm-epsilon", 1e-5), ("--swiglu", None),
        ("--untie-embeddings-and-output-weights", None), ("--disable-bias-linear", None),
        ("--attention-dropout", 0.0), ("--hidden-dropout", 0.0), ("--init-method-std", 0.02),
        ("--tokenizer-type", "NullTokenizer"), ("--vocab-size", 256),
        ("--make-vocab-size-divisible-by", 128), ("--attention-backend", "flash"),
        ("--tensor-model-parallel-size", 2), ("--pipeline-model-parallel-size", 2),
        ("--sequence-parallel", None),
        ("--pipeline-model-parallel-layout", "Et*2|t*2L"),  # embedding first, loss last
        ("--micro-batch-size", 1), ("--global-batch-size", 8), ("--bf16", None),
        ("--recompute-granularity", "selective"),
        ("--use-distributed-optimizer", None),  # ZeRO-1
        ("--overlap-grad-reduce", None), ("--overlap-param-gather", None),  # dp 2, zero 1
        *TRAINING_MEGATRON]
    assert notes == []


def test_megatron_arguments_of_a_gpt_on_one_rank():
    p = P(dtype="fp32", micro_batch=2, recompute="full")
    args, notes = MG.arguments(E(GPT, p), (4,), 7, CFG)
    assert args == [
        ("--num-layers", 4), ("--hidden-size", 64), ("--ffn-hidden-size", 256),
        ("--num-attention-heads", 4),  # as many kv heads: no GQA; 16 * 4 = 64: no kv-channels
        ("--seq-length", 64), ("--max-position-embeddings", 256),
        ("--position-embedding-type", "learned_absolute"),  # no rotary base
        ("--normalization", "LayerNorm"), ("--norm-epsilon", 1e-5),
        # GELU: no --swiglu; tied: no untie; biases: no --disable-bias-linear
        ("--attention-dropout", 0.0), ("--hidden-dropout", 0.0), ("--init-method-std", 0.02),
        ("--tokenizer-type", "NullTokenizer"), ("--vocab-size", 256),
        ("--make-vocab-size-divisible-by", 128), ("--attention-backend", "flash"),
        ("--tensor-model-parallel-size", 1), ("--pipeline-model-parallel-size", 1),
        ("--micro-batch-size", 2), ("--global-batch-size", 8),  # fp32: neither --bf16 nor --fp16
        ("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
        ("--recompute-num-layers", 1),
        # zero 0 and dp 1: no optimizer sharding and nothing to overlap
        ("--train-iters", 7), *TRAINING_MEGATRON[1:]]
    assert notes == []


def test_megatron_kv_channels_context_parallel_and_layout():
    wide = TINY.replace(head_dim=16)  # 16 * 8 heads = 128 != hidden 64
    args = dict(MG.arguments(E(wide, P()), (4,), None, CFG)[0])
    assert args["--kv-channels"] == 16
    args = dict(MG.arguments(E(TINY, P(cp=2)), (4,), None, CFG)[0])
    assert args["--context-parallel-size"] == 2 and args["--cp-comm-type"] == "all_gather"
    assert "--context-parallel-size" not in dict(MG.arguments(E(TINY, P()), (4,), None, CFG)[0])
    assert MG.layout((2, 1, 1)) == "Et*2|t*1|t*1L"
    assert MG.layout((1, 3)) == "Et*1|t*3L"
    assert MG.layout((4,)) == "Et*4L"


def test_megatron_zero_2_3_offload_and_the_script():
    z2 = dict(MG.arguments(E(TINY, P(dp=2, zero=2)), (4,), None, CFG)[0])
    assert z2["--data-parallel-sharding-strategy"] == "optim_grads" and "--use-megatron-fsdp" in z2
    assert "--use-distributed-optimizer" not in z2 and "--overlap-param-gather" not in z2
    p = P(dp=2, tp=2, zero=3, offload=True)
    args, notes = MG.arguments(E(TINY, p), (4,), None, CFG)
    mem = args[args.index(("--bf16", None)) + 1:args.index(("--train-iters", 200))]
    assert mem == [("--use-megatron-fsdp", None),
                   ("--data-parallel-sharding-strategy", "optim_grads_params"),
                   ("--ckpt-format", "fsdp_dtensor"),
                   ("--use-distributed-optimizer", None),  # the offload needs it
                   ("--optimizer-cpu-offload", None), ("--use-precision-aware-optimizer", None),
                   ("--overlap-grad-reduce", None)]
    assert notes == ["offload: Megatron-LM offloads optimizer states only; parameters and "
                     "gradients stay on the GPU"]
    # 4 ranks, 2 per node: 2 nodes of 2 processes
    text, _ = MG.script(E(TINY, p, 4, 2), (4,), None, CFG, "SUMMARY")
    head, cmd = text.split("torchrun ", 1)
    assert head.splitlines() == [
        "#!/usr/bin/env bash",
        "# Megatron-LM core_r0.19 launch exported by ptd plan -- SUMMARY",
        "# data parallel = world size / (tp*pp) = 2; run in a Megatron-LM checkout on each of "
        "the 2 node(s), NODE_RANK and MASTER_ADDR/MASTER_PORT set; add the data arguments "
        "(--data-path ..., or --mock-data)",
        "# not expressible: offload: Megatron-LM offloads optimizer states only; parameters and "
        "gradients stay on the GPU",
        "# note: Megatron warns that tensor parallelism (wants CUDA_DEVICE_MAX_CONNECTIONS=1) "
        "and Megatron-FSDP (wants it unset) overlap best under different settings",
        "set -euo pipefail",
        "unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron-FSDP needs it unset or > 1"]
    assert cmd.startswith("--nnodes 2 --nproc-per-node 2 --node-rank ${NODE_RANK:-0} ")
    # zero 3 at tp 1: no tp note; zero 1: the connections exported, no note either
    text, _ = MG.script(E(TINY, P(dp=2, zero=3)), (4,), None, CFG, "S")
    assert "# note:" not in text and "unset CUDA_DEVICE_MAX_CONNECTIONS" in text
    text, _ = MG.script(E(TINY, P(dp=2, tp=2, zero=1), 4), (2, 2), None, CFG, "S")
    assert "# note:" not in text and "\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n" in text


def test_megatron_moe_arguments_and_the_tp_note():
    args, notes = MG.arguments(E(MOE, P(dp=2, ep=2)), (4,), None, CFG)
    i = args.index(("--hidden-dropout", 0.0)) + 1
    assert args[i:i + 8] == [
        ("--num-experts", 8), ("--moe-router-topk", 2), ("--moe-ffn-hidden-size", 64),
        ("--moe-router-load-balancing-type", "aux_loss"), ("--moe-aux-loss-coeff", 0.01),
        ("--moe-z-loss-coeff", 0.001), ("--expert-model-parallel-size", 2),
        ("--init-method-std", 0.02)]  # no shared experts, no capacity factor
    assert notes == []
    _, notes = MG.arguments(E(MOE, P(dp=2, tp=2, ep=2)), (4,), None, CFG)
    assert len(notes) == 1 and notes[0].startswith("experts over tp: Megatron shards")


# -------------------------------------------------------------------- DeepSpeed
OPTIMIZER_DS = {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                            "weight_decay": 0.1}}
# WarmupCosineLR: linear warm-up from 0 (warmup_min_ratio 0) over 20 steps, cosine down to
# min_lr_ratio 0.1 of lr (cos_min_ratio) at the run's 200 steps
SCHEDULER_DS = {"type": "WarmupCosineLR", "params": {
    "total_num_steps": 200, "warmup_num_steps": 20, "warmup_type": "linear",
    "warmup_min_ratio": 0.0, "cos_min_ratio": 0.1}}


def test_deepspeed_config_of_a_zero3_offload_tp_plan():
    p = P(dp=2, tp=2, zero=3, offload=True, sp=True, recompute="selective")
    ds, notes = DS.config(E(TINY, p), CFG)
    assert ds == {
        "train_batch_size": 8, "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 4,  # 8 / (1 * dp 2)
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 3, "overlap_comm": True, "contiguous_gradients": True,
                              "offload_optimizer": {"device": "cpu"},
                              "offload_param": {"device": "cpu"}},  # stage 3: parameters too
        "optimizer": OPTIMIZER_DS, "scheduler": SCHEDULER_DS,
        "steps_per_print": 10,  # DeepSpeed's documented default
        "seed": 0, "bf16": {"enabled": True}, "tensor_parallel": {"autotp_size": 2},
        # deepspeed.checkpointing with every option off (ptd keeps activations on the device)
        "activation_checkpointing": {"partition_activations": False, "cpu_checkpointing": False,
                                     "contiguous_memory_optimization": False,
                                     "synchronize_checkpoint_boundary": False, "profile": False}}
    assert [n.split(" ")[0:2] for n in notes] == [
        ["tensor", "parallelism"], ["Megatron-style", "sequence"], ["recompute:", "activation_checkpointing"],
        ["selective", "recompute"]]


def test_deepspeed_config_fp16_fp32_full_recompute():
    ds, notes = DS.config(E(TINY, P(dp=2, zero=1, dtype="fp16", recompute="full")), CFG)
    assert ds["fp16"] == {"enabled": True} and "bf16" not in ds and "tensor_parallel" not in ds
    assert ds["zero_optimization"] == {"stage": 1}  # overlap/contiguous are ZeRO-2/3 keys
    assert notes == ["recompute: activation_checkpointing configures deepspeed.checkpointing, "
                     "which the model's code must call per block"]  # full: no selective note
    ds, notes = DS.config(E(TINY, P(dtype="fp32")), CFG)
    assert "fp16" not in ds and "bf16" not in ds and "activation_checkpointing" not in ds
    assert notes == []


def test_deepspeed_moe_notes_and_launch_degrees():
    e = E(MOE, P(dp=2, ep=2, zero=3))
    assert DS.moe(e) == {"num_experts": 8, "ep_size": 2, "k": 2, "drop_tokens": False}
    assert DS.moe(E(TINY, P())) is None
    assert DS.moe_notes(e) == [
        "the 8 experts (top-2 routing) and expert parallelism ep 2 have no ds_config key: "
        "deepspeed.moe.layer.MoE(num_experts=8, ep_size=2, k=2, drop_tokens=False) in the "
        "model's code, its l_aux added to the loss times 0.01",
        "the router z-loss (coefficient 0.001) has no DeepSpeed equivalent",
        "ZeRO-3 with DeepSpeed's MoE layer: its engine has asserted 'MoE not supported with "
        "Stage 3' (DeepSpeed issue #2870, open); ptd shards the experts over dp/ep under "
        "ZeRO-3, DeepSpeed may need zero 2"]
    assert len(DS.moe_notes(E(MOE.replace(z_loss_coef=0.0), P(dp=2, ep=2, zero=2)))) == 1
    text = DS.launch(e, (4,), CFG, "ds.json", "S", [])
    assert "# parallel degrees: data 2 (expert parallel 2 within it) x tensor 1 x pipeline 1 " \
           "= 2 ranks on 1 node(s)\n" in text
    text = DS.launch(E(TINY, P(dp=2), 4, 2), (4,), CFG, "ds.json", "S", [])  # 2 ranks, 2 per node
    assert "# parallel degrees: data 2 x tensor 1 x pipeline 1 = 2 ranks on 1 node(s)\n" in text


def test_deepspeed_pipeline_module():
    note_pp = ("the pipeline degree has no ds_config key: it is "
               "deepspeed.pipe.PipelineModule(num_stages=pp) in the training script")
    assert DS.pipeline(E(TINY, P()), (4,)) == (None, [])
    kw, notes = DS.pipeline(E(TINY, P(pp=2, zero=1)), (2, 2))
    assert kw == {"num_stages": 2, "partition_method": "uniform",
                  "activation_checkpoint_interval": 0} and notes == [note_pp]
    kw, notes = DS.pipeline(E(TINY, P(pp=2, recompute="full")), (3, 1))
    assert kw == {"num_stages": 2, "partition_method": "parameters",
                  "activation_checkpoint_interval": 1}
    assert notes == [note_pp, "stages [3, 1] cannot be given exactly: partition_method "
                              "'parameters' balances parameter counts"]


# ------------------------------------------------------------------- torchtitan
def training_tt(local, steps=200, mp="bfloat16", offload="--training.no-enable-cpu-offload"):
    g = "--optimizer.param-groups.0.optimizer-kwargs"
    return ["--training.local-batch-size", str(local), "--training.global-batch-size", "8",
            "--training.seq-len", "64", "--training.steps", str(steps),
            "--training.mixed-precision-param", mp, offload, "--training.max-norm", "1.0",
            f"{g}.lr", "0.003", f"{g}.betas", "0.9", "0.95", f"{g}.eps", "1e-08",
            f"{g}.weight-decay", "0.1", "--lr-scheduler.warmup-steps", "20",
            "--lr-scheduler.decay-type", "cosine", "--lr-scheduler.min-lr-factor", "0.1",
            "--debug.seed", "0"]


TINY_NOTE = ("tiny has no torchtitan config function: written as llama3 llama3_debugmodel; "
             "register one with dim=64, n_layers=4, n_heads=8, n_kv_heads=4, ffn hidden=128, "
             "vocab_size=256")


def test_torchtitan_plain_data_parallel():
    args, notes = TT.arguments(E(TINY, P(dp=4, micro_batch=2)), (4,), None, CFG)
    assert args == ["--module", "llama3", "--config", "llama3_debugmodel",
                    # zero 0 alone: DDP = replicate over all 4
                    "--parallelism.data-parallel-replicate-degree", "4",
                    "--parallelism.data-parallel-shard-degree", "1",
                    "--parallelism.tensor-parallel-degree", "1",
                    "--parallelism.pipeline-parallel-degree", "1",
                    *training_tt(2),  # no pipeline: the local batch is the micro-batch
                    "activation-checkpoint:none"]
    assert notes == [TINY_NOTE]  # SwiGLU/RMSNorm/RoPE like llama3; not an MoE (no QK-norm note)


def test_torchtitan_ddp_with_tp_is_written_as_fsdp():
    args, notes = TT.arguments(E(TINY, P(dp=2, tp=2, dtype="fp16", recompute="full")), (4,),
                               5, CFG)
    assert args == ["--module", "llama3", "--config", "llama3_debugmodel",
                    "--parallelism.data-parallel-replicate-degree", "1",
                    "--parallelism.data-parallel-shard-degree", "2",
                    "--parallelism.fsdp-reshard-after-forward", "never",
                    "--parallelism.tensor-parallel-degree", "2",
                    "--parallelism.no-enable-sequence-parallel",
                    "--parallelism.pipeline-parallel-degree", "1",
                    *training_tt(1, steps=5), "activation-checkpoint:full"]
    assert notes == [TINY_NOTE,
                     "DDP (ZeRO 0) with tp/pp/ep > 1 has no torchtitan setting: written as FSDP "
                     "without resharding after forward",
                     "fp16 has no mixed_precision_param value: written as bfloat16"]
    # pp 2 alone and ep 2 alone also leave plain replication
    for p, m in ((P(dp=2, pp=2), TINY), (P(dp=2, ep=2), MOE)):
        a = TT.arguments(E(m, p), (2, 2), None, CFG)[0]
        i = a.index("--parallelism.data-parallel-replicate-degree")
        assert a[i + 1:i + 4] == ["1", "--parallelism.data-parallel-shard-degree", "2"]


def test_torchtitan_zero3_interleaved_pipeline():
    p = P(dp=2, pp=2, vpp=2, zero=3, schedule="interleaved-1f1b", recompute="selective",
          dtype="fp32", offload=True)
    args, notes = TT.arguments(E(TINY, p), (1, 1, 1, 1), None, CFG)
    assert args == ["--module", "llama3", "--config", "llama3_debugmodel",
                    "--parallelism.data-parallel-replicate-degree", "1",
                    "--parallelism.data-parallel-shard-degree", "2",
                    "--parallelism.fsdp-reshard-after-forward", "always",  # ZeRO-3
                    "--parallelism.tensor-parallel-degree", "1",
                    "--parallelism.pipeline-parallel-degree", "2",
                    "--parallelism.pipeline-parallel-schedule", "Interleaved1F1B",
                    "--parallelism.pipeline-parallel-microbatch-size", "1",
                    "--parallelism.module-fqns-per-model-part",
                    "tok_embeddings,layers.0", "layers.1", "layers.2", "layers.3,norm,lm_head",
                    *training_tt(4, mp="float32", offload="--training.enable-cpu-offload")[:2],
                    "--training.disable-cuda-graphs",  # a pipeline schedule
                    *training_tt(4, mp="float32", offload="--training.enable-cpu-offload")[2:],
                    "activation-checkpoint:selective"]
    assert notes == [TINY_NOTE, "selective recompute is torchtitan's per-op SAC, which saves a "
                                "different set of tensors than ptd's attention-core recompute "
                                "(--stack torchtitan prices the per-op policy)"]


def test_torchtitan_model_parts_context_parallel_and_model_notes():
    assert TT.model_parts(4, (2, 2)) == [["tok_embeddings", "layers.0", "layers.1"],
                                         ["layers.2", "layers.3", "norm", "lm_head"]]
    assert TT.model_parts(4, (4,)) == [["tok_embeddings", "layers.0", "layers.1", "layers.2",
                                        "layers.3", "norm", "lm_head"]]
    a = TT.arguments(E(TINY, P(dp=2, cp=2)), (4,), None, CFG)[0]
    i = a.index("--parallelism.context-parallel-degree")
    assert a[i + 1:i + 4] == ["2", "--parallelism.context-parallel-load-balancer", "headtail"]
    assert "--parallelism.context-parallel-degree" not in \
        TT.arguments(E(TINY, P(dp=2)), (4,), None, CFG)[0]
    for m, kind in ((TINY.replace(mlp="gelu"), "gelu/rmsnorm/rope"),
                    (TINY.replace(norm="layernorm"), "swiglu/layernorm/rope"),
                    (GPT, "gelu/layernorm/learned")):
        notes = TT._model(m)[2]
        assert notes[1] == f"{m.name} is {kind}; torchtitan's llama3 is SwiGLU/RMSNorm/RoPE"
        assert len(notes) == 2
    module, config, notes = TT._model(MOE)
    assert (module, config) == ("qwen3", "qwen3_moe_debug")
    assert notes == ["tiny-moe has no torchtitan config function: written as qwen3 "
                     "qwen3_moe_debug; register one with dim=64, n_layers=4, n_heads=8, "
                     "n_kv_heads=4, ffn hidden=64, vocab_size=256, num_experts=8, top_k=2, moe "
                     "hidden=64, shared experts=0, load-balance coefficient=0.01",
                     "qwen3's attention normalises queries and keys (QK-norm), which tiny-moe "
                     "does not"]


# ------------------------------------------------------------------ export.py
def test_ptd_export_header_and_file_names():
    p = P(dp=4, dtype="fp32")
    e = SimpleNamespace(model=TINY, plan=p, cluster=cluster("cpu", 4),
                        step=SimpleNamespace(total=1.5), memory=SimpleNamespace(total=2 * 2**30),
                        tokens_per_s=1234.0, mfu=0.4567)
    text = X.export(e, "ptd", hardware="cpu", steps=3)
    # duration(1.5) "1.5 s", gib(2 GiB) "2 GiB", si(1234) "1.23 k", 100 * 0.4567 = 45.67
    assert text.split("\n")[:3] == [
        "# ptd plan: tiny on 4 x cpu: dp4 tp1 pp1 zero0 mb1 gb8 seq 64 fp32; predicted step "
        "1.5 s, 2 GiB per device, 1.23 k tokens/s, MFU 45.7%",
        "# run it: ptd train --config FILE   (4 workers)", ""]
    assert X.launch_filename("out/ds.json") == "ds.launch.sh"
    assert X.launch_filename("cfg") == "cfg.launch.sh"
    assert X.default_filename("megatron") == "megatron_launch.sh"


def test_a_2d_tensor_parallel_plan_exports_only_as_ptd():
    # export.py: 2-D tp (a 2 x 2 mesh for tp 4) exists in ptd alone; every other framework
    # refuses it, Megatron-LM ("megatron" sorts before "ptd") as much as torchtitan
    import pytest

    from ptd.errors import PtdError
    from ptd.cost.estimate import estimate
    e = estimate(TINY, cluster("cpu", 4), P(tp=4, tp_mode="2d", dtype="fp32", micro_batch=2))
    for fmt in ("megatron", "deepspeed", "torchtitan"):
        with pytest.raises(PtdError, match=f"^{fmt} has no 2d tensor parallelism"):
            X.export_files(e, fmt)
    assert 'tp_mode = "2d"' in X.export_files(e, "ptd").text


def test_megatron_fsdp_from_zero_2_and_the_gpipe_note_for_gpipe_only():
    # export_megatron.py (fresh sample, seed 20261206): ZeRO-2 is Megatron-FSDP already
    # (optim_grads), so its script unsets CUDA_DEVICE_MAX_CONNECTIONS as ZeRO-3's does
    text, _ = MG.script(E(TINY, P(dp=2, zero=2)), (4,), None, CFG, "S")
    assert "\nunset CUDA_DEVICE_MAX_CONNECTIONS" in text
    assert "export CUDA_DEVICE_MAX_CONNECTIONS" not in text
    # "no GPipe schedule" is said of GPipe plans alone (interleaved and zero-bubble sort
    # after "gpipe"; 1F1B before it)
    gpipe_note = "Megatron-LM has no GPipe schedule: written as 1F1B"
    for schedule, vpp, said in (("gpipe", 1, True), ("1f1b", 1, False),
                                ("interleaved-1f1b", 2, False), ("zero-bubble", 1, False)):
        _, notes = MG.arguments(E(TINY, P(pp=2, vpp=vpp, schedule=schedule, micro_batch=1)),
                                (2, 2) if vpp == 1 else (1, 1, 1, 1), None, CFG)
        assert any(gpipe_note in n for n in notes) == said, (schedule, notes)

"""Feed ptd's exports to the frameworks' own code; runs in .venv-interop (scripts/setup
--interop), called by tests/test_export_interop.py as

    .venv-interop/bin/python tests/interop/check_exports.py MANIFEST.json OUT.json

MANIFEST: [{"name", "world_size", "deepspeed", "torchtitan", "megatron"}] (paths). OUT: for
each name and framework, {"ok": bool, "error": str, "parsed": {what the framework read}}.
The test (in ptd's own venv) compares "parsed" with the plan.
"""

import json
import os
import shlex
import socket
import sys
import traceback


def deepspeed_check(path, world_size, dp):
    from deepspeed.runtime.config import DeepSpeedConfig

    class MPU:
        """Megatron-style model-parallel unit: how DeepSpeed learns the data-parallel size
        when tp/pp ranks share the world (deepspeed.initialize(mpu=...))."""

        def get_data_parallel_world_size(self):
            return dp

        def get_model_parallel_world_size(self):
            return world_size // dp

    c = DeepSpeedConfig(path, mpu=MPU())  # the file as --deepspeed_config FILE reads it
    opt = c.optimizer_params or {}
    moe = deepspeed_moe_kwargs(path)
    return {"train_batch_size": c.train_batch_size,
            "micro_batch": c.train_micro_batch_size_per_gpu,
            "grad_accum": c.gradient_accumulation_steps, "dp": c.world_size,
            "zero": c.zero_optimization_stage, "bf16": c.bfloat16_config.enabled,
            "fp16": c.float16_config.enabled,
            "offload_optimizer": c.zero_config.offload_optimizer is not None,
            "offload_param": c.zero_config.offload_param is not None,
            "optimizer": c.optimizer_name, "lr": opt.get("lr"),
            "scheduler": c.scheduler_name,
            "total_steps": (c.scheduler_params or {}).get("total_num_steps"),
            "warmup": (c.scheduler_params or {}).get("warmup_num_steps"),
            "min_lr_ratio": (c.scheduler_params or {}).get("cos_min_ratio"),
            "clip": c.gradient_clipping, "moe": moe}


def deepspeed_moe_kwargs(path):
    """The ``deepspeed.moe.layer.MoE(...)`` call the launch script beside the ds_config names
    (None for a dense model), bound to DeepSpeed's own signature: every keyword must be one
    MoE takes."""
    import ast
    import inspect
    from deepspeed.moe.layer import MoE
    launch = path[:-len(".json")] + ".launch.sh"
    line = next((l for l in open(launch) if "deepspeed.moe.layer.MoE(" in l), None)
    if line is None:
        return None
    call = line.split("deepspeed.moe.layer.MoE(", 1)[1].rsplit(")", 1)[0]
    call = call.replace("expert=<the MLP>", "expert=None")
    node = ast.parse(f"f({call})", mode="eval").body
    kw = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    inspect.signature(MoE).bind(**kw)  # TypeError for a keyword MoE does not take
    return kw


def torchtitan_args(path):
    """Arguments after ``-m torchtitan.train`` in the launch script, as bash would pass them."""
    text = open(path).read().split("-m torchtitan.train", 1)[1]
    return shlex.split(text.replace("\\\n", " "))


def torchtitan_check(path, world_size):
    import torchtitan.components.quantization.float8 as f8
    from torchtitan.config import ConfigManager
    # The one GPU question here: config llama3_405b converts linears to float8 when it is
    # built, which asks whether the GPU is SM89+. Answered "yes" (the plans are for H100,
    # SM90) on this CPU box; nothing else about the parsed config depends on it.
    f8.has_cuda_capability = lambda major, minor: (9, 0) >= (major, minor)
    from torchtitan.distributed import ParallelDims
    cfg = ConfigManager().parse_args(torchtitan_args(path))
    pc, tr = cfg.parallelism, cfg.training
    # torchtitan's own check that the degrees fill the world (ParallelDims._validate)
    dims = ParallelDims.from_config(pc, world_size)
    # the expert mesh (torchtitan's ParallelDims._validate_meshes, checked when the mesh is
    # built on GPUs): ep ranks are taken from dp_shard * cp * tp
    efsdp, rest = divmod(dims.dp_shard * dims.cp * dims.tp, dims.ep)
    assert efsdp >= 1 and rest == 0, f"ep {dims.ep} does not divide dp_shard*cp*tp"
    ac = type(cfg.activation_checkpoint).__qualname__
    group = cfg.optimizer.param_groups[0].optimizer_kwargs
    moe = getattr(cfg.model_spec.model.layers[0], "moe", None)
    return {"dp_replicate": dims.dp_replicate, "dp_shard": dims.dp_shard, "tp": dims.tp,
            "pp": dims.pp, "reshard": pc.fsdp_reshard_after_forward,
            "sp": pc.enable_sequence_parallel, "schedule": pc.pipeline_parallel_schedule,
            "pp_microbatch": pc.pipeline_parallel_microbatch_size,
            "parts": pc.module_fqns_per_model_part, "local_batch": tr.local_batch_size,
            "global_batch": tr.global_batch_size, "seq_len": tr.seq_len, "steps": tr.steps,
            "param_dtype": tr.mixed_precision_param, "offload": tr.enable_cpu_offload,
            "no_cuda_graphs": tr.disable_cuda_graphs, "ac": ac, "lr": group["lr"],
            "warmup": cfg.lr_scheduler.warmup_steps,
            "min_lr_factor": cfg.lr_scheduler.min_lr_factor,
            "n_layers": len(cfg.model_spec.model.layers), "ep": dims.ep, "cp": dims.cp,
            "cp_balancer": pc.context_parallel_load_balancer,
            "num_experts": moe.num_experts if moe is not None else None}


def megatron_args(path):
    text = open(path).read()
    body = text.split("pretrain_gpt.py", 1)[1].replace("\\\n", " ")
    toks = [t for t in shlex.split(body) if t != "$@"]
    args, flag = {}, None
    for t in toks:
        if t.startswith("--"):
            flag = t[2:].replace("-", "_")
            args[flag] = True
        else:
            args[flag] = t
    return args, text


def megatron_check(path, world_size):
    """megatron-core's own TransformerConfig (and the ModelParallelConfig it derives from)
    built from the script's arguments the way Megatron-LM's core_transformer_config_from_args
    maps them."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig
    a, text = megatron_args(path)
    tp, pp = int(a["tensor_model_parallel_size"]), int(a["pipeline_model_parallel_size"])
    dtype = torch.bfloat16 if "bf16" in a else torch.float16 if "fp16" in a else torch.float32
    kw = dict(num_layers=int(a["num_layers"]), hidden_size=int(a["hidden_size"]),
              ffn_hidden_size=int(a["ffn_hidden_size"]),
              num_attention_heads=int(a["num_attention_heads"]),
              num_query_groups=int(a.get("num_query_groups", a["num_attention_heads"])),
              tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
              sequence_parallel="sequence_parallel" in a,
              bf16=dtype is torch.bfloat16, fp16=dtype is torch.float16, params_dtype=dtype,
              pipeline_dtype=dtype, gated_linear_unit="swiglu" in a,
              add_bias_linear="disable_bias_linear" not in a,
              normalization=a.get("normalization", "LayerNorm"),
              recompute_granularity=a.get("recompute_granularity"),
              recompute_method=a.get("recompute_method"),
              recompute_num_layers=int(a["recompute_num_layers"]) if "recompute_num_layers" in a else None,
              pipeline_model_parallel_layout=a.get("pipeline_model_parallel_layout"),
              context_parallel_size=int(a.get("context_parallel_size", 1)),
              cp_comm_type=a.get("cp_comm_type"),
              expert_model_parallel_size=int(a.get("expert_model_parallel_size", 1)))
    if "num_experts" in a:
        kw.update(num_moe_experts=int(a["num_experts"]), moe_router_topk=int(a["moe_router_topk"]),
                  moe_ffn_hidden_size=int(a["moe_ffn_hidden_size"]),
                  moe_router_load_balancing_type=a["moe_router_load_balancing_type"],
                  moe_aux_loss_coeff=float(a["moe_aux_loss_coeff"]))
        for k in ("moe_z_loss_coeff", "moe_expert_capacity_factor"):
            if k in a:
                kw[k] = float(a[k])
        if "moe_token_dispatcher_type" in a:
            kw["moe_token_dispatcher_type"] = a["moe_token_dispatcher_type"]
        if "moe_shared_expert_intermediate_size" in a:
            kw["moe_shared_expert_intermediate_size"] = int(a["moe_shared_expert_intermediate_size"])
    if "swiglu" in a:
        kw["activation_func"] = torch.nn.functional.silu
    c = TransformerConfig(**kw)
    layout = c.pipeline_model_parallel_layout
    cp, ep, etp = c.context_parallel_size, c.expert_model_parallel_size, c.expert_tensor_parallel_size
    # Megatron's rank grids (parallel_state.initialize_model_parallel, which needs a process
    # group per rank): tp*cp*dp*pp for the dense layers, etp*ep*edp*pp for the experts
    dp, rest = divmod(world_size, tp * cp * pp)
    assert rest == 0, f"world {world_size} is not divisible by tp*cp*pp"
    edp, rest = divmod(world_size, etp * ep * pp)
    assert rest == 0 and edp >= 1, f"world {world_size} is not divisible by etp*ep*pp"
    return {"tp": c.tensor_model_parallel_size, "pp": c.pipeline_model_parallel_size,
            "vpp": c.virtual_pipeline_model_parallel_size, "sp": c.sequence_parallel,
            "dp": dp, "num_layers": c.num_layers, "recompute": c.recompute_granularity,
            "layout": str(layout) if layout is not None else None,
            "layout_stages": _layout_stages(layout, pp) if layout is not None else None,
            "micro_batch": int(a["micro_batch_size"]), "global_batch": int(a["global_batch_size"]),
            "vocab": int(a["vocab_size"]), "fsdp": "use_megatron_fsdp" in a,
            "vocab_divisible_by": int(a["make_vocab_size_divisible_by"]),
            "sharding": a.get("data_parallel_sharding_strategy"),
            "ckpt_format": a.get("ckpt_format"),
            "dist_opt": "use_distributed_optimizer" in a,
            "offload": "optimizer_cpu_offload" in a,
            "precision_aware": "use_precision_aware_optimizer" in a,
            "max_connections_1": "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text,
            "train_iters": int(a["train_iters"]), "bf16": c.bf16, "lr": float(a["lr"]),
            "min_lr": float(a["min_lr"]), "warmup": int(a["lr_warmup_iters"]),
            "decay": a["lr_decay_style"], "cp": cp, "cp_comm": c.cp_comm_type,
            "ep": ep, "etp": etp, "num_experts": c.num_moe_experts,
            "topk": c.moe_router_topk if c.num_moe_experts else None,
            "moe_ffn": c.moe_ffn_hidden_size, "aux_coeff": c.moe_aux_loss_coeff,
            "z_coeff": c.moe_z_loss_coeff, "capacity": c.moe_expert_capacity_factor}


def _layout_stages(layout, pp):
    """Decoder layers per virtual stage in stage order, from megatron-core's parsed layout
    (layout.layout[pp_rank][vp_stage] lists the layer types)."""
    from megatron.core.transformer.enums import LayerType
    grid = layout.layout
    vpp = len(grid[0])
    return [sum(t == LayerType.decoder for t in grid[s % pp][s // pp]) for s in range(pp * vpp)]


def main(manifest, out):
    # DeepSpeed reads the data-parallel size only inside an initialised process group; one
    # local gloo process, the plan's degrees come from the MPU above.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    import deepspeed
    import deepspeed.comm.torch  # noqa: F401 -- the module; the name is shadowed by torch
    ds_torch_comm = sys.modules["deepspeed.comm.torch"]
    # On a CPU accelerator DeepSpeed JIT-compiles a shared-memory allreduce kernel when it
    # first initialises (~50 s of C++ here); it carries training collectives, which reading
    # a config never calls.
    ds_torch_comm.build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    results = {}
    for item in json.load(open(manifest)):
        r = results[item["name"]] = {}
        checks = {"deepspeed": lambda: deepspeed_check(item["deepspeed"], item["world_size"], item["dp"]),
                  "torchtitan": lambda: torchtitan_check(item["torchtitan"], item["world_size"]),
                  "megatron": lambda: megatron_check(item["megatron"], item["world_size"])}
        for fw, fn in checks.items():
            try:
                r[fw] = {"ok": True, "parsed": fn(), "error": ""}
            except BaseException as e:  # noqa: BLE001 -- tyro exits via SystemExit on refusal
                r[fw] = {"ok": False, "parsed": None,
                         "error": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}"}
    json.dump(results, open(out, "w"), indent=1, default=str)


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    main(sys.argv[1], sys.argv[2])

"""Run Megatron-LM's own parse_args + validate_args on ptd's Megatron launch scripts.

Not part of the suite (megatron-core's wheel lacks megatron/training): run by hand with a
Megatron-LM checkout at core_r0.19.0 in a scratch folder, in .venv-interop:

    .venv-interop/bin/python tests/interop/megatron_validate_args.py MEGATRON_LM_DIR SCRIPT...

Prints one line per script: "ok" with what Megatron derived (dp, vpp, context and expert
parallel sizes, experts and top-k, padded vocabulary), or the assertion Megatron raised.
"""

import os
import shlex
import sys
import typing

# Megatron-LM core_r0.19 imports typing.override (Python 3.12); the interop venv is 3.11
# and the decorator only marks methods, so an identity stand-in changes nothing checked here.
typing.override = getattr(typing, "override", lambda f: f)


def script_args(path: str) -> tuple[list[str], int]:
    """The pretrain_gpt.py arguments and the world size (nnodes * nproc-per-node)."""
    text = open(path).read()
    body = text.split("pretrain_gpt.py", 1)[1].replace("\\\n", " ")
    argv = [t for t in shlex.split(body) if t != "$@"]
    head = shlex.split(text.split("pretrain_gpt.py", 1)[0].splitlines()[-1])
    nnodes = int(head[head.index("--nnodes") + 1])
    nproc = int(head[head.index("--nproc-per-node") + 1])
    return argv, nnodes * nproc


def check(path: str) -> str:
    import megatron.training.arguments as margs
    from megatron.core.tokenizers.utils.build_tokenizer import vocab_size_with_padding
    # The one GPU question validate_args asks (which rules on CUDA_DEVICE_MAX_CONNECTIONS
    # apply): answered with Hopper's 9, the H100 the plans are made for, on this CPU box.
    margs.get_device_arch_version = lambda: 9
    argv, world = script_args(path)
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    for line in open(path):  # the script's own environment
        if line.startswith("export "):
            k, v = line.split(None, 1)[1].strip().split("=", 1)
            os.environ[k] = v
    os.environ.update(WORLD_SIZE=str(world), RANK="0")
    sys.argv = ["pretrain_gpt.py", *argv, "--mock-data"]
    args = margs.parse_args()
    margs.validate_args(args, {})
    padded = vocab_size_with_padding(args.vocab_size, args, logging_enabled=False)
    return (f"ok dp={args.data_parallel_size} tp={args.tensor_model_parallel_size} "
            f"pp={args.pipeline_model_parallel_size} "
            f"vpp={args.virtual_pipeline_model_parallel_size} cp={args.context_parallel_size} "
            f"cp_comm={args.cp_comm_type} ep={args.expert_model_parallel_size} "
            f"experts={args.num_experts} topk={args.moe_router_topk} "
            f"padded_vocab={padded} vocab={args.vocab_size}")


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])
    for p in sys.argv[2:]:
        try:
            print(p, check(p), flush=True)
        except (AssertionError, ValueError, SystemExit) as e:
            print(p, "REFUSED", repr(e)[:400], flush=True)

"""ptd export: hand a trained model to the rest of the ecosystem.

  ptd export runs/latest --format hf --out hf/tiny        # newest good checkpoint of a run
  ptd export runs/latest/checkpoints/step_00000100 --out hf/tiny-100

Reads a ptd checkpoint written under any layout (DDP, ZeRO, FSDP shards; later tensor or
pipeline parallel), consolidates the model in this process and writes a Hugging Face
folder: `model.safetensors` and `config.json` (LlamaForCausalLM for RMSNorm+RoPE+SwiGLU
models, GPT2LMHeadModel for LayerNorm+learned-position+GELU ones; anything else is refused
with the reason). Load it with `transformers.AutoModelForCausalLM.from_pretrained(DIR)`;
`ptd train --init-from DIR` starts a run from it. The checkpoint is validated first
(sizes and SHA-256 of every file); a damaged one is refused and the previous one used.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import PtdError
from .args import path_arg

HELP = "export a checkpoint as a Hugging Face folder (safetensors + config.json)"


def add(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", type=path_arg, metavar="RUN_OR_CKPT_DIR",
                   help="a run folder, its checkpoints folder, or one step_N checkpoint")
    p.add_argument("--format", choices=("hf",), default="hf", help="output format (hf)")
    p.add_argument("--out", "-o", type=path_arg, metavar="DIR", required=True,
                   help="folder to write (must not exist or be empty)")


def run(a: argparse.Namespace) -> int:
    src, out = Path(a.source), Path(a.out)
    if not src.exists():
        raise PtdError(f"export: {src} does not exist")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PtdError(f"export: {out} exists and is not an empty folder")
    from ..safeio import check_writable
    check_writable(out, "--out")
    from ..runtime.checkpoint import store
    from ..runtime.checkpoint.restore import validate
    ckpt = None
    refused: list[str] = []
    for cand in store.candidates(src):
        try:
            ckpt = validate(cand, deep=True)
            break
        except store.Refused as e:
            refused.append(f"{cand.name}: {e}")
            print(f"ptd: warning: checkpoint {cand} refused: {e}", file=sys.stderr)
    if ckpt is None:
        from ..runtime.checkpoint.restore import no_usable
        raise PtdError("export: " + no_usable(src, refused).removeprefix("resume: "))
    from ..runtime.checkpoint import hf
    hf.architecture(ckpt.config.model)  # refuse before reading any tensor
    config, n_tensors, n_params = hf.export(ckpt.path, out)
    print(f"ptd: wrote {out} ({config['architectures'][0]}, {n_tensors} tensors, {n_params:,} "
          f"parameters) from {ckpt.path} (step {ckpt.step})")
    return 0

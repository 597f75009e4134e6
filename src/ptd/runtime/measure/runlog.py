"""What a run writes: the progress bar, ``metrics.jsonl``, ``summary.json``, the last words.

Only rank 0 writes (the values it logs are already reduced over ranks); every other rank
gets a logger that does nothing, so the trainer never asks who it is.

``metrics.jsonl``: one JSON object per logged optimizer step (every step by default):
``step`` (1-based), ``loss`` (mean over every token of the global batch), ``lr``,
``grad_norm`` (global, before clipping), ``tokens`` (tokens trained on so far, all ranks),
``step_tokens``, ``step_time_s`` (rank 0 wall time of the step), ``tokens_per_s``
(``step_tokens / step_time_s``), ``elapsed_s`` (since the first step began), ``skipped``
(the update was skipped for a non-finite loss), and ``val_loss`` on evaluation steps.

``summary.json``: ``status`` (``ok`` or ``stopped: non-finite loss``), ``steps``,
``first_loss``, ``last_loss``, ``min_loss``, ``last10_loss`` (mean of the last ten logged
steps: less noisy than the last one), ``loss_curve`` (``[step, loss]`` at five
points), ``tokens``, ``tokens_per_s`` (tokens over time of every step but the first, which
carries warm-up), ``step_time_s_mean`` (likewise), ``wall_time_s`` (from worker start to
end, set-up included), ``train_time_s``, ``world_size``, ``plan``, ``plan_desc``, ``model``,
``param_count``, ``device``, ``dtype``, ``torch``, and ``val_loss`` when evaluated.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def loss_curve(records: list[dict[str, Any]], points: int = 5) -> list[list[float]]:
    """``[step, loss]`` at ``points`` evenly spaced records (first and last included)."""
    if not records:
        return []
    n = len(records)
    idx = sorted({round(i * (n - 1) / max(1, points - 1)) for i in range(points)})
    return [[records[i]["step"], records[i]["loss"]] for i in idx]


def summarize(records: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    steady = records[1:] or records
    time_s = sum(r["step_time_s"] for r in steady)
    out: dict[str, Any] = {
        "status": "ok",
        "steps": records[-1]["step"] if records else 0,
        "first_loss": records[0]["loss"] if records else None,
        "last_loss": records[-1]["loss"] if records else None,
        "min_loss": min(r["loss"] for r in records) if records else None,
        "last10_loss": (sum(r["loss"] for r in records[-10:]) / len(records[-10:])
                        if records else None),
        "loss_curve": loss_curve(records),
        "tokens": records[-1]["tokens"] if records else 0,
        "tokens_per_s": sum(r["step_tokens"] for r in steady) / time_s if time_s else None,
        "step_time_s_mean": time_s / len(steady) if steady else None,
        "train_time_s": sum(r["step_time_s"] for r in records),
    }
    vals = [r["val_loss"] for r in records if "val_loss" in r]
    if vals:
        out["val_loss"] = vals[-1]
    from ...summary.routing import routing_summary
    if (moe := routing_summary(records)) is not None:
        out["moe"] = moe
    out.update(extra)
    return out


def final_words(s: dict[str, Any]) -> str:
    curve = ", ".join(f"{int(st)}: {loss:.3f}" for st, loss in s["loss_curve"])
    lines = [
        f"ptd: {s['steps']} steps in {s['wall_time_s']:.1f} s on {s['world_size']} worker(s) "
        f"({s['plan_desc']}, {s['model']}, {s['dtype']}, {s['device']})",
        f"ptd: loss {s['first_loss']:.3f} -> {s['last_loss']:.3f} (mean of the last 10 steps "
        f"{s['last10_loss']:.3f}, min {s['min_loss']:.3f})",
        f"ptd: loss curve (step: loss) {curve}",
        f"ptd: {s['tokens_per_s']:,.0f} tokens/s, {s['step_time_s_mean']:.3f} s/step "
        f"(mean after step 1); {s['tokens']:,} tokens",
    ]
    if s.get("vocab_padding"):
        lines.append(f"ptd: {s['vocab_padding']}")
    if s.get("moe"):
        from ...summary.routing import routing_line
        lines.append(routing_line(s["moe"]))
    if s["status"] != "ok":
        lines.append(f"ptd: {s['status']}")
    return "\n".join(lines)


class RunLog:
    """Rank 0's writer; ``enabled=False`` makes every method a no-op."""

    def __init__(self, out: str | Path, total_steps: int, enabled: bool,
                 tensorboard: bool = False) -> None:
        self.enabled = enabled
        self.out = Path(out)
        self.records: list[dict[str, Any]] = []
        self._file = None
        self._bar = None
        self._tb = None
        if not enabled:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        self._file = open(self.out / "metrics.jsonl", "w")
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self._tb = SummaryWriter(str(self.out / "tb"))
        from tqdm import tqdm
        self._bar = tqdm(total=total_steps, unit="step", file=sys.stderr, dynamic_ncols=True,
                         mininterval=0.5 if sys.stderr.isatty() else 5.0)

    def record(self, rec: dict[str, Any]) -> None:
        self.records.append(rec)
        if not self.enabled:
            return
        from ...safeio import dumps_strict  # NaN/inf -> null + reason: every line is JSON
        self._file.write(dumps_strict(rec) + "\n")
        self._file.flush()
        if self._tb is not None:
            for k, v in rec.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(f"train/{k}", v, rec["step"])
        self._bar.set_postfix(loss=f"{rec['loss']:.3f}", tok_s=f"{rec['tokens_per_s']:,.0f}",
                              refresh=False)
        self._bar.update(rec["step"] - self._bar.n)

    def abort(self) -> None:
        """End the progress bar's line, so that an error printed next starts its own."""
        if self.enabled and getattr(self, "_bar", None) is not None:
            self._bar.close()

    def note(self, message: str) -> None:
        if self.enabled:
            self._bar.write(message, file=sys.stderr)

    def finish(self, summary: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self._bar.close()
        self._file.close()
        from ...safeio import atomic_write_text, dumps_strict
        atomic_write_text(self.out / "summary.json", dumps_strict(summary, indent=2) + "\n")
        if self._tb is not None:
            self._summary_to_tensorboard(summary)
        print(final_words(summary), flush=True)

    def _summary_to_tensorboard(self, summary: dict[str, Any]) -> None:
        """Predicted vs measured as scalars at the last step (``measured/...``,
        ``predicted/...``, ``ratio/...``) and the comparison table as text."""
        step = int(summary.get("steps", 0))
        for side in ("measured", "predicted", "ratio"):
            for k, v in _flat(summary.get(side) or {}).items():
                self._tb.add_scalar(f"{side}/{k}", v, step)
        if summary.get("measured"):
            from ...summary.compare import comparison_table
            self._tb.add_text("predicted_vs_measured",
                              "```\n" + comparison_table(summary) + "\n```", step)
        self._tb.close()


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Nested numbers as ``a/b/c`` keys (TensorBoard tags)."""
    out: dict[str, float] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}/"))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{prefix}{k}"] = float(v)
    return out

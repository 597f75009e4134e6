"""ptd validate: hold the cost model against published training runs.

Every case of a cases file (default: the published runs shipped with ptd,
ptd/data/published_cases.yaml) is priced with its published plan -- knobs the source left
unstated chosen as `ptd estimate` chooses them -- on the stack it ran on, and its prediction
set beside the published figure: the measured tokens/s per GPU or step time where the case
gives one, else its MFU, HFU or TFLOP/s per GPU. Then median, p90 and max
|error| per source and overall. A case that cannot be priced is an error row with the
reason. The rules that read a case are in ptd.cost.validate.

  ptd validate
  ptd validate --cases my_runs.yaml --json
  ptd validate --stack ptd          # every case as if ptd's runtime had run it
"""

from __future__ import annotations

import argparse

from .args import emit_json, path_arg
from ..cost.stacks import STACKS

HELP = "hold the cost model against published training runs (median/p90/max error)"


def add(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cases", type=path_arg, metavar="FILE", help="cases file, .yaml (default: the shipped published runs)")
    p.add_argument("--stack", choices=list(STACKS),
                   help="price every case on this stack (default: each case's own)")
    p.add_argument("--json", action="store_true", help="print rows and summary as JSON")


_FORMATS = {"tflops_per_gpu": lambda v: f"{v:.1f}", "tokens_per_s": lambda v: f"{v:,.0f}",
            "iter_time_s": lambda v: f"{v:.2f} s"}
"""How a published figure prints; MFU and HFU as percentages."""


def run(a: argparse.Namespace) -> int:
    from ..cost.validate import load_cases, price, summarize
    from ..fmt import table
    rows = [price(c, a.stack) for c in load_cases(a.cases)]
    summary = summarize(rows)
    if a.json:
        emit_json({"cases": [r.to_json() for r in rows], "summary": summary})
        return 0
    body = []
    for r in rows:
        if r.error:
            body.append([r.id, r.stack, r.plan or "-", "-", "-", "-", f"error: {r.error}"])
            continue
        fmt = _FORMATS.get(r.metric, lambda v: f"{v:.1%}")
        body.append([r.id, r.stack, r.plan, r.metric, fmt(r.published), fmt(r.predicted),
                     f"{r.rel_error:+.1%}"])
    print(table(body, ["case", "stack", "plan (chosen knobs filled in)", "metric", "published",
                       "predicted", "error"]))
    print()
    stats = []
    for name, s in summary.items():
        pct = (lambda v: "-" if v is None else f"{v:.1%}")
        stats.append([name, s["cases"], pct(s["median"]), pct(s["p90"]), pct(s["max"])])
    print(table(stats, ["source", "cases", "median |error|", "p90", "max"]))
    if summary["overall"]["errors"]:
        print(f"\n{summary['overall']['errors']} case(s) could not be priced (rows above)")
    return 0

"""For every case ``ptd validate`` prices (the shipped file and the held-out one): the share of
the priced computation that is the output layer and loss, and the signed error (+: ptd too
fast). Prints one row a case, sorted by that share, then the median error on each side of 8%.

    .venv/bin/python docs/data/heldout/output_share.py

The share is the last stage's output layer and loss (``ptd.cost.compute.output_time``, the
case's stack's kernels) over all micro-batches, divided by the step's computation as priced.
It reads the model; it changes nothing in it."""

import statistics
from pathlib import Path

from ptd.cost import compute as C
from ptd.cost import validate as V
from ptd.cost.estimate import choose
from ptd.cost.stacks import stack_options

HELD_OUT = Path(__file__).resolve().parent / "cases.yaml"


def rows():
    for path in (None, HELD_OUT):
        for c in V.load_cases(path):
            r = V.price(c)
            if r.error:
                continue
            m, cl = V.case_model(c), V.case_cluster(c)
            plan, free = V.case_plan(c, m)
            opts = stack_options(r.stack, cl.hardware)
            e = choose(m, cl, plan, free, options=opts)
            p = e.plan
            f, b = C.output_time(m, cl.hardware, p.seq_len // p.cp * p.micro_batch, p.tp,
                                 p.dtype, cl.gemm_rate(p.dtype), cl.memory_bandwidth,
                                 cl.op_overhead, 0.0, p.sp, opts.elementwise)
            share = (f + b) * p.n_microbatches / e.step.compute
            # a step time compares the other way round from a rate
            if r.metric == "iter_time_s":
                err = (r.published - r.predicted) / r.predicted
            else:
                err = (r.predicted - r.published) / r.published
            yield share, err, r.stack, r.id


def main() -> None:
    out = sorted(rows())
    for share, err, stack, cid in out:
        print(f"{share:6.1%} {err:+7.1%} {stack:14s} {cid}")
    lo = [e for s, e, _, _ in out if s < 0.08]
    hi = [e for s, e, _, _ in out if s >= 0.08]
    print(f"output and loss under 8%: {len(lo)} cases, median error {statistics.median(lo):+.1%}; "
          f"8% or more: {len(hi)} cases, median {statistics.median(hi):+.1%}")


if __name__ == "__main__":
    main()

"""Speed of the planner and of estimate's choose() -- measured, printed, never asserted in
the test suite (an absolute time limit fails on a loaded box and passes a regression on a
fast one). Run: ``.venv/bin/python benchmarks/speed.py``; compare with an earlier run on
the same machine."""

import time

from ptd.cost.estimate import FREE_KNOBS, choose
from ptd.planner.search import search
from ptd.specs import ClusterSpec, ParallelPlan, get_preset, load_hardware


def timed(fn, repeats=3):
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    m70, h100 = get_preset("llama3-70b"), load_hardware("h100-sxm")
    base = ParallelPlan(dp=2, tp=8, pp=4, global_batch=512, seq_len=8192, dtype="bf16")
    t = timed(lambda: choose(m70, ClusterSpec(h100, 64), base, FREE_KNOBS))
    print(f"choose llama3-70b on 64 x h100 (free knobs): {t:.3f} s (best of 3)")
    m405 = get_preset("llama3.1-405b")
    t = timed(lambda: search(m405, ClusterSpec(h100, 16384), 2048, 8192), repeats=1)
    print(f"search llama3.1-405b on 16384 x h100: {t:.3f} s")


if __name__ == "__main__":
    main()

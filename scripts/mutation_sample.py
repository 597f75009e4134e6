#!/usr/bin/env python3
"""A uniform random sample of a cosmic-ray session, for modules whose full run is too slow.

``sample`` marks every work item outside the sample as SKIPPED in the session database, so
that ``cosmic-ray exec`` runs only the sampled mutants; ``report`` counts killed over the
sampled, executed items and gives the share with a 95 % Wilson interval.

The sample is reproducible: the work items are first put in a fixed order (module path,
start position, operator, occurrence -- cosmic-ray's job ids are random per ``init``), then
``random.Random(SEED).sample(items, N)`` draws N of them. Items that already have a result
are left alone (re-running ``sample`` on an executed session changes nothing it ran).

Usage (from the repository root, cosmic-ray installed: pip install -e '.[mutation]'):

    cosmic-ray init runs/mutation/parallel.toml runs/mutation/parallel.sqlite
    python scripts/mutation_sample.py sample runs/mutation/parallel.sqlite --n 30 --seed 20261126
    nice -n 10 cosmic-ray exec runs/mutation/parallel.toml runs/mutation/parallel.sqlite
    git checkout -- src            # belt and braces: cosmic-ray restores each file itself
    python scripts/mutation_sample.py report runs/mutation/parallel.sqlite [--survivors]

The toml's test-command should start ``env PYTHONDONTWRITEBYTECODE=1`` and no __pycache__
should be left under src before ``exec`` (as ``scripts/mutation`` does): Python runs a cached
.pyc whose source has the same length and the same mtime in whole seconds, so a file written
within the second of the one before it runs as that one.
"""

from __future__ import annotations

import argparse
import math
import random
import sys

from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult


def order_key(item):
    m = item.mutations[0]
    return (str(m.module_path), tuple(m.start_pos), tuple(m.end_pos), m.operator_name,
            m.occurrence)


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The 95 % Wilson score interval of a proportion k/n."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, centre - half), min(1.0, centre + half))


def sample(db_path: str, n: int, seed: int) -> None:
    with use_db(db_path, WorkDB.Mode.open) as db:
        items = sorted(db.work_items, key=order_key)
        done = {job_id for job_id, _ in db.results}
        chosen = {i.job_id for i in random.Random(seed).sample(items, min(n, len(items)))}
        skip = [i.job_id for i in items if i.job_id not in chosen and i.job_id not in done]
        db.set_multiple_results(skip, WorkResult(
            worker_outcome=WorkerOutcome.SKIPPED,
            output=f"not in the sample (scripts/mutation_sample.py, seed {seed}, n {n})"))
        print(f"{db_path}: {len(items)} mutants, {len(chosen)} sampled (seed {seed}), "
              f"{len(skip)} marked skipped")


def report(db_path: str, survivors: bool) -> None:
    with use_db(db_path, WorkDB.Mode.open) as db:
        total = db.num_work_items
        completed = db.completed_work_items  # one snapshot: exec may be writing results
        rows = [(w, r) for w, r in completed if r.worker_outcome != WorkerOutcome.SKIPPED]
        pending = total - len(completed)
    killed = [w for w, r in rows if r.test_outcome == TestOutcome.KILLED]
    alive = [(w, r) for w, r in rows if r.test_outcome == TestOutcome.SURVIVED]
    other = [(w, r) for w, r in rows if r.test_outcome not in (TestOutcome.KILLED,
                                                              TestOutcome.SURVIVED)]
    n = len(killed) + len(alive)
    lo, hi = wilson(len(killed), n)
    share = 100 * len(killed) / n if n else float("nan")
    print(f"{db_path}: {total} mutants; sampled and run {len(rows)}, pending {pending}; "
          f"killed {len(killed)}, survived {len(alive)}, other {len(other)} "
          f"({', '.join(f'{r.worker_outcome}/{r.test_outcome}' for _, r in other) or '-'}); "
          f"killed share {share:.1f} % (95 % Wilson {100 * lo:.1f}-{100 * hi:.1f} %)")
    if survivors:
        for w, r in alive:
            m = w.mutations[0]
            print(f"\n--- {w.job_id} {m.module_path}:{m.start_pos[0]} {m.operator_name}")
            print(r.diff)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample", help="mark all but a random sample as skipped")
    s.add_argument("db")
    s.add_argument("--n", type=int, default=30)
    s.add_argument("--seed", type=int, default=20261126)
    r = sub.add_parser("report", help="killed share over the sampled, executed items")
    r.add_argument("db")
    r.add_argument("--survivors", action="store_true", help="print each survivor's diff")
    a = ap.parse_args(argv)
    if a.cmd == "sample":
        sample(a.db, a.n, a.seed)
    else:
        report(a.db, a.survivors)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""ZeRO-3 over 2 and the one-worker row: measured / priced parts in each bench's report
(twenty-ninth session). Run from the repository root:
    python3 docs/data/epyc2-2026-11-30/zero3_parts.py"""
import glob, json, statistics as st
fs = sorted(glob.glob("docs/data/epyc2-2026-11-29[gh]/bench*/scaling.json")) + \
     sorted(glob.glob("docs/data/epyc2-2026-11-30/bench*/scaling.json"))
KEYS = ("forward", "backward", "dp_comm_exposed", "optimizer")
acc = {}
for f in fs:
    d = json.load(open(f))
    cells = []
    for x in d["runs"]:
        if not x["summary"] or (x["strategy"], x["n"]) not in (("zero3", 2), ("ddp", 1)):
            continue
        m, p = x["summary"]["measured"]["breakdown"], x["summary"]["predicted"]["breakdown"]
        name = f"{x['strategy']}{x['n']}"
        for k in KEYS:
            acc.setdefault((name, k), []).append(1e3 * (m[k] - p[k]))
        cells.append(f"{name} {x['summary']['ratio']['step_time_s']:.2f} " + " ".join(
            f"{k[:5]} {m[k]*1e3:.0f}/{p[k]*1e3:.0f}" for k in KEYS))
    print(f.split("/")[2][-3:], f.split("/")[3], " | ".join(cells))
print("measured - priced, ms (mean over the benches):")
for (name, k), v in sorted(acc.items()):
    print(f"  {name} {k}: {st.mean(v):+.1f} (s.d. {st.pstdev(v):.1f})")

"""ZeRO-3 over 2 against DDP over 2 in the same bench (the same local batch of 8 sequences):
what FSDP adds to the forward and backward as measured and as priced, per bench.
    python3 docs/data/epyc2-2026-11-30/zero3_vs_ddp.py"""
import glob, json, statistics as st
fs = sorted(glob.glob("docs/data/epyc2-2026-11-29[efgh]/bench*/scaling.json")) + \
     sorted(glob.glob("docs/data/epyc2-2026-11-30/bench*/scaling.json"))
rows = []
for f in fs:
    d = json.load(open(f))
    got = {}
    for x in d["runs"]:
        if x["summary"] and x["n"] == 2 and x["strategy"] in ("ddp", "zero3"):
            got[x["strategy"]] = x["summary"]
    if len(got) < 2:
        continue
    def parts(s, side):
        b = s[side]["breakdown"]
        return b["forward"] * 1e3, b["backward"] * 1e3, s[side]["step_time_s"] * 1e3
    zf, zb, zs = parts(got["zero3"], "measured"); df, db, ds = parts(got["ddp"], "measured")
    pzf, pzb, pzs = parts(got["zero3"], "predicted"); pdf, pdb, pds = parts(got["ddp"], "predicted")
    r = (zf - df, pzf - pdf, zb - db, pzb - pdb, zs - ds, pzs - pds)
    rows.append(r)
    print(f.split("/")[2][-3:], f.split("/")[3],
          "forward +%.1f (priced +%.1f)  backward +%.1f (+%.1f)  step +%.1f (+%.1f) ms" % r)
m = [st.mean(c) for c in zip(*rows)]
print(f"mean over {len(rows)}: forward +{m[0]:.1f} (priced +{m[1]:.1f})  backward +{m[2]:.1f} "
      f"(+{m[3]:.1f})  step +{m[4]:.1f} (+{m[5]:.1f}) ms")

import json, os, sys, subprocess
from ptd.specs.hardware import load_hardware, ClusterSpec
from ptd.runtime.calibrate.profile import tp_residual
home = sys.argv[1]; situ = sys.argv[2]
hw = load_hardware(home + "/hardware/calibrated.toml")
ranks = [json.loads(l.split(" ", 2)[2]) for l in open(situ) if l.startswith("RES")]
pts = []
for i, p in enumerate(ranks[0]):
    pt = dict(p, tp=sum(r[i]["tp"] for r in ranks) / len(ranks), one=sum(r[i]["one"] for r in ranks) / len(ranks))
    res = tp_residual(pt, hw, 2)
    n = sum(c for _, c in p["all_reduces"])
    print("tokens", p["tokens"], "in situ/collective %.2f ms, chunk %.2f ms, residual %.3f ms" % ((pt["tp"] - pt["one"]) / n * 1e3, pt["one"] / n * 1e3, res * 1e3))
    pts.append((float(max(b for b, _ in p["all_reduces"])), res))
hw2 = hw.replace(tp_situ_measured={2: tuple(pts)})
print("situ at 2 MiB %.3f, 1 MiB %.3f, 8 KiB %.3f ms" % tuple(hw2.tp_situ_at(b, 2) * 1e3 for b in (2 << 20, 1 << 20, 8192)))
from ptd.cost.estimate import estimate  # noqa

import glob
from ptd.specs.hardware import load_hardware, ClusterSpec
from ptd.cost.comm import collective_time
MiB = 1 << 20
print("profile: fit(2MiB) fit(1MiB) extra(2MiB) wait(4ms) wait(8.5ms) wait(17ms) | total at 8.5ms")
for f in sorted(glob.glob('docs/data/epyc2-2026-11-2*/bench*/calibrated.toml') + ['/tmp/tmp.xG5HFDKylV/hardware/calibrated.toml']):
    hw = load_hardware(f)
    c = ClusterSpec(hw, 2)
    fit2 = collective_time("all_reduce", 2 * MiB, 2, hw); fit1 = collective_time("all_reduce", MiB, 2, hw)
    ex = c.dtensor_reduce(2 * MiB)
    w = [c.blocking_wait(s, 2) for s in (0.004, 0.0085, 0.017)]
    print(f.split('/')[2][-3:], f.split('/')[3], " ".join("%.2f" % (v * 1e3) for v in [fit2, fit1, ex] + w), "| %.2f" % ((fit2 + ex + w[1]) * 1e3))

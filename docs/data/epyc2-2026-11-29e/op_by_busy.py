"""Each pipeline F/B operation's time over its price with every worker computing, grouped
by how many ranks were inside an F/B span while it ran (twenty-fifth session). Input: the
span logs of a run with spanlog.diff applied (``PTD_SPANLOG=/tmp/spanlog``): one file a
rank, ``name start_ns end_ns [process_cpu_ns thread_cpu_ns]``; the schedule's steps
``first..last-1``; the priced forward and backward of each rank (ms, comma-separated:
``ptd estimate`` at every worker computing).

    python3 op_by_busy.py pp4_spans/spanlog 4 3 10 10.37,10.37,10.37,11.37 21.08,21.08,21.08,23.35
"""
import sys, collections
pre = sys.argv[1]; p = int(sys.argv[2]); steps = range(int(sys.argv[3]), int(sys.argv[4]))
price = {"F": [float(x) for x in sys.argv[5].split(",")], "B": [float(x) for x in sys.argv[6].split(",")]}
rows = {r: [l.split("\t") for l in open(f"{pre}.{r}")] for r in range(p)}
allops = []
for s in steps:
    for r in range(p):
        sch = [x for x in rows[r] if x[0] == "ptd:schedule"][s]
        a, b = int(sch[1]), int(sch[2])
        cur = None
        for x in rows[r]:
            if x[0] in ("ptd:forward", "ptd:backward") and a <= int(x[1]) and int(x[2]) <= b:
                k = x[0][4].upper(); s0, e0 = int(x[1]) / 1e6, int(x[2]) / 1e6
                if cur and k == "F" and cur[1] == "F" and s0 - cur[3] < 0.3 and r == p - 1:
                    cur = (r, "F", cur[2], e0); continue  # last stage: forward + loss spans
                if cur: allops.append(cur)
                cur = (r, k, s0, e0)
        allops.append(cur)
# busy count over time: piecewise
ev = sorted([(o[2], 1) for o in allops] + [(o[3], -1) for o in allops])
def avg_busy(s0, e0):
    # integrate count over [s0,e0]
    tot = 0.0; n = 0; t = None
    for (tt, d) in ev:
        if t is not None and tt > s0 and t < e0:
            tot += n * (min(tt, e0) - max(t, s0))
        n += d; t = tt
    return tot / (e0 - s0)
stat = collections.defaultdict(list)
for (r, k, s0, e0) in allops:
    nb = avg_busy(s0, e0)
    stat[(k, round(nb))].append((e0 - s0) / price[k][r])
for key in sorted(stat):
    v = sorted(stat[key]); print(key, len(v), "median time/4-busy price", round(v[len(v)//2], 3), "mean", round(sum(v)/len(v), 3))

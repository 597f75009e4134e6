# (twenty-ninth session) a 512-product timed in windows of 0.1 s, 40 triples: how far the
# median window of three lies from the fastest (the calibration keeps the fastest).
#   OMP_NUM_THREADS=1 .venv/bin/python docs/data/epyc2-2026-11-30/windows.py
import time, statistics, torch
torch.set_num_threads(1)
a = torch.randn(512, 512); b = torch.randn(512, 512)
def window(s=0.1):
    n = 0; t0 = time.perf_counter()
    while True:
        for _ in range(8): torch.mm(a, b)
        n += 8; e = time.perf_counter() - t0
        if e >= s: return e / n
for _ in range(5): window()
g = [[window() for _ in range(3)] for _ in range(40)]
allw = [x for t in g for x in t]
mins = [min(t) for t in g]; meds = [statistics.median(t) for t in g]
print(f"median/min within triples: mean {statistics.mean(m/n for m, n in zip(meds, mins)):.4f}")
print(f"all windows mean / mean of triple mins: {statistics.mean(allw)/statistics.mean(mins):.4f}; median {statistics.median(allw)/statistics.mean(mins):.4f}")
print(f"triple mins spread: {min(mins)*1e6:.0f}-{max(mins)*1e6:.0f} us/call; all {min(allw)*1e6:.0f}-{max(allw)*1e6:.0f}")

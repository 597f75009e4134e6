"""tp 2's all-reduce: measured per call (the bench's tp_comm / 33) against the price (fit at 2 MiB +
DTensor's extra + the blocking wait), and the price with a least-squares line through the
blocking points at a chunk of 8.7 ms.  python bw_ls.py BENCH/calibrated.toml..."""
import sys, tomllib, statistics, json
meas = {}
for f in sys.argv[1:]:
    d = tomllib.load(open(f, "rb"))["hardware"]
    sj = json.load(open(f.replace("calibrated.toml", "scaling.json")))
    for r in sj["runs"]:
        if r["strategy"] == "tp" and r["n"] == 2:
            m = r["summary"]["measured"]["breakdown"]["tp_comm"]; p = r["summary"]["predicted"]["breakdown"]["tp_comm"]
    ar = [c for c in d["collectives"] if c["kind"] == "all_reduce" and c["group_size"] == 2][0]
    fit = ar["alpha"] + 2 * 2**20 / ar["bus_bandwidth"]
    dr = {int(b): e for b, e in d["dtensor_reduce_measured"]["2"]}[2097152]
    pts = sorted(d["blocking_wait_measured"]["2"])
    wi = p / 33 - fit - dr  # the wait as priced
    xs, ys = [c for c, _ in pts], [w for _, w in pts]
    b, a = statistics.linear_regression(xs, ys)
    # the chunk where interpolation gives wi is unknown; take 8.7 ms
    c = 8.7e-3
    print(f.split("/")[-3][-3:], f.split("/")[-2], f"meas/33 {m/33*1e3:.2f} pred/33 {p/33*1e3:.2f} wait priced {wi*1e3:.2f} LS@8.7 {(a+b*c)*1e3:.2f} -> pred/33 {(fit+dr+a+b*c)*1e3:.2f}")

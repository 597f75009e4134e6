"""Hand mutants of the twenty-eighth session's code, each run against two test files from
the repository root: .venv/bin/python docs/data/epyc2-2026-11-29h/mutants.py"""
import subprocess, sys, pathlib
M = [
 ("src/ptd/runtime/calibrate/profile.py", 'priced += n * hw.blocking_wait_at(point["one"] / n, workers, 2)', 'priced += n * hw.blocking_wait_at(point["tp"] / n, workers, 2)', "wait after the pair's chunk"),
 ("src/ptd/runtime/calibrate/profile.py", 'collective_time("all_reduce", b, 2, hw) + hw.dtensor_reduce_at(b, workers))', 'collective_time("all_reduce", b, 2, hw))', "no DTensor extra"),
 ("src/ptd/runtime/calibrate/profile.py", '    return (point["tp"] - point["one"] - priced) / n', '    return (point["tp"] - point["one"] - priced) / (n - 3)', "shared among the large only"),
 ("src/ptd/specs/hardware.py", 'return _line_at(self.tp_situ_measured, nbytes, workers_per_node, floor=False)', 'return _line_at(self.tp_situ_measured, nbytes, workers_per_node)', "floored"),
 ("src/ptd/specs/hardware.py", 'if not self.tp_situ_measured or workers_per_node > max(self.tp_situ_measured):', 'if not self.tp_situ_measured:', "extrapolated to more workers"),
 ("src/ptd/cost/step.py", 'situ = cluster.tp_situ if tp_n == 2 else (lambda _: 0.0)', 'situ = cluster.tp_situ if tp_n > 1 else (lambda _: 0.0)', "every tp group"),
 ("src/ptd/cost/step.py", 'extra = dt(act / tp_n) + dt(act) if plan.sp else dt(act)', 'extra = dt(act / tp_n) + dt(act) + situ(act) if plan.sp else dt(act)', "twice under sp"),
 ("src/ptd/cost/step.py", '+ max(0.0, dt(4 * tokens) + situ(4 * tokens))', '+ dt(4 * tokens)', "loss all-reduces without it"),
 ("src/ptd/cost/step.py", 'return _coll("all_reduce", act, tp_n, hw, tp_nodes, tp_per) + max(0.0, extra + situ(act))', 'return _coll("all_reduce", act, tp_n, hw, tp_nodes, tp_per) + extra + situ(act)', "no floor"),
 ("src/ptd/runtime/calibrate/profile.py", 'out[int(n)] = [dict(p, tp=mean([r[i]["tp"] for r in ranks]),', 'out[int(n)] = [dict(p, tp=mean([r[i]["tp"] for r in ranks[:1]]),', "rank 0's time only"),
 ("src/ptd/runtime/calibrate/tp_situ.py", '        sizes: dict[int, int] = {}\n', '', "counts kept across micro-batches"),
 ("src/ptd/runtime/calibrate/tp_situ.py", '                               n_kv_heads=max(1, spec.n_kv_heads // tp),', '                               n_kv_heads=spec.n_kv_heads,', "kv heads not cut"),  # survived the first count; killed since

 ("src/ptd/runtime/calibrate/workers.py", '                out.append("tp collectives in place")', '                pass', "label missing"),
 ("src/ptd/runtime/calibrate/workers.py", 'tp_situ_rounds=0 if cuda or quick else SITU_ROUNDS,', 'tp_situ_rounds=0 if cuda else SITU_ROUNDS,', "quick runs it"),
 ("src/ptd/runtime/calibrate/bench.py", '                times.setdefault("tp_situ", {})["2"] = d', '                pass', "suite drops the points"),
 ("src/ptd/runtime/calibrate/profile.py", '            "fsdp_group": fsdp_group, "tp_situ": _tp_situ_points(results),', '            "fsdp_group": fsdp_group,', "summary without the points"),
]
tests = ["tests/test_calibrate_tp_situ.py", "tests/test_calibrate.py"]
killed = 0
for path, old, new, name in M:
    p = pathlib.Path(path); src = p.read_text()
    assert src.count(old) == 1, (name, src.count(old))
    p.write_text(src.replace(old, new))
    try:
        r = subprocess.run([".venv/bin/python", "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x", "-n", "0", *tests],
                           capture_output=True, text=True, timeout=600)
    finally:
        p.write_text(src)
    k = r.returncode != 0; killed += k
    print(("KILLED  " if k else "SURVIVED") + " " + name, flush=True)
print(f"{killed} of {len(M)}")

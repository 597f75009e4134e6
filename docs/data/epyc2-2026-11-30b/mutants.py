"""Hand mutants of the thirtieth session's ZeRO-3-in-place stage (runtime/calibrate/fsdp_situ.py,
profile.fsdp_residual, HardwareSpec.fsdp_situ_at, the charge in cost/dp.py, the stage's
wiring and printed table), each applied to a worktree of main (``git worktree add
/tmp/mutwt HEAD``) and run against the tests written for it; the source restored after.
Run from the worktree:
    /work/main/.venv/bin/python docs/data/epyc2-2026-11-30b/mutants.py"""
import subprocess

T = "tests/test_calibrate_fsdp_situ.py"
R = "tests/test_calibrate.py::test_the_printed_zero3_in_place_table"
L = "tests/test_calibrate.py::test_a_full_calibration_times_fsdp_units_on_groups_a_quick_one_does_not"
DP, HW, TC = "src/ptd/cost/dp.py", "src/ptd/specs/hardware.py", "src/ptd/specs/typecheck.py"
PR, ST = "src/ptd/runtime/calibrate/profile.py", "src/ptd/runtime/calibrate/fsdp_situ.py"
MUTANTS = [
    (DP, "if plan.zero >= 3 and plan.dp == 2 and plan.cp == 1:",
     "if plan.zero >= 2 and plan.dp == 2 and plan.cp == 1:", T),
    (DP, "if plan.zero >= 3 and plan.dp == 2 and plan.cp == 1:",
     "if plan.zero >= 3 and plan.dp >= 2 and plan.cp == 1:", T),
    (DP, "return m * units * max(0.0, f + situ), m * units * max(0.0, b + situ)",
     "return m * units * (f + situ), m * units * max(0.0, b + situ)", T),
    (DP, "return m * units * max(0.0, f + situ), m * units * max(0.0, b + situ)",
     "return m * units * max(0.0, f + situ), m * units * max(0.0, b)", T),
    (DP, "if not f and not b and not situ:", "if not f and not b:", T),
    (HW, "if not self.fsdp_situ_measured or workers_per_node > max(self.fsdp_situ_measured):",
     "if not self.fsdp_situ_measured or workers_per_node >= max(self.fsdp_situ_measured):", T),
    (HW, "return _line_at(self.fsdp_situ_measured, nbytes, workers_per_node, floor=False)",
     "return _line_at(self.fsdp_situ_measured, nbytes, workers_per_node)", T),
    (HW, "if not self.fsdp_situ_measured or workers_per_node > max(self.fsdp_situ_measured):",
     "if not self.fsdp_situ_measured:", T),
    (HW, "        return self.hardware.fsdp_situ_at(nbytes, self.workers_per_node)",
     "        return self.hardware.tp_situ_at(nbytes, self.workers_per_node)", T),
    (HW, '"tp_situ_measured", "fsdp_situ_measured"):', '"tp_situ_measured"):', T),
    (TC, '("fsdp_situ_measured", True)):', '("fsdp_situ_measured", False)):', T),
    (PR, 'return (sum(point["fsdp"]) - sum(point["plain"]) - priced) / (2 * point["units"])',
     'return (sum(point["fsdp"]) - sum(point["plain"]) - priced) / point["units"]', T),
    (PR, "priced = z.forward + z.backward + z.dp_comm_exposed - d.forward - d.backward",
     "priced = z.forward + z.backward - d.forward - d.backward", T),
    (PR, 'out[int(n)] = [dict(ranks[0], **{k: [mean([r[k][i] for r in ranks]) for i in (0, 1)]',
     'out[int(n)] = [dict(ranks[0], **{k: [ranks[0][k][i] for i in (0, 1)]', T),
    (PR, 'str(n): [[float(p["unit_bytes"]), fsdp_residual(p, spec, n)] for p in pts]',
     'str(n): [[float(p["tokens"]), fsdp_residual(p, spec, n)] for p in pts]', T),
    (ST, '"unit_bytes": 4.0 * block}', '"unit_bytes": 4.0 * block * 2}', T),
    (ST, '"units": spec.n_layers + 1,', '"units": spec.n_layers,', T),
    ("src/ptd/runtime/calibrate/bench.py", '            tick("ZeRO-3 in place")\n', "", T),
    ("src/ptd/runtime/calibrate/bench.py", 'times.setdefault("fsdp_situ", {})["2"] = d',
     'times.setdefault("fsdp_situ", {})["4"] = d', T),
    ("src/ptd/runtime/calibrate/workers.py",
     "fsdp_situ_rounds=0 if cuda or quick else FSDP_SITU_ROUNDS,",
     "fsdp_situ_rounds=0 if cuda else FSDP_SITU_ROUNDS,", T),
    ("src/ptd/runtime/calibrate/workers.py", '                out.append("ZeRO-3 in place")\n',
     "                pass\n", L),
    ("src/ptd/commands/calibrate.py",
     'duration((sum(p["fsdp"]) - sum(p["plain"])) / (2 * p["units"])), duration(resid))',
     'duration((sum(p["fsdp"]) - sum(p["plain"])) / p["units"]), duration(resid))', R),
]
subprocess.run(["find", "src", "tests", "-name", "__pycache__", "-prune", "-exec", "rm", "-rf",
                "{}", "+"], check=True)
killed = 0
for path, a, b, test in MUTANTS:
    orig = open(path).read()
    assert orig.count(a) == 1, a
    open(path, "w").write(orig.replace(a, b))
    try:
        r = subprocess.run(["/work/main/.venv/bin/python", "-m", "pytest", "-q", "-n", "0", "-p",
                            "no:cacheprovider", "-x", test], capture_output=True, text=True,
                           env={"PYTHONPATH": "/tmp/mutwt/src:/tmp/mutwt/tests",
                                "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
                                "PATH": "/usr/bin:/bin"})
    finally:
        open(path, "w").write(orig)
    killed += r.returncode != 0
    print("killed " if r.returncode else "SURVIVED", path.split("/")[-1], "|", b.strip()[:90],
          flush=True)
print(f"{killed} of {len(MUTANTS)} killed")

"""The three real survivors of the twenty-ninth session's runtime/calibrate/profile.py sample,
each applied to a worktree of main (``git worktree add /tmp/mutwt HEAD``, the new test file
copied in) and run against tests/test_mut_calibrate2.py; the file restored after. Run from
the worktree:
    /work/main/.venv/bin/python docs/data/epyc2-2026-11-30/mutants_profile.py"""
import subprocess
F = "src/ptd/runtime/calibrate/profile.py"
MUT = [
 ("return 3.5 * 0.5 * 4.0 * b * h * s * s * d", "return 3.5 * 0.5 * 4.0 / b * h * s * s * d"),
 ('if fit else pts.get("0", (0.0, min(p[1] for p in pts.values())))[1])',
  'if fit else pts.get("0", (0.0, min(p[ 0] for p in pts.values())))[1])'),
 ('hw["cpus"] = os.cpu_count() or 0', 'hw["cpus"] = os.cpu_count() or 1'),
]
orig = open(F).read()
try:
    for a, b in MUT:
        assert orig.count(a) == 1, a
        open(F, "w").write(orig.replace(a, b))
        r = subprocess.run(["/work/main/.venv/bin/python", "-m", "pytest", "-q", "-n", "0", "-p",
                            "no:cacheprovider", "tests/test_mut_calibrate2.py"],
                           capture_output=True, text=True,
                           env={"PYTHONPATH": "/tmp/mutwt/src:/tmp/mutwt/tests", "OMP_NUM_THREADS": "1",
                                "PATH": "/usr/bin:/bin"})
        print("KILLED" if r.returncode else "SURVIVED", "|", b, "|", r.stdout.strip().splitlines()[-1])
finally:
    open(F, "w").write(orig)

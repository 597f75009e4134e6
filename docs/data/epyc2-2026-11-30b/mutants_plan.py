"""The real survivors of the thirtieth session's cosmic-ray sample of specs/plan.py (seed
20261130, 40 of 673; 29 killed, 3 annotations, 8 real), each applied to a worktree of main
(``git worktree add /tmp/mutwt HEAD``, tests/test_mut_specs_plan.py in it) and run against
that file; the source restored after. Run from the worktree:
    /work/main/.venv/bin/python docs/data/epyc2-2026-11-30b/mutants_plan.py"""
import subprocess

PATH, TEST = "src/ptd/specs/plan.py", "tests/test_mut_specs_plan.py"
MUTANTS = [
    ("unknown = sorted(set(d) - known)", "unknown = sorted(set(d) ^ known)"),
    ("if q * q != self.tp or q < 2:", "if q ** q != self.tp or q < 2:"),
    ("if q * q != self.tp or q < 2:", "if q & q != self.tp or q < 2:"),
    ('if self.sp and self.seq_len % (self.tp * self.cp):',
     'if self.sp and self.seq_len % (self.tp << self.cp):'),
    ('if self.tp_mode != "2d":\n            return self.tp',
     'if not self.tp_mode != "2d":\n            return self.tp'),
    ('cp = ("*cp", f"*{self.cp}") if self.cp > 1 else ("", "")',
     'cp = ("*cp", f"*{self.cp}") if self.cp > 0 else ("", "")'),
    ('raise PtdError(f"dp*tp*pp{cp[0]} = ', 'raise PtdError(f"dp*tp*pp{cp[ 1]} = '),
    ("if self.cp > 1 and self.seq_len % (2 * self.cp):",
     "if self.cp > 2 and self.seq_len % (2 * self.cp):"),
]
subprocess.run(["find", "src", "tests", "-name", "__pycache__", "-prune", "-exec", "rm", "-rf",
                "{}", "+"], check=True)
orig = open(PATH).read()
killed = 0
try:
    for a, b in MUTANTS:
        assert orig.count(a) == 1, a
        open(PATH, "w").write(orig.replace(a, b))
        r = subprocess.run(["/work/main/.venv/bin/python", "-m", "pytest", "-q", "-n", "0", "-p",
                            "no:cacheprovider", TEST], capture_output=True, text=True,
                           env={"PYTHONPATH": "/tmp/mutwt/src:/tmp/mutwt/tests",
                                "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
                                "PATH": "/usr/bin:/bin"})
        killed += r.returncode != 0
        print("killed " if r.returncode else "SURVIVED", "|", b.splitlines()[0].strip(), flush=True)
finally:
    open(PATH, "w").write(orig)
print(f"{killed} of {len(MUTANTS)} killed")

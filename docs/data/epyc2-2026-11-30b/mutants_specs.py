"""The real survivors of the thirtieth session's cosmic-ray samples of specs/plan.py (seed
20261130, 40 of 673: 29 killed, 3 annotations, 8 real) and specs/typecheck.py (40 of 626: 20
killed, 4 annotations, 2 equivalent, 14 real), each applied to a worktree of main (``git
worktree add /tmp/mutwt HEAD``, the new test files in it) and run against the test file
written for them (typecheck's annotation mutants against tests/test_annotations.py); the
source restored after. Run from the worktree:
    /work/main/.venv/bin/python docs/data/epyc2-2026-11-30b/mutants_specs.py plan|typecheck"""
import subprocess
import sys

PLAN = [
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
TYPECHECK = [
    ("{MAX_INPUT_BYTES >> 20} MiB", "{MAX_INPUT_BYTES * 20} MiB"),
    ("type(v) is type(a) and v == a", "type(v) is type(a) and v != a"),
    ("not 0 <= hw.comm_sms < hw.sm_count", "not 0 <= hw.comm_sms != hw.sm_count"),
    ("(v < hi if hi_open else v <= hi)", "(v is not hi if hi_open else v <= hi)"),
    ("if not 0 <= hw.sm_count <= 2**20:", "if not 0 <= hw.sm_count != 2**20:"),
    ("if not 0 <= hw.sm_count <= 2**20:", "if not 0 <= hw.sm_count < 2**20:"),
    ("(v > lo if lo_open else v >= lo)", "(v is not lo if lo_open else v >= lo)"),
    ("{')' if hi_open else ']'}", "{')' if not hi_open else ']'}"),
    ("{e.strerror or e}", "{e.strerror and e}"),
    ("MAX_INPUT_BYTES = 64 * 2**20", "MAX_INPUT_BYTES = 65 * 2**20"),
    ("MAX_INPUT_BYTES = 64 * 2**20", "MAX_INPUT_BYTES = 63 * 2**20"),
    ("if not 1 <= hw.devices_per_node <= 2**20:", "if not 0 <= hw.devices_per_node <= 2**20:"),
    ("if not 1 <= hw.devices_per_node <= 2**20:", "if not 1 <= hw.devices_per_node <= 2** 19:"),
    ("if not isinstance(n, int) or n < 1 or not pts:\n                raise PtdError(f\"{w}{table} wants workers",
     "if not isinstance(n, int) or n < 2 or not pts:\n                raise PtdError(f\"{w}{table} wants workers"),
]
ANNOTATIONS = [
    ("def read_text_file(path: str | Path, what: str)", "def read_text_file(path: str * Path, what: str)"),
    ("name: str, base: str | None,", "name: str, base: str * None,"),
    ("name: str, base: str | None,", "name: str, base: str / None,"),
    ("def _ok(tp: Any, v: Any) -> bool | None:", "def _ok(tp: Any, v: Any) -> bool ^ None:"),
]
TARGETS = {"plan": ("src/ptd/specs/plan.py", [(m, "tests/test_mut_specs_plan.py") for m in PLAN]),
           "typecheck": ("src/ptd/specs/typecheck.py",
                         [(m, "tests/test_mut_specs_typecheck.py") for m in TYPECHECK]
                         + [(m, "tests/test_annotations.py") for m in ANNOTATIONS])}
PATH, RUNS = TARGETS[sys.argv[1]]
subprocess.run(["find", "src", "tests", "-name", "__pycache__", "-prune", "-exec", "rm", "-rf",
                "{}", "+"], check=True)
orig = open(PATH).read()
killed = 0
try:
    for (a, b), test in RUNS:
        assert orig.count(a) == 1, a
        open(PATH, "w").write(orig.replace(a, b))
        r = subprocess.run(["/work/main/.venv/bin/python", "-m", "pytest", "-q", "-n", "0", "-p",
                            "no:cacheprovider", test], capture_output=True, text=True,
                           env={"PYTHONPATH": "/tmp/mutwt/src:/tmp/mutwt/tests",
                                "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
                                "PATH": "/usr/bin:/bin"})
        killed += r.returncode != 0
        print("killed " if r.returncode else "SURVIVED", test.split("/")[-1], "|",
              b.splitlines()[0].strip(), flush=True)
finally:
    open(PATH, "w").write(orig)
print(f"{killed} of {len(RUNS)} killed")

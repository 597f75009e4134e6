"""The real survivors of the thirtieth session's cosmic-ray sample of specs/typecheck.py
(seed 20261130, 40 of 626; 20 killed, 4 annotations, 2 equivalent, 14 real), each applied to
a worktree of main (``git worktree add /tmp/mutwt HEAD``, tests/test_mut_specs_typecheck.py
in it) and run against that file; the source restored after. The four annotation mutants are
run against tests/test_annotations.py. Run from the worktree:
    /work/main/.venv/bin/python docs/data/epyc2-2026-11-30b/mutants_typecheck.py"""
import subprocess

PATH, TEST = "src/ptd/specs/typecheck.py", "tests/test_mut_specs_typecheck.py"
MUTANTS = [
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
subprocess.run(["find", "src", "tests", "-name", "__pycache__", "-prune", "-exec", "rm", "-rf",
                "{}", "+"], check=True)
orig = open(PATH).read()
killed = 0
try:
    for (a, b), test in [(m, TEST) for m in MUTANTS] + [(m, "tests/test_annotations.py")
                                                        for m in ANNOTATIONS]:
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
print(f"{killed} of {len(MUTANTS) + len(ANNOTATIONS)} killed")

"""The six real survivors of the twenty-ninth session's cost/step.py sample, each applied to
a worktree of main (``git worktree add /tmp/mutwt HEAD``, the new test file copied in) and
run against tests/test_mut_cost_step4.py; the file restored after. Run from the worktree:
    /work/main/.venv/bin/python docs/data/epyc2-2026-11-30/mutants_step.py"""
import subprocess
F = "src/ptd/cost/step.py"
MUT = [
 ("bubble += m * (2 * v - 1) * cluster.blocking_wait((f + b + rc) / (2 * v))", "bubble += m * (2 * v - 1) * cluster.blocking_wait((f * b + rc) / (2 * v))"),
 ("n_exp = sum(P.is_routed_expert(p) for p in layer) * mbt.nl", "n_exp = sum(P.is_routed_expert(p) for p in layer) / mbt.nl"),
 ("exp_numel = MOE.routed_expert_numel(model) // plan.ep * mbt.nl", "exp_numel = MOE.routed_expert_numel(model) - plan.ep * mbt.nl"),
 ("n_b = nl * tpc.n_b + (1 if r == last else 0)", "n_b = nl * tpc.n_b + (1 if r <= last else 0)"),
 ("if plan.zero >= 1 and edp > 1:", "if plan.zero >= 1 and edp <= 1:"),
 ("if plan.ep > 1 and not dtensor_params:", "if plan.ep > 1 or not dtensor_params:"),
]
orig = open(F).read()
try:
    for a, b in MUT:
        assert orig.count(a) == 1, a
        open(F, "w").write(orig.replace(a, b))
        r = subprocess.run(["/work/main/.venv/bin/python", "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                            "tests/test_mut_cost_step4.py"], capture_output=True, text=True,
                           env={"PYTHONPATH": "/tmp/mutwt/src", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
        print("KILLED" if r.returncode else "SURVIVED", "|", b, "|", r.stdout.strip().splitlines()[-1])
finally:
    open(F, "w").write(orig)

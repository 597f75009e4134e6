"""The real survivors of the twenty-ninth session's mutation samples of cost/step.py,
runtime/calibrate/profile.py, cost/dp.py, cost/estimate.py and specs/hardware.py, each applied to a worktree of main (``git worktree add
/tmp/mutwt HEAD``, the new test files in it) and run against the test file written for
them; the source file restored after. Run from the worktree:
    /work/main/.venv/bin/python docs/data/epyc2-2026-11-30/mutants.py step|profile|dp|estimate|hardware"""
import subprocess
import sys

TARGETS = {
    "step": ("src/ptd/cost/step.py", "tests/test_mut_cost_step4.py", [
        ("bubble += m * (2 * v - 1) * cluster.blocking_wait((f + b + rc) / (2 * v))",
         "bubble += m * (2 * v - 1) * cluster.blocking_wait((f * b + rc) / (2 * v))"),
        ("n_exp = sum(P.is_routed_expert(p) for p in layer) * mbt.nl",
         "n_exp = sum(P.is_routed_expert(p) for p in layer) / mbt.nl"),
        ("exp_numel = MOE.routed_expert_numel(model) // plan.ep * mbt.nl",
         "exp_numel = MOE.routed_expert_numel(model) - plan.ep * mbt.nl"),
        ("n_b = nl * tpc.n_b + (1 if r == last else 0)",
         "n_b = nl * tpc.n_b + (1 if r <= last else 0)"),
        ("if plan.zero >= 1 and edp > 1:", "if plan.zero >= 1 and edp <= 1:"),
        ("if plan.ep > 1 and not dtensor_params:", "if plan.ep > 1 or not dtensor_params:")]),
    "profile": ("src/ptd/runtime/calibrate/profile.py", "tests/test_mut_calibrate2.py", [
        ("return 3.5 * 0.5 * 4.0 * b * h * s * s * d", "return 3.5 * 0.5 * 4.0 / b * h * s * s * d"),
        ('if fit else pts.get("0", (0.0, min(p[1] for p in pts.values())))[1])',
         'if fit else pts.get("0", (0.0, min(p[ 0] for p in pts.values())))[1])'),
        ('hw["cpus"] = os.cpu_count() or 0', 'hw["cpus"] = os.cpu_count() or 1')]),
    "dp": ("src/ptd/cost/dp.py", "tests/test_mut_cost_dp3.py", [
        ("b = blk.backward + blk.recompute(plan.recompute, recompute_early_stop) + 2 * (mbt.ar + mbt.wait)",
         "b = blk.backward + blk.recompute(plan.recompute, recompute_early_stop) % 2 * (mbt.ar + mbt.wait)"),
        ("gather, reduce = 2 * c * n, 0.0", "gather, reduce = 2 * c * n, -1.0")]),
    "estimate": ("src/ptd/cost/estimate.py", "tests/test_mut_cost_estimate2.py", [
        ('and options.convention == "ptd")', 'and options.convention > "ptd")'),
        ("model_parallel = plan.tp > 1 or plan.pp > 1 or plan.cp > 1 or plan.ep > 1",
         "model_parallel = plan.tp > 1 or plan.pp > 1 and plan.cp > 1 or plan.ep > 1")]),
    "hardware": ("src/ptd/specs/hardware.py", "tests/test_mut_specs_hardware.py", [
        ("if not 1 <= self.spine_oversubscription <= 1000:",
         "if not 0 <= self.spine_oversubscription <= 1000:"),
        ("               if not 0 < r < math.inf]", "               if not 0 <= r < math.inf]"),
        ('"bf16": {1: 5.07 * G, 2: 5.06 * G, 4: 2.67 * G}},',
         '"bf16": {1: 5.07 * G, 2: 5.06 + G, 4: 2.67 * G}},'),
        ('_gpu("a100-40g", fp32=19.5 * T, tf32=156 * T,', '_gpu("a100-40g", fp32=19.5 * T, tf32= 155 * T,'),
        ("bw=1555 * G, nvlink=300 * G, nic=25 * G,", "bw=1555 * G, nvlink= 299 * G, nic=25 * G,"),
        ("bw=1555 * G, nvlink=300 * G, nic=25 * G,", "bw=1555 * G, nvlink=300 * G, nic= 24 * G,"),
        ("attn_peak_frac=0.6, attn_src=_FA2_A100, sms=108, comm_sms=24,\n             comm_sms_src=_COMM_SMS_A100),\n        _gpu(\"a100-80g\"",
         "attn_peak_frac=0.6, attn_src=_FA2_A100, sms= 107, comm_sms=24,\n             comm_sms_src=_COMM_SMS_A100),\n        _gpu(\"a100-80g\"")]),
}
path, test, mutants = TARGETS[sys.argv[1]]
# No bytecode: a mutant written within the second of the one before, at the same size, would
# otherwise run as that one's cached .pyc (Python checks a source's mtime in whole seconds)
subprocess.run(["find", "src", "tests", "-name", "__pycache__", "-prune", "-exec", "rm", "-rf",
                "{}", "+"], check=True)
orig = open(path).read()
try:
    for a, b in mutants:
        assert orig.count(a) == 1, a
        open(path, "w").write(orig.replace(a, b))
        r = subprocess.run(["/work/main/.venv/bin/python", "-m", "pytest", "-q", "-n", "0", "-p",
                            "no:cacheprovider", "-rf", test], capture_output=True, text=True,
                           env={"PYTHONPATH": "/tmp/mutwt/src:/tmp/mutwt/tests",
                                "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
                                "PATH": "/usr/bin:/bin"})
        failed = [ln.split("::")[-1].split(" ")[0] for ln in r.stdout.splitlines()
                  if ln.startswith("FAILED")]
        print("KILLED" if r.returncode else "SURVIVED", "|", b, "|", ", ".join(failed))
finally:
    open(path, "w").write(orig)

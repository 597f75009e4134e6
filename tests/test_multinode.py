"""ptd train on several nodes: two torchrun agents on this host (127.0.0.1) stand for two
nodes of 2 workers each. One multi-node run serves four checks: a worker SIGKILLed at step 3
(a lost node's process) is taken up by torchrun's restarts on both nodes, which resume from
the step-2 checkpoint; the losses are then still the one-node run's exactly; only node 0
wrote the config (and global rank 0 the metrics); and the checkpoint -- written by both
nodes into one folder, committed once -- is resumed by one node with another layout. Plus
the Slurm script, and refused input."""

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.dist

COMMON = ["--model", "tiny", "--steps", "4", "--global-batch", "8", "--seq-len", "64",
          "--warmup", "1", "--timeout", "60", "--micro-batch", "2"]
PLAN = ["--dp", "2", "--tp", "2", "--zero", "1"]
RUN_TIMEOUT = 150


def ptd(*argv, home, fault=None):
    env = {k: v for k, v in os.environ.items() if k not in ("PTD_FAULT", "PTD_DUMP_PARAMS")}
    env.update(PTD_HOME=str(home), OMP_NUM_THREADS="1", **({"PTD_FAULT": fault} if fault else {}))
    return subprocess.Popen([sys.executable, "-m", "ptd", "train", *argv], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(p, timeout=RUN_TIMEOUT):
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, out[-2000:] + err[-6000:]
    return out, err


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def losses(out):
    return [json.loads(l)["loss"] for l in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The two-node run and the one-node run of the same config, run side by side."""
    d = tmp_path_factory.mktemp("multinode")
    home = d / "home"
    home.mkdir()
    two, one = d / "two", d / "one"
    port = free_port()
    flags = [*COMMON, *PLAN, "--checkpoint-every", "2", "--checkpoint-keep", "2",
             "--max-restarts", "1"]
    nodes = [ptd(*flags, "--out", str(two), "--nnodes", "2", "--node-rank", str(r),
                 "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "t", home=home,
                 fault="kill:rank=3:step=3:restart=0")
             for r in (0, 1)]
    logs = [finish(p) for p in nodes]
    finish(ptd(*COMMON, *PLAN, "--out", str(one), home=home))
    return two, one, home, logs


@pytest.mark.timeout(3 * RUN_TIMEOUT)
def test_two_nodes_survive_a_killed_worker_and_give_the_one_node_losses(runs):
    two, one, _, logs = runs
    err = logs[0][1] + logs[1][1]
    # the SIGKILLed worker (or a peer of it that lost its connection first) failed, and
    # the workers restarted from the newest checkpoint
    assert "exitcode" in err and "step_00000002 at step 2" in err, err[-3000:]
    assert [json.loads(l)["step"] for l in (two / "metrics.jsonl").read_text().splitlines()] \
        == [1, 2, 3, 4]
    assert losses(two) == losses(one)  # bit for bit: the same ranks, the same collectives
    # node 0 wrote the config; global rank 0 the metrics and summary; nothing else of node 1
    # (and the run folder's lock, held by node 0's launcher while it ran: ptd.safeio)
    from ptd.safeio import LOCK_NAME
    names = sorted(p.name for p in two.iterdir() if not p.name.startswith(LOCK_NAME))
    assert names == ["checkpoints", "config.toml", "metrics.jsonl", "summary.json", "torchrun"]
    assert json.loads((two / "summary.json").read_text())["steps"] == 4


@pytest.mark.timeout(3 * RUN_TIMEOUT)
def test_checkpoint_written_by_two_nodes_resumes_on_one(runs, tmp_path):
    two, one, home, _ = runs
    ck = two / "checkpoints"
    assert sorted(p.name for p in ck.iterdir()) == ["step_00000002", "step_00000004"]
    # resume from step 2 (the step-4 one removed), on one node of 2 workers: dp 2, no tp
    src = tmp_path / "src"
    shutil.copytree(two, src)
    shutil.rmtree(src / "checkpoints" / "step_00000004")
    out = tmp_path / "resumed"
    _, err = finish(ptd("--resume", str(src), "--out", str(out), "--nproc", "2", "--dp", "2",
                        "--tp", "1", "--micro-batch", "2", home=home))
    assert "resumed from" in err and "step_00000002 at step 2" in err
    a, b = losses(out), losses(one)
    assert a[:2] == b[:2] and len(a) == 4
    for step in (2, 3):  # out of tensor parallelism: matmuls sum in another order
        assert abs(a[step] - b[step]) <= 1e-4 * abs(b[step]), (step, a[step], b[step])


def test_slurm_script(ptd_cli, tmp_path):
    script, out = tmp_path / "job.sbatch", tmp_path / "run"
    rc, stdout, err = ptd_cli("train", *COMMON, *PLAN, "--out", str(out), "--nnodes", "2",
                              "--slurm-script", str(script))
    assert rc == 0, err
    text = script.read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=1" in text
    assert f"ptd train --config {out / 'config.toml'}" in text
    for var in ("$SLURM_NNODES", "$SLURM_NODEID", "$HEAD:29500", "$SLURM_JOB_ID"):
        assert var in text
    assert (out / "config.toml").exists()
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0  # valid bash


@pytest.mark.parametrize("flags,msg", [
    (["--nnodes", "2"], "needs --rdzv-endpoint"),
    (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"], "--node-rank 2 is not in"),
    (["--nnodes", "2", "--rdzv-endpoint", "nohost"], "is not HOST:PORT"),
    (["--nnodes", "3", "--rdzv-endpoint", "h:1"], "do not divide over 3 nodes"),
])
def test_bad_node_flags_one_line(ptd_cli, tmp_path, flags, msg):
    rc, _, err = ptd_cli("train", *COMMON, *PLAN, "--out", str(tmp_path / "x"), *flags)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()

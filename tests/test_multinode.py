"""ptd train on several nodes: two torchrun agents on this host (127.0.0.1) stand for two
nodes of 2 workers each. One multi-node run serves four checks: node 1 dies whole at step 3
(its launcher, torchrun agent and workers SIGKILLed, as when a machine is lost) and a
replacement node 1 is started with the same command (as a scheduler's requeue would):
torchrun's restart on node 0 takes it into a new rendezvous and both resume from the step-2
checkpoint; the losses are then still the one-node run's exactly; only node 0 wrote the
config (and global rank 0 the metrics); and the checkpoint -- written by both nodes into one
folder, committed once -- is resumed by one node with another layout. Plus the Slurm script,
and refused input."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist

# (no torch.profiler steps: they cost ~1-2 s a run, and these tests compare losses)
COMMON = ["--model", "tiny", "--steps", "4", "--global-batch", "8", "--seq-len", "64",
          "--warmup", "1", "--timeout", "60", "--micro-batch", "2", "--profile-steps", "0"]
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


def wait_until(ready, what, timeout=RUN_TIMEOUT):
    t0 = time.monotonic()
    while not ready():
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.2)


def listening(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def process_tree(pid):
    """``pid`` and every process below it (torchrun starts its workers in sessions of their
    own, so a process group would miss them), read from /proc."""
    children = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:  # the process ended between the listing and the read
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(d.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    return tree


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

    started = []

    def node(rank, fault=None):
        started.append(ptd(*flags, "--out", str(two), "--nnodes", "2", "--node-rank", str(rank),
                           "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "t", home=home,
                           fault=fault))
        return started[-1]

    def kill(p):
        for pid in process_tree(p.pid):
            os.kill(pid, signal.SIGKILL)
        p.communicate(timeout=30)

    try:
        first = node(0)
        # node 0's agent hosts the rendezvous store (the first agent at the endpoint does),
        # which has to outlive node 1
        wait_until(lambda: listening(port), "node 0's rendezvous store")
        # node 1's workers stop at step 3, after the step-2 checkpoint, until it is killed
        doomed = node(1, fault="hang:rank=*:step=3:restart=0")
        wait_until(lambda: (two / "checkpoints" / "step_00000002").exists(),
                   "the step-2 checkpoint")
        kill(doomed)
        replacement = node(1)
        logs = [finish(first), finish(replacement)]
    finally:  # a run that failed or timed out leaves no process behind
        for p in started:
            if p.poll() is None:
                kill(p)
    finish(ptd(*COMMON, *PLAN, "--out", str(one), home=home))
    return two, one, home, logs


@pytest.mark.timeout(3 * RUN_TIMEOUT)
def test_two_nodes_survive_a_lost_node_and_give_the_one_node_losses(runs):
    two, one, _, logs = runs
    # node 0's workers failed when node 1 vanished, its agent restarted them (restart 1)
    # into a rendezvous with the replacement node, and they resumed from the checkpoint
    err0, err1 = logs[0][1], logs[1][1]
    assert "exitcode" in err0 and "step_00000002 at step 2" in err0 + err1, err0[-3000:]
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
    (["--nnodes", "2", "--rdzv-endpoint", "h:0"], "is not HOST:PORT"),  # ports are 1-65535
    (["--nnodes", "2", "--rdzv-endpoint", "h:65536"], "is not HOST:PORT"),
    # one node: nothing would meet there, and the flags would be ignored in silence
    (["--rdzv-endpoint", "h:29500"], "--rdzv-endpoint has no effect with --nnodes 1"),
    (["--rdzv-id", "job7"], "--rdzv-id has no effect with --nnodes 1"),
    (["--node-rank", "1"], "--node-rank has no effect with --nnodes 1"),
    # the Slurm script names its head node and node ranks itself
    (["--nnodes", "2", "--slurm-script", "s.sh", "--rdzv-endpoint", "h:1"],
     "--rdzv-endpoint has no effect with --slurm-script"),
])
def test_bad_node_flags_one_line(ptd_cli, tmp_path, flags, msg):
    rc, _, err = ptd_cli("train", *COMMON, *PLAN, "--out", str(tmp_path / "x"), *flags)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()

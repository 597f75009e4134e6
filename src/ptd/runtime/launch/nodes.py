"""Several nodes, one job: what each node's ``ptd train`` does, and the Slurm script.

Every node runs the same command with torchrun's own names::

    ptd train --config OUT/config.toml --nnodes N --node-rank R --rdzv-endpoint HOST:PORT

Each node starts ``nproc = world / N`` workers under torchrun's elastic agent; the agents
meet at ``HOST:PORT`` through the c10d rendezvous (the first agent there hosts its store),
so a worker that fails makes every node restart its workers (``--max-restarts``), which
then resume from the newest checkpoint. A node lost whole is replaced by running the same
command on another machine: the survivors' restarted agents meet it in a new rendezvous
(the host of the rendezvous store, the first agent at ``HOST:PORT``, must survive). Which
node receives global rank 0 is the rendezvous' choice, not ``--node-rank``'s.

Writing: the node with ``--node-rank 0`` writes ``OUT/config.toml``; global rank 0 (on
whichever node) writes ``metrics.jsonl`` and ``summary.json``; every worker writes its own
checkpoint shards into the checkpoint folder, which must be one folder all nodes see (a
shared file system), and the checkpoint is committed once, by global rank 0. Other nodes
keep their config copy and torchrun's logs in a private temporary folder, so nothing else
of theirs lands in OUT. No torch import here.
"""

from __future__ import annotations

import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ...errors import PtdError


@dataclass(frozen=True)
class Nodes:
    """This node's place in a multi-node job (torchrun's flags of the same names)."""

    nnodes: int
    """Nodes in the job."""
    node_rank: int
    """This node's rank (0 writes the config)."""
    rdzv_endpoint: str
    """HOST:PORT where the agents meet (the c10d rendezvous store)."""
    rdzv_id: str = "ptd"
    """Job id shared by every node's agent (Slurm: the job id)."""

    def validate(self) -> None:
        if self.nnodes < 2:
            raise PtdError("--nnodes must be at least 2 for a multi-node job")
        if not 0 <= self.node_rank < self.nnodes:
            raise PtdError(f"--node-rank {self.node_rank} is not in [0, {self.nnodes})")
        host, _, port = self.rdzv_endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise PtdError(f"--rdzv-endpoint {self.rdzv_endpoint!r} is not HOST:PORT")

    @property
    def writes_out(self) -> bool:
        return self.node_rank == 0

    def private_dir(self) -> Path:
        """Where a node other than 0 keeps its config copy and torchrun logs."""
        return Path(tempfile.mkdtemp(prefix=f"ptd-node{self.node_rank}-"))


def per_node(world: int, nnodes: int) -> int:
    """Workers on each node."""
    if world % nnodes:
        raise PtdError(f"the plan's {world} workers do not divide over {nnodes} nodes")
    return world // nnodes


def torchrun_flags(nodes: Nodes) -> list[str]:
    return ["--nnodes", str(nodes.nnodes), "--node-rank", str(nodes.node_rank),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", nodes.rdzv_endpoint,
            "--rdzv-id", nodes.rdzv_id]


def slurm_script(config: str, nnodes: int, nproc: int, gpus: bool = True, port: int = 29500,
                 job_name: str = "ptd", time_limit: str = "01:00:00") -> str:
    """An sbatch script: ``nnodes`` nodes, one ``ptd train`` task each, the rendezvous on the
    first node of the allocation (from Slurm's own variables)."""
    q = shlex.quote
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={nnodes}",
        "#SBATCH --ntasks-per-node=1          # one ptd train (torchrun agent) per node",
        f"#SBATCH --cpus-per-task={max(nproc, 1)}",
    ]
    if gpus:
        lines.append(f"#SBATCH --gpus-per-node={nproc}")
    lines += [
        f"#SBATCH --time={time_limit}",
        "# written by ptd train --slurm-script; submit with: sbatch THIS_FILE",
        "# OUT (the config's folder) and its checkpoints must be on a file system every node sees.",
        "set -euo pipefail",
        'export HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "srun --kill-on-bad-exit=1 bash -c "
        + q(f"ptd train --config {q(config)} --nnodes \"$SLURM_NNODES\" "
            f"--node-rank \"$SLURM_NODEID\" --rdzv-endpoint \"$HEAD:{port}\" "
            f"--rdzv-id \"$SLURM_JOB_ID\""),
    ]
    return "\n".join(lines) + "\n"

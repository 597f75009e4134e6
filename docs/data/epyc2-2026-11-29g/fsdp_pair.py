"""FSDP2's per-unit work on a real group (pairs of ranks; with 4 processes, two pairs or one
group of 4: GROUP=4) against the one-rank mesh the calibration times it on: ptd's
calibration model (8 blocks of 8 x 8 and a root unit, ptd's AllReduceScatter), forward
and backward per unit, less the model without FSDP and less the bare collectives FSDP
issues (one all-gather a unit forward; backward: ZeRO-3 one all-gather and one all-reduce
a unit, kept units one all-reduce), timed in the same rounds. Medians over rounds (ms)."""
import os, sys, time, statistics, tempfile
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests"))
os.environ["OMP_NUM_THREADS"] = "1"
def worker(rank, store, n, g, q):
    import warnings; warnings.filterwarnings("ignore")
    import torch, torch.distributed as dist
    torch.set_num_threads(1)
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from ptd.runtime.parallel.fsdp import AllReduceScatter
    from torch import nn
    dist.init_process_group("gloo", store=dist.FileStore(store, n), rank=rank, world_size=n)
    groups = [list(range(i, i + g)) for i in range(0, n, g)]
    pg = dist.new_subgroups_by_enumeration(groups)[0] if g < n else dist.group.WORLD
    one = [dist.new_group([r]) for r in range(n)][rank]
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleDict({str(i): nn.Linear(8, 8) for i in range(8)})
            self.norm = nn.Parameter(torch.ones(8))
        def forward(self, y):
            for l in self.layers.values(): y = l(y)
            return (y * self.norm).sum()
    x = torch.randn(4, 8)
    out = {}
    ag_out = torch.empty(72); ag_in = torch.empty(72 // g); ar = torch.empty(72)
    def bare(kinds):
        t0 = time.perf_counter()
        for k in kinds:
            for _ in range(9):
                if k == "ag": dist.all_gather_into_tensor(ag_out[: (72 // g) * g], ag_in, group=pg)
                else: dist.all_reduce(ar, group=pg)
        return time.perf_counter() - t0
    plain = Model()
    for name, mesh_pg in (("pair", pg), ("one", one)):
        mesh = DeviceMesh.from_group(mesh_pg, "cpu")
        for reshard in (True, False):
            m = Model(); units = [*m.layers.values(), m]
            for u in units:
                fully_shard(u, mesh=mesh, reshard_after_forward=reshard); u.set_custom_reduce_scatter(AllReduceScatter())
            for _ in range(3): m(x).backward(); plain(x).backward()
            F, B = [], []
            for _ in range(150):
                dist.barrier()
                t0 = time.perf_counter(); y = m(x); t1 = time.perf_counter(); y.backward(); t2 = time.perf_counter()
                y = plain(x); t3 = time.perf_counter(); y.backward(); t4 = time.perf_counter()
                bf = bb = 0.0
                if name == "pair":
                    dist.barrier(group=pg)
                    bf = bare(["ag"]); bb = bare(["ag", "ar"] if reshard else ["ar"])
                F.append((t1 - t0) - (t3 - t2) - bf); B.append((t2 - t1) - (t4 - t3) - bb)
            out[f"{name} {'zero3' if reshard else 'keep'}"] = (round(statistics.median(F) * 1e3 / 9, 3), round(statistics.median(B) * 1e3 / 9, 3))
    q.put((rank, out))
    dist.destroy_process_group()
if __name__ == "__main__":
    from helpers import run_ranks
    n = int(sys.argv[1]); g = int(os.environ.get("GROUP", "2"))
    for k, v in sorted(run_ranks(worker, n, tempfile.mkdtemp() + "/s", n, g, timeout=400).items()):
        print(f"n={n} group={g} rank {k}: (forward, backward) ms a unit:", v)

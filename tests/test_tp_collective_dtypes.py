"""The tensor-parallel collectives a block of ptd's runtime issues in bf16 (fp32 weights under
autocast), recorded on two gloo ranks, against what the cost model prices
(``ptd.cost.step._tp_collectives``): which ones move fp32 and which bf16, and how many."""

from __future__ import annotations

import pytest

from helpers import run_ranks, small_tp_block_model

TP = 2


def _worker(rank: int, store_path: str, sp: bool, q) -> None:
    import torch
    import torch.distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls: list[tuple[str, str]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func)
            if name.startswith("_c10d_functional.") and "wait" not in name \
                    and "wrap" not in name:
                t = args[0]
                self.calls.append((name.split(".")[1], str(t.dtype).replace("torch.", "")))
            return func(*args, **(kwargs or {}))

    model = small_tp_block_model(rank, store_path, TP, sp)
    try:
        spec = model.spec
        x = torch.randn(3, 64 // TP if sp else 64, spec.hidden, requires_grad=True)
        rec = Record()
        with rec:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = model.layers["0"](x, (model.rope_cos, model.rope_sin))
            n_fwd = len(rec.calls)
            y.float().sum().backward()
        q.put((rank, (rec.calls[:n_fwd], rec.calls[n_fwd:])))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sp", [False, True])
def test_a_bf16_blocks_collectives_move_what_the_cost_model_prices(sp, tmp_path, monkeypatch):
    runs = run_ranks(_worker, TP, str(tmp_path / "store"), sp)
    got = {rank: (sorted(fwd), sorted(bwd)) for rank, (fwd, bwd) in runs.items()}
    assert got[0] == got[1]
    fwd, bwd = got[0]
    if sp:
        ag, rs = "all_gather_into_tensor", "reduce_scatter_tensor"
        # the gathers before the column-parallel layers carry the fp32 norm outputs; the
        # row-parallel outputs are bf16; backward the reverse
        assert fwd == sorted([(ag, "float32")] * 2 + [(rs, "bfloat16")] * 2)
        assert bwd == sorted([(ag, "bfloat16")] * 2 + [(rs, "float32")] * 2)
    else:
        # the row-parallel outputs (bf16); each linear's fp32 input gradient
        assert fwd == [("all_reduce", "bfloat16")] * 2
        assert bwd == [("all_reduce", "float32")] * 5
    # the cost model: as many, at those bytes (a gather + scatter pair as their mean)
    from ptd.cost import step as S
    from ptd.specs import ClusterSpec, get_preset, load_hardware
    from ptd.specs.plan import ParallelPlan
    monkeypatch.setattr(S, "_coll", lambda kind, nbytes, *a, **k: float(nbytes))
    plan = ParallelPlan(tp=TP, sp=sp, micro_batch=1, global_batch=1, seq_len=64, dtype="bf16")
    t = S._tp_collectives(get_preset("small"), plan, ClusterSpec(load_hardware("h100-sxm"), TP),
                          64, True, elementwise="autocast")
    per_value = 64 * 256  # tokens x hidden
    size = {"float32": 4, "bfloat16": 2}
    pairs = 2 if sp else 1  # collectives a priced "all-reduce" stands for
    assert t.n_f * pairs == len(fwd) and t.n_b * pairs == len(bwd)
    assert t.ar_f * t.n_f == sum(size[d] for _, d in fwd) / pairs * per_value
    assert t.ar_b * t.n_b == sum(size[d] for _, d in bwd) / pairs * per_value

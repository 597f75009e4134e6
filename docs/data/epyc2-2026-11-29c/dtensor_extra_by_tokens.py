"""One process: one block and the output layer with the loss of a model (default small),
forward and backward, with tensor parallelism on a one-rank mesh against without, at 8 to
2048 tokens (the calibration's dtensor_op stage at 8 tokens, at larger sizes)."""
import os, time, tempfile, contextlib, statistics
os.environ["OMP_NUM_THREADS"] = "1"
import torch, torch.distributed as dist
torch.set_num_threads(1)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import loss_parallel
from ptd.runtime.model.init import materialize
from ptd.runtime.model.transformer import build_model, lm_loss_sum
from ptd.runtime.parallel.tp import apply_tp
from ptd.runtime.measure.opcount import DTensorOpCounter
from ptd.specs.plan import ParallelPlan
from ptd.specs.model import load_model
import sys
d = tempfile.mkdtemp()
dist.init_process_group("gloo", store=dist.FileStore(d + "/s", 1), rank=0, world_size=1)
spec = load_model(sys.argv[1] if len(sys.argv) > 1 else "small")
def build(tp):
    m = build_model(spec, "meta")
    if tp: apply_tp(m, init_device_mesh("cpu", (1,)), ParallelPlan(tp=1, seq_len=8))
    materialize(m, torch.device("cpu"), seed=0); return m
plain, tpm = build(False), build(True)
for tokens in (8, 128, 512, 2048):
    b, s = (1, tokens) if tokens <= 512 else (tokens // 512, 512)
    x = torch.randn(b, s, spec.hidden, requires_grad=True); h = torch.randn(b, s, spec.hidden, requires_grad=True)
    t = torch.randint(0, spec.vocab_size, (b, s))
    def once(model, lc):
        rope = (model.rope_cos[:s], model.rope_sin[:s]) if model.rope_cos is not None else None
        y = model.layers["0"](x, rope); y.backward(torch.ones_like(y))
        with lc(): lm_loss_sum(model.output(model.norm(h)), t).backward()
    def tm(f):
        t0 = time.perf_counter(); f(); return time.perf_counter() - t0
    for _ in range(3): once(tpm, loss_parallel); once(plain, contextlib.nullcontext)
    with DTensorOpCounter() as c: once(tpm, loss_parallel)
    n = 41 if tokens <= 128 else 15
    ex, pl = [], []
    for _ in range(n):
        a = tm(lambda: once(plain, contextlib.nullcontext)); bb = tm(lambda: once(tpm, loss_parallel)); ex.append(bb - a); pl.append(a)
    e, p = statistics.median(ex), statistics.median(pl)
    print(f"{tokens:5d} tokens: ops {c.dtensor} plain {p*1e3:7.2f} ms extra {e*1e3:6.2f} ms ({e/c.dtensor*1e6:5.1f} us/op, {e/p*100:5.1f}% of plain)")

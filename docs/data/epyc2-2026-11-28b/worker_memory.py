"""Memory bandwidth as a training worker sees it: run under torchrun --nproc_per_node 1
(docs/measuring.md, eleventh session). Before building ptd's small model and after three
of its training steps, the drift probe's copy and add (GB/s)."""
import os, torch
torch.set_num_threads(1)
from ptd.runtime.calibrate import drift
from ptd.specs.model import load_model
from ptd.runtime.model.transformer import build_model, lm_loss_sum
from ptd.runtime.model.init import materialize
before = [round(drift.measure_now()['memory_bandwidth']/1e9,1) for _ in range(2)]
spec = load_model("small")
m = materialize(build_model(spec, "meta"), "cpu", 0)
opt = torch.optim.AdamW(m.parameters())
x = torch.randint(0, 256, (16, 129))
for _ in range(3):
    loss = lm_loss_sum(m(x[:, :-1]), x[:, 1:]) / 2048; loss.backward(); opt.step(); opt.zero_grad()
after = [round(drift.measure_now()['memory_bandwidth']/1e9,1) for _ in range(2)]
print("before model", before, "after 3 training steps", after, flush=True)

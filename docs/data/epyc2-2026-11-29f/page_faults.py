"""Minor page faults and system time per training step of `small` (2048 tokens, one process).
Run plain and with MALLOC_MMAP_THRESHOLD_=1000000000 MALLOC_TRIM_THRESHOLD_=1000000000000
(glibc never returns memory): 513 / 509 ms a step with 3108 / 6977 faults, 500 / 493 ms with
0 / 26 (twenty-sixth session)."""
import torch, time, resource, sys
torch.set_num_threads(1); torch.manual_seed(0)
from ptd.specs import get_preset
from ptd.runtime.model.transformer import build_model, lm_loss_sum
m = build_model(get_preset("small"), device="cpu")
opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
x = torch.randint(0, 256, (8, 256)); y = torch.randint(0, 256, (8, 256))
def step():
    loss = lm_loss_sum(m(x), y) / y.numel(); loss.backward(); opt.step(); opt.zero_grad()
for _ in range(3): step()
r0 = resource.getrusage(resource.RUSAGE_SELF); t = time.perf_counter()
N = 5
for _ in range(N): step()
dt = (time.perf_counter() - t) / N; r1 = resource.getrusage(resource.RUSAGE_SELF)
print(f"step {dt*1e3:.1f} ms; minor faults/step {(r1.ru_minflt-r0.ru_minflt)/N:.0f}; sys time/step {(r1.ru_stime-r0.ru_stime)/N*1e3:.1f} ms; user {(r1.ru_utime-r0.ru_utime)/N*1e3:.1f} ms")

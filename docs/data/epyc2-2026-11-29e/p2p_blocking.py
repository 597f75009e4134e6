"""Two gloo ranks: does a blocked receive use CPU, and does a send complete before its
receive is posted? (twenty-fifth session)

    OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc-per-node 2 docs/data/epyc2-2026-11-29e/p2p_blocking.py
"""
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
r = dist.get_rank()
x = torch.zeros(65536)
dist.barrier()
t0 = time.perf_counter(); c0 = time.process_time()
if r == 0:
    time.sleep(2.0); dist.send(x, 1)
else:
    dist.recv(x, 0)
t1 = time.perf_counter(); c1 = time.process_time()
print(r, "wall", round(t1-t0,3), "cpu", round(c1-c0,3), flush=True)
# p2p irecv wait through batch_isend_irecv as pipelining does
dist.barrier()
t0 = time.perf_counter(); c0 = time.process_time()
if r == 0:
    time.sleep(2.0); w = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, 1)]); [a.wait() for a in w]
else:
    w = dist.batch_isend_irecv([dist.P2POp(dist.irecv, x, 0)]); [a.wait() for a in w]
t1 = time.perf_counter(); c1 = time.process_time()
print(r, "batch wall", round(t1-t0,3), "cpu", round(c1-c0,3), flush=True)
# send before recv posted: does the send complete?
dist.barrier()
t0 = time.perf_counter()
if r == 0:
    w = dist.isend(x, 1); w.wait(); print("send done after", round(time.perf_counter()-t0,3), flush=True)
else:
    time.sleep(1.0); dist.recv(x, 0)
dist.destroy_process_group()

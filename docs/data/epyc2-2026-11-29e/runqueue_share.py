"""How fast one worker computes beside others on this box's shared cores (twenty-fifth
session). One foreground process times a chunk of work (the small preset's one block,
forward and backward, micro-batch 2 x 128 tokens), continuously and after a 10 ms sleep,
while 0-3 background processes compute the same chunk without pause.

Fluid processor sharing of two cores would give the foreground 2/3 of a core beside two
others (1.5x its time alone); per-core run queues put it on a core with one of them (2x).

    OMP_NUM_THREADS=1 .venv/bin/python docs/data/epyc2-2026-11-29e/runqueue_share.py
"""
import multiprocessing as mp
import os
import statistics as st
import time


def worker(role, q, stop):
    import dataclasses

    import torch
    torch.set_num_threads(1)
    from ptd.runtime.model.transformer import build_model
    from ptd.specs import get_preset
    spec = dataclasses.replace(get_preset("small"), n_layers=1)
    model = build_model(spec, "cpu")
    x = torch.randint(0, spec.vocab_size, (2, 128))

    def chunk():
        model(x).float().sum().backward()
    for _ in range(5):
        chunk()
    if role == "bg":
        while not stop.is_set():
            chunk()
        return
    res = {}
    for sleep in (0, 0.01, 0):
        ts = []
        for _ in range(40):
            if sleep:
                time.sleep(sleep)
            t = time.perf_counter()
            chunk()
            ts.append(time.perf_counter() - t)
        res.setdefault(sleep, []).append(round(st.median(ts) * 1e3, 2))
    q.put(res)


if __name__ == "__main__":
    os.environ["OMP_NUM_THREADS"] = "1"
    ctx = mp.get_context("spawn")
    for nbg in (0, 1, 2, 3):
        q, stop = ctx.Queue(), ctx.Event()
        bgs = [ctx.Process(target=worker, args=("bg", q, stop)) for _ in range(nbg)]
        for b in bgs:
            b.start()
        time.sleep(2)
        fg = ctx.Process(target=worker, args=("fg", q, stop))
        fg.start()
        r = q.get()
        stop.set()
        fg.join()
        for b in bgs:
            b.join()
        print(f"{nbg} background: foreground chunk ms, continuous {r[0]}, after a 10 ms sleep {r[0.01]}")

"""Two independent processes each run the local shapes of a tp-2 rank (half the heads, half
the MLP, half the vocabulary) as a plain model: compute with two workers, no collectives."""
import os, sys, time, multiprocessing as mp, dataclasses
def run(tp, q, bar, n_steps):
    import torch; torch.set_num_threads(1)
    from ptd.specs.model import load_model
    from ptd.runtime.model.transformer import build_model, lm_loss_sum
    from ptd.runtime.model.init import materialize
    spec = load_model("small")
    loc = dataclasses.replace(spec, n_heads=spec.n_heads // tp, n_kv_heads=spec.n_kv_heads // tp,
                              ffn_hidden=spec.ffn_hidden // tp, vocab_size=spec.vocab_size // tp, vocab_multiple=1)
    # keep head_dim
    model = materialize(build_model(loc), "cpu", 0)
    x = torch.randint(0, loc.vocab_size, (16, 128)); y = torch.randint(0, loc.vocab_size, (16, 128))
    def step():
        t0 = time.perf_counter(); l = lm_loss_sum(model(x), y) / 2048; t1 = time.perf_counter(); l.backward(); t2 = time.perf_counter()
        for p in model.parameters(): p.grad = None
        return t1 - t0, t2 - t1
    for _ in range(3): step()
    bar.wait()
    r = [step() for _ in range(n_steps)]
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(4): step()
    agg = {e.key: e.self_cpu_time_total / 4 / 1e3 for e in prof.key_averages()}
    if os.environ.get("DUMP"): import json; json.dump(agg, open(os.environ["DUMP"], "w"))
    f = sorted(a for a, b in r)[n_steps // 2]; b = sorted(b for a, b in r)[n_steps // 2]
    q.put((f, b))
if __name__ == "__main__":
    mp.set_start_method("spawn")
    tp = int(sys.argv[1]); nproc = int(sys.argv[2])
    for rep in range(1):
        q = mp.Queue(); bar = mp.Barrier(nproc)
        ps = [mp.Process(target=run, args=(tp, q, bar, 9)) for _ in range(nproc)]
        [p.start() for p in ps]; res = [q.get() for _ in ps]; [p.join() for p in ps]
        print(f"tp-{tp} shard x{nproc} procs: " + ", ".join(f"fwd {f*1e3:.1f} bwd {b*1e3:.1f}" for f, b in res))

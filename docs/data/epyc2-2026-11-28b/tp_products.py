"""tp 2's products alone, each on two workers at once, against their price (docs/measuring.md,
eleventh session): OMP_NUM_THREADS=1 python tp_products.py (a calibrated profile needed)."""
import torch, time, sys, multiprocessing as mp
from ptd.specs import ClusterSpec
from ptd.specs.model import load_model
from ptd.specs.hardware import load_hardware
from ptd.cost import compute as C
spec = load_model("small"); hw = load_hardware("calibrated")
def work(q, bar, gemms):
    torch.set_num_threads(1)
    res = []
    for g in gemms:
        m, n, k = int(g.m), int(g.n), int(g.k)
        x = torch.randn(m, k); w = torch.randn(n, k); dy = torch.randn(m, n)
        def fwd(): x @ w.t()
        def bwd(): dy @ w; dy.t() @ x
        out = []
        for fn in (fwd, bwd):
            for _ in range(3): fn()
            bar.wait(); best = 1e9
            for r in range(5):
                t0 = time.perf_counter(); c = 0
                while time.perf_counter() - t0 < 0.1: fn(); c += 1
                best = min(best, (time.perf_counter() - t0) / c)
            out.append(best)
        res.append(out)
    q.put(res)
for tp, nw in ((1, 1), (2, 2)):
    lin, _ = C.block_gemms(spec, 2048, 128, 16, tp)
    cl = ClusterSpec(hw, nw); rate, bw = cl.gemm_rate("fp32"), cl.memory_bandwidth
    q = mp.Queue(); bar = mp.Barrier(nw)
    ps = [mp.Process(target=work, args=(q, bar, lin)) for _ in range(nw)]
    [p.start() for p in ps]; rs = [q.get() for _ in ps]; [p.join() for p in ps]
    tot_m = tot_p = 0
    for i, g in enumerate(lin):
        pred = C.gemm_time(g, rate, bw, 4, hw, "fp32") / g.count
        meas = max(r[i][0] for r in rs)
        measb = max(r[i][1] for r in rs)
        tot_m += (meas + measb) * g.count; tot_p += 3 * pred * g.count
        print("tp%d %dw %5dx%4dx%4d fwd meas %.2f pred %.2f (%.2f)  bwd meas %.2f pred %.2f (%.2f)" % (tp, nw, g.m, g.n, g.k, meas*1e3, pred*1e3, meas/pred, measb*1e3, 2*pred*1e3, measb/2/pred))
    print("   block total meas %.1f pred %.1f ms ratio %.3f" % (tot_m*1e3, tot_p*1e3, tot_m/tot_p))

"""ptd.cost.step's composition worked by hand, where the aggregate tests do not look: which
group each axis prices (context parallelism joins data parallelism only), the
tensor-parallel collective counts of a block and of the output layer, the slowest rank's
tp times, the optimizer's inputs (ZeRO's shard, the tensor count, which per-tensor overhead,
the norms' all-reduces under sequence parallelism) and the shared-core rate ratio of a
calibrated CPU (per-core run queues) with a pipeline's mean over the ranks computing.

The pricing functions step.py composes (block and output times, collectives, the optimizer
step) are replaced by stand-ins of known value, so that each expected value is arithmetic
on those values, written out in the comments; the groups come from the placement rule of
``ptd.specs.layout`` (row-major over pp, dp, cp, tp).

Written from the surviving mutants of a 30-mutant sample of step.py
(``scripts/mutation_sample.py sample ... --n 30 --seed 20261127``).
"""
import pytest

from ptd.cost import compute as C
from ptd.cost import params as P
from ptd.cost import step as S
from ptd.errors import PtdError
from ptd.specs.hardware import ClusterSpec, load_hardware
from ptd.specs.model import ModelSpec
from ptd.specs.plan import ParallelPlan


def exact(x):
    return pytest.approx(x, rel=1e-12, abs=0)


LLAMA = ModelSpec(name="l", n_layers=4, hidden=8, n_heads=2, n_kv_heads=2, ffn_hidden=16,
                  vocab_size=128, max_seq_len=64, mlp="swiglu", norm="rmsnorm",
                  position="rope", tied_embeddings=False, bias=False)
# GPT-2's layout: LayerNorm with bias, learned positions, biases, GELU, tied output
GPT2 = ModelSpec(name="g", n_layers=4, hidden=8, n_heads=2, n_kv_heads=2, ffn_hidden=32,
                 vocab_size=128, max_seq_len=64, mlp="gelu", norm="layernorm",
                 position="learned", tied_embeddings=True, bias=True)

GPU = load_hardware("h100-sxm")  # no calibrated waits or overheads: blocking waits are 0


def _bytes_as_seconds(calls):
    """A stand-in collective: ``nbytes`` seconds, every call recorded."""
    def coll(kind, nbytes, n, hw, nodes=1, per_node=None):
        calls.append((kind, nbytes, n, nodes, per_node))
        return float(nbytes)
    return coll


# ------------------------------------------------------------------ groups

def test_group_context_parallelism_joins_data_parallelism_only():
    # 8 ranks, 4 to a node, laid out (pp, dp, cp, tp) = (1, 2, 2, 2): rank = (dp*2 + cp)*2 + tp
    plan = ParallelPlan(dp=2, tp=2, pp=1, cp=2)
    cluster = ClusterSpec(GPU, 8, 4)
    # tp: rank 0's peers 0, 1 -- one node, 2 on it
    assert S._group(plan, cluster, "tp") == (2, 1, 2)
    # dp with cp: the gradient group is dp x cp = ranks 0, 2 (cp 1), 4 (dp 1), 6: nodes 0 and
    # 1, two on each
    assert S._group(plan, cluster, "dp") == (4, 2, 2)
    # without cp, dp alone: ranks (dp*1 + 0)*2 = 0, 2 of (1, 2, 1, 2) on nodes of 4: one node
    assert S._group(ParallelPlan(dp=2, tp=2, pp=1, cp=1), ClusterSpec(GPU, 4, 4), "dp") == (2, 1, 2)


def test_group_pipeline_with_context_parallelism_is_the_pipeline():
    # (pp, dp, cp, tp) = (2, 1, 2, 2): stages 4 ranks apart, rank 0's pipeline peers 0 and 4,
    # on nodes of 4: two nodes, one each (not the dp x cp group 0, 2)
    plan = ParallelPlan(dp=1, tp=2, pp=2, cp=2)
    assert S._group(plan, ClusterSpec(GPU, 8, 4), "pp") == (2, 2, 1)


# ------------------------------------------------------------------ tp collectives

@pytest.mark.parametrize("sp", [False, True])
def test_tp_collectives_by_hand(monkeypatch, sp):
    calls = []
    monkeypatch.setattr(S, "_coll", _bytes_as_seconds(calls))
    plan = ParallelPlan(dp=1, tp=2, pp=1, sp=sp, micro_batch=1, global_batch=1, seq_len=5,
                        dtype="bf16")
    t = S._tp_collectives(LLAMA, plan, ClusterSpec(GPU, 2), 5, True)
    ar, nbf, nbb, nof, tpof = t.ar_f, t.n_f, t.n_b, t.n_out_f, t.out_f
    # the block's activation all-reduce: 2 bytes x 5 tokens x hidden 8 = 80; the loss's
    # fp32 per token, 4 x 5 = 20, three of them (max, sum of exponentials, target logit);
    # kernels in the compute dtype (not ptd's autocast): every collective 2 bytes a value
    assert ar == t.ar_b == t.ar_end == 80.0 and t.n_rc == 0
    assert sorted(set(calls)) == [("all_reduce", 20, 2, 1, 2), ("all_reduce", 80, 2, 1, 2)]
    assert nbf == 2
    if sp:
        # sequence parallel: one all-gather + reduce-scatter pair per block each way, and the
        # gather before the output layer (an activation's worth) beside the loss's three
        assert (nbb, nof, tpof) == (2, 4, 80.0 + 3 * 20.0)
    else:
        # per linear: wq, wk, wv, w1, w3 each all-reduce their input gradient
        assert (nbb, nof, tpof) == (5, 3, 3 * 20.0)


def test_tp_collectives_fused_inputs_gelu_and_full_recompute(monkeypatch):
    monkeypatch.setattr(S, "_coll", _bytes_as_seconds([]))
    plan = ParallelPlan(dp=1, tp=2, pp=1, micro_batch=1, global_batch=1, seq_len=5,
                        dtype="bf16", recompute="full")
    # GELU per linear: wq, wk, wv, w1 = 4, and full recompute repeats the forward's 2: 6
    assert S._tp_collectives(GPT2, plan, ClusterSpec(GPU, 2), 5, True).n_b == 6
    # fused inputs (Megatron): 2, plus recompute's 2
    t = S._tp_collectives(GPT2, plan, ClusterSpec(GPU, 2), 5, False)
    assert (t.n_b, t.n_rc) == (4, 2)


# ------------------------------------------------------------------ micro-batch

# one rank, 4 blocks, first and last stage, full recompute; f = 4 x 3 + 7 = 19,
# b = 4 x 5 + 11 = 31, rc = 4 x (3 - 0.5) = 10 (early stop). Collectives (forward pair,
# backward pair, embedding / output-layer input gradient), 2 a block forward, 5 backward of
# which 2 are the recomputed forward's, the output layer 3 forward in 0.75 s:
#   equal, 0.25 each: tf = 4 x 2 x 0.25 + 0.25 + 0.75 = 3;  tb = 4 x 5 x 0.25 + 0.25 = 5.25
#   0.25 / 0.5 / 1.0: tf = 4 x 2 x 0.25 + 1.0 + 0.75 = 3.75;
#                     tb = 4 x (3 x 0.5 + 2 x 0.25) + 1.0 = 9.0
@pytest.mark.parametrize("ars,tf,tb", [((0.25, 0.25, 0.25), 3.0, 5.25),
                                       ((0.25, 0.5, 1.0), 3.75, 9.0)])
def test_micro_batch_tensor_parallel_times_by_hand(monkeypatch, ars, tf, tb):
    blk = C.BlockTime(forward=3.0, backward=5.0, attention_forward=1.0, last_matmul_forward=0.5)
    monkeypatch.setattr(S, "_block_time", lambda *a, **k: blk)
    monkeypatch.setattr(S, "_output_time", lambda *a, **k: (7.0, 11.0))
    monkeypatch.setattr(S, "_tp_collectives",
                        lambda *a, **k: S.TPCollectives(*ars, 2, 5, 2, 3, 0.75))
    plan = ParallelPlan(dp=1, tp=2, pp=1, micro_batch=1, global_batch=1, seq_len=8,
                        dtype="bf16", recompute="full")
    mb = S.micro_batch(LLAMA, plan, ClusterSpec(GPU, 2), "flash", True, True)
    assert (mb.f, mb.b, mb.rc, mb.tf, mb.tb, mb.nl) == (19.0, 31.0, 10.0, tf, tb, 4)
    assert (mb.ar, mb.wait) == (0.25, 0.0)


# ------------------------------------------------------------------ optimizer

def _mbt(nl, wait=0.0):
    blk = C.BlockTime(forward=1.0, backward=2.0, attention_forward=0.5)
    return S.MicroBatch(f=1.0, b=2.0, rc=0.0, tf=0.0, tb=0.0, nl=nl, blk=blk, ar=0.0, wait=wait)


def _record_optimizer(monkeypatch, local=1200):
    seen = []

    def opt(local_params, n_tensors, hw, offload=False, bw=None, overhead=None, per_tensor=None,
            per_param=None):
        seen.append((local_params, n_tensors, per_tensor))
        return 1.0
    monkeypatch.setattr(C, "optimizer_time", opt)
    monkeypatch.setattr(P, "max_local_numel", lambda model, plan: local)
    return seen


def _hw_with_optimizer_overheads():
    return GPU.replace(overheads_measured={"optimizer_tensor": {8: 1e-3},
                                           "optimizer_tensor_dtensor": {8: 2e-3}})


def test_optimizer_zero_shards_and_counts_tensors(monkeypatch):
    seen = _record_optimizer(monkeypatch)
    cluster = ClusterSpec(_hw_with_optimizer_overheads(), 3)
    plan = ParallelPlan(dp=3, tp=1, pp=1, zero=1, micro_batch=1, global_batch=3, seq_len=8)
    calls = []
    monkeypatch.setattr(S, "_coll", _bytes_as_seconds(calls))
    # and the gradient norm's one scalar all-reduce over the dp 3 shards: 4 bytes (4 s here)
    assert S.optimizer_time(GPT2, plan, cluster, _mbt(3)) == (1.0 + 4.0, 0.0)
    assert calls == [("all_reduce", 4, 3, 1, 3)]
    # ZeRO-1 over dp 3: 1200 / 3 = 400 parameters. Tensors: a GPT-2 block registers 16 --
    # two norms' weights and biases (4), wq, wk, wv, wo and their biases (8), w1, w2 and
    # their biases (4) -- three blocks 48, and outside them wte, wpe, ln_f.weight and
    # ln_f.bias (tied output: no separate matrix): 4; 52 in all. ZeRO's shards are DTensors:
    # the dtensor per-tensor overhead.
    assert seen == [(400.0, 52, 2e-3)]


def test_optimizer_without_zero_or_tp_plain_tensors(monkeypatch):
    seen = _record_optimizer(monkeypatch)
    cluster = ClusterSpec(_hw_with_optimizer_overheads(), 3)
    plan = ParallelPlan(dp=3, tp=1, pp=1, zero=0, micro_batch=1, global_batch=3, seq_len=8)
    S.optimizer_time(GPT2, plan, cluster, _mbt(3))
    assert seen == [(1200, 52, 1e-3)]  # every parameter, plain tensors


def test_optimizer_norm_all_reduces_under_sequence_parallelism(monkeypatch):
    seen = _record_optimizer(monkeypatch)
    calls = []
    monkeypatch.setattr(S, "_coll", _bytes_as_seconds(calls))
    cluster = ClusterSpec(_hw_with_optimizer_overheads(), 2)
    sp = ParallelPlan(dp=1, tp=2, pp=1, sp=True, micro_batch=1, global_batch=1, seq_len=8)
    # RMSNorm: two norm weights per block over 3 blocks and the final norm: 7 all-reduces of
    # hidden 8 fp32 = 32 bytes (32 s with the stand-in), each with the 0.5 s blocking wait
    # (and the optimizer phase holds the gradient norm's scalar all-reduce over tp: 4 s here)
    assert S.optimizer_time(LLAMA, sp, cluster, _mbt(3, wait=0.5)) == (1.0 + 4.0, 7 * 32.5)
    # LayerNorm: weight and bias: 2 x (2 x 3 + 1) = 14
    assert S.optimizer_time(GPT2, sp, cluster, _mbt(3, wait=0.5)) == (1.0 + 4.0, 14 * 32.5)
    assert calls[:2] == [("all_reduce", 4, 2, 1, 2), ("all_reduce", 32, 2, 1, 2)]
    # tp 2: DTensor parameters
    assert {s[2] for s in seen} == {2e-3}
    # without sequence parallelism, or with ZeRO (FSDP reduces them), no such all-reduces
    plain = ParallelPlan(dp=1, tp=2, pp=1, sp=False, micro_batch=1, global_batch=1, seq_len=8)
    assert S.optimizer_time(LLAMA, plain, cluster, _mbt(3))[1] == 0.0
    zero = ParallelPlan(dp=1, tp=2, pp=1, sp=True, zero=1, micro_batch=1, global_batch=1,
                        seq_len=8)
    assert S.optimizer_time(LLAMA, zero, cluster, _mbt(3))[1] == 0.0


# ------------------------------------------------------------------ CPU sharing

# per-worker matmul rates measured with 1, 2 and 4 workers at once: 100, 80, 30 FLOP/s
SHARED = load_hardware("cpu").replace(gemm_flops_measured={"fp32": {1: 100.0, 2: 80.0, 4: 30.0}})


def test_shared_rate_ratio_per_core_run_queues_by_hand():
    # the node's cores N: where N R_N peaks, max(1 x 100, 2 x 80, 4 x 30) at N = 2.
    # W = 4 workers, the step priced at R_4 = 30; the ratio is R_4 x the mean time per FLOP
    cluster = ClusterSpec(SHARED, 4, 4)
    assert S.shared_rate_ratio(cluster, "fp32", 1) == exact(30 / 100)   # a core alone: R_1
    assert S.shared_rate_ratio(cluster, "fp32", 2) == exact(30 / 80)    # one each: R_2
    # three on two cores: one core holds two (each at R_4, two to a core), the other one
    # (at R_2); mean time (2 / 30 + 1 / 80) / 3 -- not processor sharing's C / 3 = 160 / 3
    assert S.shared_rate_ratio(cluster, "fp32", 3) == exact(30 * (2 / 30 + 1 / 80) / 3)
    # eight workers on the same two cores (R_8 = 30 x 4 / 8 = 15 beyond the table):
    # 4 busy: two a core, 1 / R_4; 5: 3 + 2, (2 / R_4 + 3 / R_6) / 5 with R_6 = 30 x 4 / 6 = 20;
    # 6: three a core, 1 / R_6; 7: 4 + 3, (3 / R_6 + 4 / R_8) / 7
    eight = ClusterSpec(SHARED, 8, 8)
    assert S.shared_rate_ratio(eight, "fp32", 4) == exact(15 / 30)
    assert S.shared_rate_ratio(eight, "fp32", 5) == exact(15 * (2 / 30 + 3 / 20) / 5)
    assert S.shared_rate_ratio(eight, "fp32", 6) == exact(15 / 20)
    assert S.shared_rate_ratio(eight, "fp32", 7) == exact(15 * (3 / 20 + 4 / 15) / 7)


def test_shared_rate_ratio_edges_by_hand():
    # all of a 3-worker node computing: nothing lent, 1 -- although three on two cores run
    # faster on average than the step's rate R_3 (the table's R_4 entry) prices them
    three = ClusterSpec(SHARED, 3, 3)
    assert S.shared_rate_ratio(three, "fp32", 3) == 1.0
    assert S.shared_rate_ratio(three, "fp32", 2) == exact(30 / 80)
    # a noisy table whose one-worker rate reads below the four-worker one: never above 1
    odd = ClusterSpec(SHARED.replace(gemm_flops_measured={"fp32": {1: 20.0, 2: 80.0, 4: 30.0}}),
                      4, 4)
    assert S.shared_rate_ratio(odd, "fp32", 1) == 1.0
    # where the aggregate rate ties (2 x 60 = 4 x 30 = 120) the cores are the smaller count,
    # 2: three busy are two on one core and one alone, 30 (2 / 30 + 1 / 60) / 3; read as 4
    # cores, each would have its own (the R_4 entry): 1
    tie = ClusterSpec(SHARED.replace(gemm_flops_measured={"fp32": {1: 100.0, 2: 60.0, 4: 30.0}}),
                      4, 4)
    assert S.shared_rate_ratio(tie, "fp32", 3) == exact(30 * (2 / 30 + 1 / 60) / 3)


def test_fill_slots_by_hand():
    # p - 1 over the stages a rank holds; zero-bubble (ZB-V: two stages a rank, v 2) half
    # that, (4 - 1) / (2 x 2), and none with m >= 2p
    plan = ParallelPlan(dp=1, tp=1, pp=4, micro_batch=1, global_batch=8, seq_len=8)
    assert S._fill(plan) == 3.0
    assert S._fill(plan.replace(schedule="zero-bubble")) == 0.0          # m = 8 = 2p
    assert S._fill(plan.replace(schedule="zero-bubble", global_batch=7)) == 0.75
    inter = ParallelPlan(dp=1, tp=1, pp=2, vpp=2, schedule="interleaved-1f1b", micro_batch=1,
                         global_batch=4, seq_len=8)
    assert S._fill(inter) == 0.5


def test_shared_rate_ratio_reads_the_recorded_cpus():
    # the same table on a node that recorded 4 logical CPUs: up to 4 workers each have a
    # run queue, at the table's rate for that many (3 reads R_4's entry, the nearest
    # measured count at or above it): 3 busy cost what 4 do, 2 busy R_4 / R_2
    four = ClusterSpec(SHARED.replace(cpus=4), 4, 4)
    assert S.shared_rate_ratio(four, "fp32", 3) == 1.0
    assert S.shared_rate_ratio(four, "fp32", 2) == exact(30 / 80)
    # and one CPU: two busy share it, at R_2 each (the table's two-worker rate)
    one = ClusterSpec(SHARED.replace(cpus=1), 4, 4)
    assert S.shared_rate_ratio(one, "fp32", 2) == exact(30 / 80)
    assert S.shared_rate_ratio(one, "fp32", 1) == exact(30 / 100)


def test_hardware_cpus_must_be_a_count():
    for bad in (-1, 2**21):
        with pytest.raises(PtdError, match="cpus must be an integer in 0..2"):
            SHARED.replace(cpus=bad)
    assert load_hardware("cpu").cpus == 0  # the preset's cores: where its table peaks


def test_pipeline_sharing_takes_the_mean_over_the_others_by_hand():
    cluster = ClusterSpec(SHARED, 4, 4)
    # no collectives (waiting 0): each other rank computes in m of the m + fill slots,
    # P = 1 / (1 + 3) = 1/4, so X ~ Binomial(3, 1/4) others compute beside the rank:
    # probabilities 27/64, 27/64, 9/64, 1/64 of 0..3, at ratios 0.3, 0.375, 0.791..., 1
    want = (27 * 0.3 + 27 * 0.375 + 9 * (30 * (2 / 30 + 1 / 80) / 3) + 1 * 1.0) / 64
    assert S.pipeline_sharing(cluster, "fp32", 1, 1, 3.0, 3.5, 0.0) == exact(want)
    # tp pairs (group 2): the one other pair computes with P = u m / (m + fill), where the
    # pair computes u = k c / (k c + waiting) of its slots. c = 1, waiting 1, m 4, fill 1:
    # k = (1 - P) R_4 / R_2 + P = 0.375 + 0.625 P, P = 0.8 k / (k + 1), so
    # k^2 + 0.125 k - 0.375 = 0: k = (-0.125 + sqrt(0.125^2 + 1.5)) / 2
    k = S.pipeline_sharing(cluster, "fp32", 2, 4, 1.0, 1.0, 1.0)
    assert k == pytest.approx((-0.125 + (0.125 ** 2 + 1.5) ** 0.5) / 2, rel=1e-9)
    # a node with a core for each worker lends nothing: GPUs, or a table of one count
    assert S.pipeline_sharing(ClusterSpec(GPU, 4), "fp32", 1, 1, 3.0, 3.5, 0.0) == 1.0


def test_shared_rate_ratio_is_one_when_all_workers_compute():
    cluster = ClusterSpec(SHARED, 4, 4)
    # busy at or above W: nothing is lent (as an int, or as the float W m / (m + 0) a
    # zero-bubble pipeline gives)
    for busy in (4, 4.0, 5, 6.5):
        assert S.shared_rate_ratio(cluster, "fp32", busy) == 1.0
    # a table of one worker count says nothing about sharing
    one = SHARED.replace(gemm_flops_measured={"fp32": {4: 30.0}})
    assert S.shared_rate_ratio(ClusterSpec(one, 4, 4), "fp32", 2) == 1.0


def test_cpu_overlap_loss_by_hand():
    # spare cores (C - W R_W) / R_1 = (160 - 4 x 30) / 100 = 0.4: loss 1 - 0.4 = 0.6
    assert S.cpu_overlap_loss(ClusterSpec(SHARED, 4, 4), "fp32") == exact(0.6)
    # 2 workers: (160 - 2 x 80) / 100 = 0: loss 1
    assert S.cpu_overlap_loss(ClusterSpec(SHARED, 2, 2), "fp32") == 1.0


@pytest.mark.parametrize("sp", [False, True])
def test_tp_collectives_under_autocast_move_fp32_where_the_runtime_does(monkeypatch, sp):
    # ptd's runtime in bf16 keeps fp32 weights under autocast: the norms' outputs, the
    # embedding's output and their gradients are fp32 (tests/test_tp_collective_dtypes.py
    # records it on two ranks). 5 tokens x hidden 8 = 40 values a collective
    monkeypatch.setattr(S, "_coll", _bytes_as_seconds([]))
    plan = ParallelPlan(dp=1, tp=2, pp=1, sp=sp, micro_batch=1, global_batch=1, seq_len=5,
                        dtype="bf16")
    t = S._tp_collectives(LLAMA, plan, ClusterSpec(GPU, 2), 5, True, elementwise="autocast")
    if sp:
        # forward: all-gather of the fp32 norm output (4) + reduce-scatter of the bf16
        # row-parallel output (2); backward: the reverse -- each pair as one all-reduce of
        # their mean, 3 bytes x 40 = 120
        assert (t.ar_f, t.ar_b) == (120.0, 120.0)
        assert t.out_f == 160.0 + 3 * 20.0  # the fp32 final norm's gather; the loss's three
    else:
        # forward: the row-parallel outputs, bf16 (80); backward: each linear's input
        # gradient, fp32 (160)
        assert (t.ar_f, t.ar_b) == (80.0, 160.0)
        assert t.out_f == 3 * 20.0
    assert t.ar_end == 160.0  # the embedding's fp32 output; the output layer's input gradient
    # fp32 training runs no autocast: every collective 4 bytes a value
    t32 = S._tp_collectives(LLAMA, plan.replace(dtype="fp32"), ClusterSpec(GPU, 2), 5, True,
                            elementwise="autocast")
    assert t32.ar_f == t32.ar_b == t32.ar_end == 160.0


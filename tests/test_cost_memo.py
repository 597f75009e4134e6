"""The cost model's memoised shortcuts give what the plain definitions give.

The planner prices tens of thousands of plans, so :mod:`ptd.cost` remembers sub-results by
the fields they depend on and skips ranks that cannot be the most loaded. These tests hold
the shortcuts to the definitions they replace (tests/test_cost.py holds the numbers)."""

import itertools

import pytest

from ptd.cost import memory as M
from ptd.specs.stages import stage_to_rank
from ptd.cost import params as P
from ptd.cost.estimate import estimate
from ptd.errors import PtdError
from ptd.specs import ClusterSpec, ParallelPlan, get_preset, load_hardware
from ptd.specs.hardware import DTYPE_BYTES


def _prod(shape):
    n = 1
    for x in shape:
        n *= x
    return n


def layouts():
    """Valid plans over schedules, virtual stages, uneven splits, ZeRO stages and dp sizes."""
    models = [get_preset("tiny"), get_preset("gpt2").replace(dropout=0.1, n_layers=6),
              get_preset("llama3-8b").replace(n_layers=7, vocab_size=512000)]
    for m, (pp, sched, vpp), dp, tp, zero in itertools.product(
            models, [(1, "1f1b", 1), (2, "1f1b", 1), (2, "gpipe", 1), (3, "1f1b", 1),
                     (2, "zero-bubble", 1), (2, "interleaved-1f1b", 2), (2, "zero-bubble", 3)],
            [1, 3, 4], [1, 2], [0, 1, 2, 3]):
        p = ParallelPlan(dp=dp, tp=tp, pp=pp, vpp=vpp, schedule=sched, zero=zero,
                         global_batch=dp * 8, seq_len=64, dtype="bf16", uneven_stages=True)
        try:
            p.validate(m)
        except PtdError:  # an invalid combination is skipped; any other error is a bug
            continue
        yield m, p


def test_local_numel_is_the_sum_of_the_rank_tensors():
    for m, p in layouts():
        for r in range(p.pp):
            plain = sum(_prod(t.local_shape(p.tp)) for t in P.rank_params(m, p, r))
            assert P.local_numel(m, p, r) == plain


def test_model_states_per_rank_match_the_plain_sharding():
    for m, p in layouts():
        for r in range(p.pp):
            params = P.rank_params(m, p, r)
            shapes = [t.local_shape(p.tp) for t in params]
            full = sum(_prod(s) for s in shapes)
            for d in range(p.dp):
                sharded = P.fsdp_numel(shapes, p.dp, d)
                # ptd's convention: every ZeRO stage keeps FSDP's shards between steps; the
                # paper's counts the gathered parameters of stages 1/2 (and stage 1's
                # unsharded gradients) in full
                want = {0: (full, full, full), 1: (sharded,) * 3, 2: (sharded,) * 3,
                        3: (sharded,) * 3}[p.zero]
                paper = {0: (full, full, full), 1: (full, full, sharded),
                         2: (full, sharded, sharded), 3: (sharded,) * 3}[p.zero]
                e = M.model_state_elements(m, p, r, d)
                assert (e.params, e.grads, e.optimizer) == want
                e = M.model_state_elements(m, p, r, d, "zero")
                assert (e.params, e.grads, e.optimizer) == paper


def test_most_loaded_rank_is_the_max_over_all_ranks():
    for m, p in layouts():
        worst = max((M.model_state_elements(m, p, r, d) for r in range(p.pp) for d in range(p.dp)),
                    key=lambda e: e.params + e.grads + 2.0 * e.optimizer)
        got = M.model_state_bytes(m, p)
        assert got == (worst.params * 4, worst.grads * 4, worst.optimizer * 8)


@pytest.mark.parametrize("attention", ["flash", "scores"])
def test_activation_peak_is_the_plain_loop(attention):
    # the definition: every rank's in-flight micro-batches times its blocks, plus the
    # embedding (dropout) on the first rank and the loss on the last
    for m, base in layouts():
        for rc, sp in [("none", False), ("selective", base.tp > 1), ("full", False)]:
            p = base.replace(recompute=rc, sp=sp)
            ab = DTYPE_BYTES[p.dtype]
            per_layer = M.activation_bytes_per_layer(m, p.seq_len, p.micro_batch, p.tp, p.sp,
                                                     p.recompute, ab, attention)
            first, last = stage_to_rank(0, p), stage_to_rank(p.n_stages - 1, p)
            best = 0.0
            for r in range(p.pp):
                k = M.in_flight(p, r)
                t = k * P.layers_per_rank(m, p)[r] * per_layer
                if r == first and m.dropout > 0:
                    # (a learned-position embedding stays whole under sp: runtime/parallel/tp.py)
                    shard = p.tp if p.sp and m.position != "learned" else 1
                    t += k * ab * p.seq_len * p.micro_batch * m.hidden / shard
                if r == last:
                    n_out = p.n_microbatches if (p.pp > 1 and p.schedule == "gpipe") else 1
                    t += (n_out * M.output_activation_bytes(m, p.seq_len, p.micro_batch, p.tp, p.sp, ab)
                          + M.output_transient_bytes(m, p.seq_len, p.micro_batch, p.tp))
                best = max(best, t)
                assert M.activation_bytes(m, p, attention, pp_rank=r) == t
            assert M.activation_bytes(m, p, attention) == best


def test_slowest_rank_candidates_cover_every_rank():
    # step time looks only at the first rank, the last, and the earliest other rank with the
    # most blocks: every other rank holds no more blocks and nothing else
    for m, p in layouts():
        cands = P.heaviest_rank_candidates(m, p)
        layers = P.layers_per_rank(m, p)
        first, last = stage_to_rank(0, p), stage_to_rank(p.n_stages - 1, p)
        assert first in cands and last in cands and list(cands) == sorted(cands)
        plain = [r for r in cands if r not in (first, last)]
        for r in range(p.pp):
            if r not in cands:
                assert r not in (first, last) and plain
                assert layers[r] <= layers[plain[0]] and (layers[r] < layers[plain[0]] or r > plain[0])


def test_equal_specs_in_distinct_objects_price_the_same():
    m1 = get_preset("tiny")
    m2 = m1.replace(name="tiny")  # equal, not the same object
    c1 = ClusterSpec(load_hardware("cpu"), 4)
    c2 = ClusterSpec(load_hardware("cpu").replace(), 4)
    p = ParallelPlan(dp=2, pp=2, zero=1, global_batch=16, seq_len=64)
    a, b = estimate(m1, c1, p), estimate(m2, c2, p)
    assert a.step == b.step and a.memory == b.memory


def test_memo_keys_specs_by_identity_and_the_rest_by_value():
    from ptd.cost.memo import memo
    calls = []

    @memo(identity=(0,), maxsize=3)
    def f(spec, n):
        calls.append((id(spec), n))
        return len(spec) * n

    a, b = [1, 2], [1, 2]  # equal, not the same object (and unhashable, like a HardwareSpec)
    assert f(a, 2) == 4 and f(a, 2) == 4 and len(calls) == 1
    assert f(b, 2) == 4 and len(calls) == 2  # another object: computed again
    assert f(a, 3) == 6 and len(calls) == 3  # another value: computed again
    f(a, 4)  # a fourth entry empties the full memo first
    assert f(a, 2) == 4 and len(calls) == 5

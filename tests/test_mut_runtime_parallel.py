"""``gradient_sync``'s per-stage choices under FSDP (written from the sampled mutation run of
runtime/parallel; docs/testing.md, "runtime/parallel and runtime/checkpoint, sampled").

The expected calls follow from the rule in ``gradient_sync``'s docstring, not from its
code: on a micro-step that does not sync, ZeRO-2 reduce-scatters all the same (so it never
turns gradient sync off), ZeRO-1 and ZeRO-3 defer the reduction (sync off); ZeRO-1 and
ZeRO-2 keep the gathered parameters for the next micro-step (reshard-after-backward off),
ZeRO-3 gathers again (its parameters stay sharded: reshard stays on). Afterwards both are
switched back on. A stand-in FSDPModule records the calls: no process group is needed."""

import pytest
from torch.distributed.fsdp import FSDPModule

from ptd.runtime.parallel import gradient_sync


class Recorder(FSDPModule):
    calls: list

    def set_requires_gradient_sync(self, on):
        self.calls.append(("sync", on))

    def set_reshard_after_backward(self, on):
        self.calls.append(("reshard", on))


def stand_in(zero):
    m = object.__new__(Recorder)  # FSDPModule.__new__ builds the wrapped class; not wanted here
    m.calls = []
    m.ptd_zero = zero
    return m


# (zero stage, calls on entering a micro-step without sync), worked from the rule above
@pytest.mark.parametrize("zero,inside", [
    (1, [("sync", False), ("reshard", False)]),
    (2, [("reshard", False)]),
    (3, [("sync", False)]),
])
def test_no_sync_micro_step_per_zero_stage(zero, inside):
    m = stand_in(zero)
    with gradient_sync(m, enabled=False):
        assert m.calls == inside
    assert m.calls == inside + [("sync", True), ("reshard", True)]


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_syncing_micro_step_changes_nothing(zero):
    m = stand_in(zero)
    with gradient_sync(m, enabled=True):
        pass
    assert m.calls == []

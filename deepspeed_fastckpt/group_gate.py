"""The per-group gate of a DeepSpeed snapshot (LightCheck's per-bucket gate, where DeepSpeed has one).

What a DeepSpeed save copies in the background is written only inside the optimizer update,
one parameter group at a time: ZeRO-1/2 run `optimizer.step()` once per group (the group's
fp32 partition and Adam moments), then copy that partition into the group's flat 16-bit
buffer (the module parameters); ZeRO-3 does the same per sub-group. The gradient-reduction
buckets of the backward pass write gradients only, which no checkpoint holds, so the
finest point where a snapshot can be overwritten is the step of one group. The gate there
waits for the records of that group alone — its parameters, their optimizer state and the
16-bit buffer DeepSpeed rewrites from them — while the other groups' copies go on.

`GroupGate.scoped` is False when that mapping does not cover every tensor the update
writes (an optimizer wrapper this module does not know): the gate then waits for
everything before any group's step, which is always safe.
"""
from __future__ import annotations

import torch

from fastckpt.session import Checkpointer, storages_of


def _ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def written_with(ds_optimizer) -> dict[int, int]:
    """ZeRO-1/2: storage of each group's fp32 partition -> storage of the group's flat 16-bit
    buffer, which DeepSpeed rewrites from that partition right after the group's step."""
    fp32 = getattr(ds_optimizer, "single_partition_of_fp32_groups", None)
    flat = getattr(ds_optimizer, "bit16_groups_flat", None)
    if not fp32 or not flat or len(fp32) != len(flat):
        return {}
    return {_ptr(a): _ptr(b) for a, b in zip(fp32, flat) if _ptr(a) != _ptr(b)}


class GroupGate:
    """Called by the StepGate (scoped) before each optimizer.step DeepSpeed makes."""

    def __init__(self, ck: Checkpointer):
        self._ck = ck
        self.extra: dict[int, int] = {}
        self.scoped = False
        self.scoped_waits = self.full_waits = 0  # for tests and stats

    def retarget(self, ck: Checkpointer) -> None:
        """The engine's Checkpointer was replaced (reconfigured)."""
        self._ck = ck

    def configure(self, ds_optimizer, module_params: frozenset) -> None:
        """After DeepSpeed built its optimizer: may the gate be per group?"""
        self.extra = written_with(ds_optimizer)
        base = getattr(ds_optimizer, "optimizer", ds_optimizer)
        if not isinstance(base, torch.optim.Optimizer):
            self.scoped = False
            return
        params = {_ptr(p) for group in base.param_groups for p in group["params"]}
        self.scoped = set(module_params) <= params | set(self.extra.values())

    def __call__(self, optimizer) -> None:
        pendings = self._ck.in_flight()
        if not pendings:
            return
        if not self.scoped:
            self.full_waits += 1
            self._ck.gate()
            return
        self.scoped_waits += 1
        # DeepSpeed leaves only the group it steps in param_groups
        touched = storages_of((p for group in optimizer.param_groups for p in group["params"]), [optimizer])
        touched |= {self.extra[s] for s in touched if s in self.extra}
        for pending in pendings:
            records = pending.records_of(touched)
            pending.release(records)
            pending.wait_records(records)

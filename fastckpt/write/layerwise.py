"""Layer-wise snapshots (LightCheck §III-B): per-bucket copies started by the gradient all-reduce.

Owns the held snapshots of one checkpointing front end and the DDP communication
hook that releases them. A held save copies nothing at once; when DDP hands a
gradient bucket to its communication hook, the copy of that bucket's parameters
and their optimizer state starts, overlapping the bucket's all-reduce and the
rest of the backward pass. For host buckets (gloo) the bucket's future completes
only once its copy is done — the update of a bucket waits for that bucket's copy
alone; CUDA buckets are not delayed (see layerwise_comm_hook). Whatever no bucket
covered is released by the step gate, which waits for every copy before the
optimizer step.
Framework-free: the Lightning and DeepSpeed plugins wire it in.
"""
from __future__ import annotations

from typing import Callable, Optional

from ..pending import Pending
from .gate import StepGate


class HeldSnapshots:
    """Saves issued with held=True, indexed by the storages their records copy."""

    def __init__(self, gate: StepGate):
        self.gate = gate
        self._held: list[Pending] = []
        self.released = 0  # records released by hooks (for tests and stats)

    def hold(self, pending: Pending, owned: set[int]) -> None:
        """Keeps `pending` held, except records whose storage is not in `owned` (the storages
        only optimizer.step() writes, StepGate.owned_storages(): the rest are copies save made)."""
        pending.release([i for ptr, i in pending.record_index().items() if ptr not in owned])
        self._held.append(pending)

    def clear(self) -> None:
        self._held.clear()

    def release_params(self, params) -> list[tuple[Pending, list[int]]]:
        """Starts the copy of these parameters and their optimizer state; returns what to wait on."""
        if not self._held:
            return []
        ptrs = self.gate.storages_of(params)
        out = []
        for pending in list(self._held):
            recs = pending.records_of(ptrs)
            if recs:
                pending.release(recs)
                self.released += len(recs)
                out.append((pending, recs))
        return out


def layerwise_comm_hook(held: HeldSnapshots, inner: Optional[Callable] = None) -> Callable:
    """A DDP comm hook: release this bucket's snapshot, run `inner` (default all-reduce), and
    (host buckets) complete the bucket's future only once the bucket's copy is done."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    inner = inner or allreduce_hook

    def layerwise_hook(state, bucket):  # no annotations: DDP checks them against its own types
        waits = held.release_params(bucket.parameters())
        fut = inner(state, bucket)
        if not waits or bucket.buffer().is_cuda:
            # NCCL completes a bucket's future as soon as its all-reduce is enqueued, so a
            # callback runs inline on the backward thread: a host wait there would stop the
            # backward pass for the copy. DDP's optimizer step follows the whole backward, and
            # the gate before it waits for every copy: the copies overlap backward all the same.
            return fut

        def after_copy(f):
            for pending, records in waits:
                pending.wait_records(records)
            return f.value()

        return fut.then(after_copy)

    layerwise_hook.fastckpt_layerwise = True
    return layerwise_hook

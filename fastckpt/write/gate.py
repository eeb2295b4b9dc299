"""The gate between an asynchronous snapshot and the optimizer update that would overwrite it.

Owns the one process-wide optimizer step pre-hook (`register_optimizer_step_pre_hook`), which
calls every live StepGate (one per checkpointing front end, e.g. FastCheckpointIO):
- it learns which optimizers exist (weakly), so a save can tell the tensors only
  `optimizer.step()` changes (parameters with their optimizer state) from the rest
  (buffers such as BatchNorm statistics, which the next forward pass changes);
- it notes that training is running (saves between runs are synchronous);
- Lightning calls `optimizer.step(closure)` with forward and backward inside the
  closure, so the hook wraps the closure: the gate runs after backward, right
  before the update. A step without a closure (manual optimization) is gated at once;
- after the gate, it settles what the snapshots since the last step saw (watch.py): a
  snapshot is left to copy after save() returns only once a run has shown that nothing
  but the optimizer writes the saved tensors between a save and the next step.
The hook is registered by the first gate installed and removed with the last one (at a
plugin's teardown, never from a finalizer: torch iterates over its hooks during a step).
"""
from __future__ import annotations

import collections
import itertools
import weakref
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from .watch import SnapshotWatch, Trust


_live_gates: "weakref.WeakSet[StepGate]" = weakref.WeakSet()
_dispatch_handle = None
_armings = itertools.count(1)


def _dispatch(optimizer, args, kwargs):
    """The one process-wide pre-hook; gates come and go in a weak set, so no gate (or the
    garbage collector finalizing a plugin in the middle of torch's loop over its hooks)
    mutates torch's hook dict while an optimizer step iterates over it."""
    changed = False
    for gate in list(_live_gates):
        result = gate._pre_step(optimizer, args, kwargs)
        if result is not None:
            args, kwargs = result
            changed = True
    return (args, kwargs) if changed else None


class StepGate:
    """Calls `gate()` before every optimizer update while installed; tracks optimizers.

    With `scoped=True` the gate is called as `gate(optimizer)`: it may wait only for what that
    step writes (DeepSpeed steps one parameter group at a time)."""

    def __init__(self, gate: Callable[..., None], scoped: bool = False):
        self._gate = (lambda optimizer: gate(optimizer)) if scoped else (lambda optimizer: gate())
        self.optimizers: "weakref.WeakSet[torch.optim.Optimizer]" = weakref.WeakSet()
        self.steps_seen = 0
        self.trust = Trust()
        self.armed_at = 0

    def install(self) -> None:
        """Reacts to optimizer steps from now on (again: the front end is in use now)."""
        global _dispatch_handle
        if _dispatch_handle is None:
            _dispatch_handle = register_optimizer_step_pre_hook(_dispatch)
        _live_gates.add(self)  # weakly: the hook never keeps a plugin alive
        self.armed_at = next(_armings)

    def newest(self) -> bool:
        """Whether no live gate was installed (or used) after this one. Every gate sees every
        optimizer's steps; one left installed by a front end that never tore down (a Lightning
        CheckpointIO that loaded outside fit) sees another trainer's steps as well."""
        return all(g.armed_at <= self.armed_at for g in list(_live_gates))

    def remove(self) -> None:
        """Stops reacting to optimizer steps; the process-wide hook goes with the last gate."""
        global _dispatch_handle
        _live_gates.discard(self)
        if not _live_gates and _dispatch_handle is not None:
            _dispatch_handle.remove()
            _dispatch_handle = None

    def _pre_step(self, optimizer, args, kwargs):
        self.optimizers.add(optimizer)
        self.steps_seen += 1
        # args[0] is the optimizer itself (torch passes the bound method's arguments)
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if closure is None:
            self._gate_and_settle(optimizer)
            return None
        gate = self._gate_and_settle

        def gated_closure(*a, **kw):
            out = closure(*a, **kw)
            gate(optimizer)  # after forward + backward, before the update reads the gradients
            return out

        if "closure" in kwargs:
            return args, {**kwargs, "closure": gated_closure}
        return (args[0], gated_closure, *args[2:]), kwargs

    def _gate_and_settle(self, optimizer) -> None:
        self._gate(optimizer)
        self.trust.settle()  # the copies are done and the optimizer has not written yet

    def owned_storages(self) -> set[int]:
        """Storages only optimizer.step() writes: parameters and optimizer state of known optimizers."""
        return set(self._owned())

    def snapshot_view(self, state, also_owned: frozenset = frozenset()) -> "SnapshotView":
        """What to save while training runs: every tensor the gate does not protect is copied now
        (freeze_unowned); the rest is left to the snapshot, watched for in-place writes, and —
        until the run has earned it (watch.Trust) — copied before save() returns (copy_now).
        Between runs nothing changes the state: as is."""
        if self.steps_seen == 0:
            return SnapshotView(state, set(), None, False)
        owned = self.owned_storages() | set(also_owned)
        kept: list = []
        frozen = freeze_unowned(state, owned, kept)
        watch = self.trust.watch(kept)
        return SnapshotView(frozen, owned, watch, not watch.deferred)

    def owned_bytes(self) -> int:
        """Bytes of those storages: most of what a training checkpoint holds."""
        return sum(self._owned().values())

    def owned_device(self) -> str:
        """'cuda' when the optimizers' parameters live on a GPU, else 'cpu'."""
        for opt in list(self.optimizers):
            if any(p.is_cuda for group in opt.param_groups for p in group["params"]):
                return "cuda"
        return "cpu"

    def _owned(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for opt in list(self.optimizers):
            tensors = [p for group in opt.param_groups for p in group["params"]]
            # parameters with state, also when not listed between steps (DeepSpeed ZeRO-3
            # lists a sub-group's fp32 partition in param_groups only while stepping it)
            tensors += [p for p in opt.state if isinstance(p, torch.Tensor)]
            tensors += [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
            for t in tensors:
                storage = local_tensor(t).untyped_storage()
                out[storage.data_ptr()] = storage.nbytes()
        return out

    def storages_of(self, params) -> set[int]:
        """Storages of these parameters and of their state in every known optimizer."""
        return storages_of(params, list(self.optimizers))


def storages_of(params, optimizers) -> set[int]:
    """Storages of these parameters and of their state in these optimizers."""
    out: set[int] = set()
    for p in params:
        out.add(storage_key(p))
        for opt in optimizers:
            for v in opt.state.get(p, {}).values():
                if isinstance(v, torch.Tensor):
                    out.add(storage_key(v))
    return out


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose memory holds t's values on this rank: a DTensor's (FSDP2, tensor
    parallelism) local shard; any other tensor itself. A DTensor has no storage of its own."""
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t


def storage_key(t: torch.Tensor) -> int:
    """Which memory a tensor's values live in (its storage's address; a DTensor's local shard's)."""
    return local_tensor(t).untyped_storage().data_ptr()


@dataclass
class SnapshotView:
    """A state ready to save: `owned` storages are left to the snapshot (watched by `watch`);
    copy_now: wait for the snapshot's copy before save() returns."""

    state: object
    owned: set
    watch: Optional[SnapshotWatch]
    copy_now: bool


def freeze_unowned(state, owned: set[int], kept: Optional[list] = None, path: str = "",
                   copies: Optional[dict] = None):
    """`state` with every tensor whose storage is not in `owned` replaced by a copy made now:
    what something other than the optimizer update (a forward pass, a buffer update) may
    change before the gated snapshot has copied it. Containers keep their types. kept, when
    given, collects (path, tensor) of the tensors left as they are.

    A storage is copied once and each tensor of it becomes the same view of the copy (offset,
    shape, strides; a Parameter stays one): the checkpoint holds what a save outside training
    holds, and a load gives back views of one storage with their strides, not tensors of their
    own made contiguous. The copy is the whole storage, as the file writes it either way."""
    copies = {} if copies is None else copies
    if isinstance(state, torch.Tensor):
        if storage_key(state) in owned:
            if kept is not None:
                kept.append((path, state))
            return state
        return _frozen(state, copies)
    if isinstance(state, dict):
        out = {k: freeze_unowned(v, owned, kept, f"{path}.{k}" if path else str(k), copies) for k, v in state.items()}
        return out if type(state) is dict else _same_mapping(state, out)
    if isinstance(state, (list, tuple)):
        items = [freeze_unowned(v, owned, kept, f"{path}[{i}]", copies) for i, v in enumerate(state)]
        if isinstance(state, tuple) and hasattr(state, "_fields"):  # namedtuple
            return type(state)(*items)
        return type(state)(items)
    return state


def _frozen(t: torch.Tensor, copies: dict) -> torch.Tensor:
    """t as the same view of a copy of its storage (made once per storage, in `copies`)."""
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.device.type == "meta":
        return t.detach().clone()  # a tensor subclass (DTensor) copies itself
    storage = t.untyped_storage()
    copy = copies.get(storage.data_ptr()) if storage.nbytes() else None
    if copy is None:
        copy = copies[storage.data_ptr()] = storage.clone()
    out = torch.empty(0, dtype=t.dtype, device=t.device).set_(copy, t.storage_offset(), t.size(), t.stride())
    return torch.nn.Parameter(out, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else out


def _same_mapping(original: dict, values: dict) -> dict:
    try:
        if isinstance(original, collections.defaultdict):
            new = type(original)(original.default_factory)
        else:
            new = type(original)()
    except TypeError:  # a mapping type that needs arguments: a plain dict keeps the values
        return values
    new.update(values)
    return new

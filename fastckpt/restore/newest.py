"""Reading a Checkpointer's checkpoints back: the newest that loads on every rank alike.

Owns the walk over committed checkpoints, newest first: only those every rank holds (a
memory tier is its own node's), and a checkpoint that fails its checks on any rank is passed
over on all of them (with the reason); when none is left the error names what exists.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..commit.agreement import Agreement
from ..commit_info import CommitInfo
from ..errors import CorruptCheckpointError, NoCheckpointError


@dataclass
class Loaded:
    """What load_with_record() read: the state, its checkpoint, and those passed over (why)."""

    state: Any
    info: CommitInfo
    skipped: list[str]


def newest_record(store, verified: bool) -> Optional[CommitInfo]:
    """The newest committed checkpoint (record intact, file sizes as recorded); verified=True:
    the newest whose every byte also checks against its CRC-32s."""
    for info in store.committed():
        if not verified or _verifies(store, info):
            return info
    return None


def _verifies(store, info: CommitInfo) -> bool:
    try:
        store.verify(info)
    except (CorruptCheckpointError, OSError):
        return False
    return True


def newest_loadable(store, agree: Agreement, step: Optional[int], rank: int, map_location, verify: bool,
                    weights_only: bool, mmap: Optional[bool], into=None) -> Loaded:
    """The newest committed checkpoint (or the one of `step`) that every rank can get and that
    loads on every rank. What each rank holds (store.offers) is gathered, so that every rank
    walks the same checkpoints in the same order, each routed the same way (store.route: where
    each rank's part comes from; a memory tier is its own node's) and loaded (store.load_routed,
    which may exchange parts between ranks: every rank calls it for the same checkpoint).
    into: tensors the caller loads the state into (Store.load); a checkpoint passed over may
    have left some of them overwritten, the one returned fills them."""
    errors: list[str] = []
    views = agree.gather(store.offers(errors if step is None else None))
    missing = 0
    for counter in sorted(set().union(*views), reverse=True):
        routed = store.route(counter, views, agree.rank)
        if routed is None:
            missing += 1
            continue
        info, how = routed
        if step is not None and info.step != step:
            continue
        if missing:
            errors.append(f"{missing} newer checkpoint(s) not held by every rank")
            missing = 0
        state, err = None, None
        try:
            state = store.load_routed(info, how, views, agree, rank, map_location, verify, weights_only, mmap, into)
        except (CorruptCheckpointError, OSError) as e:
            err = e
        if agree.all_ok(err is None):
            return Loaded(state, info, errors)
        errors.append(f"checkpoint step {info.step} in {info.path} is corrupt ({err or 'on another rank'})")
    what = f"step {step}" if step is not None else "any checkpoint"
    steps = sorted({c.step for c in store.committed()})
    there = f" (steps committed there: {', '.join(map(str, steps))})" if step is not None and steps else ""
    raise NoCheckpointError(f"no valid checkpoint for {what} under {store.root}{there}"
                            + (": " + "; ".join(errors) if errors else ""))

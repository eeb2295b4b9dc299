"""The store seam: where a checkpoint's bytes go, how one becomes committed, how the committed
ones are listed, read back and removed — declared once; every store implements Store, and the
Checkpointer, NamedCheckpoints and the `fastckpt` command call nothing else of it (one
conformance suite, tests/fastckpt/store/, runs the same cases over every store).

A store is made from the validated settings (`open(config, rank, world_size)`). The calls, in
the order of a checkpoint's life (write side: the Checkpointer and its commit thread):

  0. `join(agreement)` once, as it is opened with the ranks' agreement (collective: every rank);
     `prepare()` before the first save: the place exists and can be written (raises
     CheckpointWriteError naming it otherwise); then on rank 0 `remove_uncommitted()` drops
     what a dead writer left, and `next_counter()` says where counters go on (the highest of
     every rank's); at the first save, `fits(nbytes, concurrency)` on every rank, and where any
     says False, `shrink(...)` on every rank (the warning it returns is given once);
  1. `begin(step, counter, rank, fmt, target, plan, meta)` -> (ckpt_id, part): a new
     checkpoint (target: the caller's path when `names_by_path`), and where this rank's part goes
     (after `hurry()`, every rank's at once: where it is durable soonest);
  2. `sink(part, direct_io)`: what the write puts the part's bytes into; then, on the commit
     thread, `finish_write(write, part)`: the WriteResult once the part is durable;
  3. `commit_file(ckpt_id, part, result)` -> the part's final name, in commit order (after the
     checkpoint issued before it landed: a rename over a path saved twice lands last);
  4. `commit_rank(ckpt_id, info)` on every rank once every rank's part is durable, then
     `commit(info)` on rank 0: the one record whose durable presence makes it real
     (fastckpt.commit.record.write); instead of 3-4 for a checkpoint that failed:
     `abort(ckpt_id, part, rank, stuck)` (nothing of it is ever listed as committed);
     once a checkpoint landed committed, `persist_unit(info, landed, retain, agree_all)`: a
     unit of the owner's second ordered commit that makes it durable on the places behind
     (None: none);
  5. `committed(problems)`: committed checkpoints, newest first (record intact, sizes as
     recorded; why others were passed over is appended to problems);
  6. `load(info, rank, ...)`, `verify(info)`: a committed checkpoint read back, CRCs checked;
     a load on every rank (fastckpt.restore.newest) walks what `offers()` says each rank holds,
     gathered, newest first: `route(counter, views, me)` says where each rank's part comes from
     (None: some rank cannot get it), and `load_routed(...)` reads this rank's part so (a
     store whose ranks hold each other's parts exchanges them there);
  7. `retain(keep, in_flight)` (rank 0 after a commit; every rank when `every_rank_retains`):
     beyond the newest `keep` committed checkpoints, and dead partial ones, removed — never one
     in flight; then on every rank `make_ahead(rank, fmt, nbytes)`: the file of this rank's next
     part made now, for the next begin() to take (a store that makes none: nothing);
  8. `close()` (every commit thread ended: files made ahead are removed here).

The `fastckpt` command reads a place without writing (fastckpt.tools.folders):
  9. `place_at(path)` (a class method): the store whose place path is, opened only to read
     (None: it is not one); `places_loosely` stores (any folder of checkpoint files) are asked
     after every other kind of folder;
 10. `listing()`: every checkpoint there, committed or not, newest first, as Listed rows.

Checkpoints named by path (every save names its own, as Lightning and DeepSpeed do:
`names_by_path`) are also read, sized and removed by that path: the optional protocol ByPath.
"""
from __future__ import annotations

import abc
import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..commit_info import CommitInfo
from ..errors import CheckpointWriteError
from ..format import load_file
from ..verify import verify_file
from ..write.protocol import FileSink


@dataclass
class Listed:
    """One checkpoint at a store's place, as `fastckpt ls` shows it."""

    name: str
    path: str
    status: str  # committed | complete (a file renamed into place whole) | incomplete | invalid
    #             | temporary (a file of a save in flight or a dead writer's, under its own name: no checkpoint)
    detail: str = ""
    info: Optional[CommitInfo] = None  # its record, when committed
    latest: bool = False  # the place's own pointer names it
    time: Optional[float] = None


class Store(abc.ABC):
    kind: str = ""  # its name in the settings (store="root")
    root: Optional[str] = None  # where its checkpoints live (None: each save names its own path)
    names_by_path = False  # save(..., path=...) names each checkpoint
    layout_format: Optional[str] = None  # None: the Checkpointer's own format
    sink_kind = "file"  # what sink() returns: write.select picks the write implementation by it
    every_rank_retains = False  # retain() runs on every rank (each has a place of its own), not rank 0 alone
    allow_pickle = False  # safetensors layouts: non-JSON values are an error

    @classmethod
    @abc.abstractmethod
    def open(cls, config, rank: int, world_size: int) -> "Store":
        """The store the validated settings (a CheckpointerConfig) ask for; touches no disk."""

    def join(self, agreement) -> None:
        """(0) Every rank, once: the ranks' agreement (fastckpt.commit.agreement), for a store whose
        ranks exchange bytes (on its background group, from commit threads only)."""

    def strategy_note(self, strategy: str) -> Optional[str]:
        """A warning when this store makes the copy strategy change nothing (None: it applies)."""
        return None

    # -- 0. opening ------------------------------------------------------
    @abc.abstractmethod
    def prepare(self) -> None:
        """(0) Before the first save: the place exists and is writable."""

    @abc.abstractmethod
    def remove_uncommitted(self) -> None:
        """(0) Rank 0, before the first save: what a dead writer left is removed."""

    @abc.abstractmethod
    def next_counter(self) -> int:
        """(0) The counter of the next checkpoint: above every one committed here."""

    bounded = False  # its room can run out: fits() is asked at every save, not only the first

    def fits(self, nbytes: int, concurrency: int) -> bool:
        """(0) At the first save (and at every save while `bounded`: a state that grew, or a
        memory filesystem that filled): room for checkpoints of about nbytes, concurrency in flight."""
        return True

    def shrink(self, nbytes: int, concurrency: int) -> str:
        """(0) Some rank's fits() said False: saves go where there is room; what to warn. A store
        whose fits() can say False has somewhere else to write, and says where here."""
        raise CheckpointWriteError(f"store {self.kind!r} said it has no room for checkpoints of {nbytes} bytes "
                                   "and has nowhere else to write them")

    # -- 1-2. writing ----------------------------------------------------
    @abc.abstractmethod
    def begin(self, step: int, counter: int, rank: int, fmt: str, target=None, plan=None,
              meta=None) -> tuple[str, str]:
        """(1) (checkpoint id, where this rank's part goes) for a new checkpoint."""

    def sink(self, part: str, direct_io: bool):
        """(2) What the write of the part begun as `part` puts its bytes into."""
        return FileSink(part, direct_io)

    def finish_write(self, write, part: str):
        """(2) The commit thread: the part durable; its WriteResult."""
        return write.finish()

    # -- 3-4. committing -------------------------------------------------
    @abc.abstractmethod
    def commit_file(self, ckpt_id: str, part: str, result) -> str:
        """(3) Each rank, in commit order: the durable part at its final name (returned)."""

    def commit_rank(self, ckpt_id: str, info: CommitInfo) -> None:
        """(4) Every rank, once every rank's part is durable, before rank 0's commit()."""

    @abc.abstractmethod
    def commit(self, info: CommitInfo) -> None:
        """(4) Rank 0: the record that makes the checkpoint real."""

    @abc.abstractmethod
    def abort(self, ckpt_id: Optional[str], part: Optional[str], rank: int, stuck: bool = False) -> None:
        """(4') A checkpoint that failed: what it wrote is removed (stuck: its write may still
        store into its part, which must then stay out of reach)."""

    def hurry(self) -> None:
        """(1) Every rank at once (a preemption): later saves go where they are durable soonest
        (a tiered store: its last tier, not through memory first)."""

    def persist_unit(self, info: CommitInfo, landed, retain, agree_all):
        """(4) After info committed: a fastckpt.commit.protocol.CommitUnit persisting it to the
        places behind the one it committed on (None: there are none)."""
        return None

    # -- 5-6. listing and reading ------------------------------------------
    @abc.abstractmethod
    def committed(self, problems: Optional[list] = None) -> list[CommitInfo]:
        """(5) Committed checkpoints, newest first; why others were passed over goes to problems."""

    def verify(self, info: CommitInfo) -> None:
        """(6) Every byte of a committed checkpoint (all ranks) read and checked against its
        CRC-32s; CorruptCheckpointError (or OSError) names what is wrong."""
        for f in info.files:
            verify_file(os.path.join(info.path, f.name), f)

    def load(self, info: CommitInfo, rank: int, map_location=None, verify: bool = True, weights_only: bool = True,
             mmap=None, into=None):
        """(6) This rank's part of a committed checkpoint, read back. into (a format.fitting
        Destination): tensors the caller loads it into, which a store may read straight into (the
        caller copies whatever it did not); a store that cannot ignores it."""
        return load_file(info.file_for(rank), map_location, verify, weights_only,
                         expect_crc=info.entry_for(rank).crc32 if verify else None, mmap=mmap, into=into)

    def offers(self, problems: Optional[list] = None) -> dict:
        """(6) What this rank holds, by counter, as every rank is told (picklable): its committed
        checkpoints' records."""
        return {info.counter: info for info in self.committed(problems)}

    def route(self, counter: int, views: list, me: int):
        """(6) (record, how) for the rank at index `me` of views (every rank's offers()), or None
        when some rank cannot get the checkpoint of counter. The same verdict on every rank."""
        if not all(counter in view for view in views):
            return None
        return views[me][counter], None

    def read_from(self, info: CommitInfo, rank: int) -> str:
        """(6) Where rank's part of info came from at its last load (a tier, a partner's replica)."""
        return info.path

    def load_routed(self, info: CommitInfo, how, views: list, agree, rank: int, map_location=None,
                    verify: bool = True, weights_only: bool = True, mmap=None, into=None):
        """(6) This rank's part of info, read the way route() said; every rank calls it."""
        return self.load(info, rank, map_location, verify, weights_only, mmap, into)

    # -- 7-8. removing, closing ----------------------------------------------
    @abc.abstractmethod
    def retain(self, keep: int, in_flight: set) -> None:
        """(7) Rank 0 after a commit: committed checkpoints beyond the newest `keep` and dead
        partial ones removed, never one whose id is in in_flight (keep=0: all kept)."""

    def make_ahead(self, rank: int, fmt: str, nbytes: int) -> None:
        """(7) Every rank, after its checkpoint landed and retention ran: the file of its next part
        (about nbytes, in format fmt) made now, so that the next begin() need not create it.
        Never raises."""

    def close(self) -> None:
        """(8) Resources released; nothing written after."""

    # -- 9-10. the command's view ------------------------------------------
    places_loosely = False  # its place is any folder of checkpoint files: asked last
    survey_kind = ""  # what `fastckpt ls` calls its place ("root", "pool", "files")
    place: Optional[str] = None  # what place_at opened it at (the pool file for a pool's folder)
    single = False  # place_at opened it at one checkpoint of its place

    @classmethod
    def place_at(cls, path: str) -> Optional["Store"]:
        """(9) The store whose place path is, opened only to read; None when it is not one."""
        return None

    def listing(self) -> list[Listed]:
        """(10) Every checkpoint at the place, committed or not, newest first."""
        return []


class ByPath(abc.ABC):
    """The optional protocol of a store whose checkpoints are named by path (`names_by_path`):
    NamedCheckpoints saves, reads, sizes and removes them by that path, whatever the store."""

    pointers = False  # a path is this store's only where it holds the pointer file a save leaves
    #                   there (fastckpt.pmem.pointer; a framework that globs for files): any other
    #                   file at a path is read as a plain file

    @abc.abstractmethod
    def prepare_path(self, path: str) -> None:
        """Before a save of path: what the path needs (its folder made)."""

    def mark_durable(self, path: str) -> None:
        """After a save of path is durable, for a framework that globs its folders for files:
        what must then be at path (a pool leaves its pointer file; a file is there already).
        Opens nothing: it may run on a commit thread while its owner is closing."""

    @abc.abstractmethod
    def load_path(self, path: str, rank: int, map_location=None, verify: bool = True, weights_only: bool = True,
                  mmap: Optional[bool] = None):
        """What was committed at path (FileNotFoundError: nothing)."""

    @abc.abstractmethod
    def size_of(self, path: str) -> Optional[int]:
        """Bytes committed at path (None: nothing)."""

    @abc.abstractmethod
    def remove_path(self, path: str, later: Optional[Callable[[Callable[[], None]], Any]] = None) -> None:
        """What was committed at path removed: its name gone when this returns (the freeing of
        its space may run through later(fn))."""

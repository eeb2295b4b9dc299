"""The commit seam: what every kind of checkpoint implements to become real, its calls numbered.

A unit of commit is one checkpoint on its way to its commit record. fastckpt.commit.ordered
drives every unit through the same calls, in this order, on the unit's own commit thread (the
numbers are those of ordered.py's steps; 2 and 4 are the driver's own):

  1. finish() -> finished     this rank's part of the checkpoint, durable: every byte of it and
                              its name (fsync'ed), or raise. Units issued one after another
                              finish in parallel.
     (2. the driver waits, under the write path's Deadline, for the unit issued before it)
  3. in_order(finished) -> part   work that must follow the unit before (a rename over the
                              same path; a copy that must not run beside the one before);
                              returns this rank's part of the record. Every rank reaches it in
                              the same order, so it may make collectives on its chain's group.
     (4. the ranks exchange (ok, part); if any failed, 5 is skipped)
  5. record(parts, rank) -> info  every rank's part is durable: write this rank's share of the
                              record, rank 0 the record itself (fastckpt.commit.record.write,
                              the one writer: after it returns, the checkpoint is real and a
                              reader picks it); returns what callers see (a CommitInfo), or None
                              when the unit was withdrawn.
  6. landed(info, error)      exactly once, committed or failed with the first error; the next
                              unit waits for it. A failed unit removes what it wrote here.
  7. afterwards()             after the next unit was let go: work no later commit waits for
                              (retention).
  timed(phase, seconds)       how long the driver's steps took ("order_wait": 2, "commit": 3-5).

The promise every implementation keeps, whichever call a crash or a power loss interrupts:
the record is written only after every file it names is durable, so a reader that finds a
record finds every file it names, whole; before 5, the checkpoint issued before is still the
newest a reader picks. tests/fastckpt/commit/test_commit_protocol.py runs every implementation
through the same cases: a process killed before each numbered call, and every disk a power
loss could leave.

Implementations: fastckpt.commit.checkpoint_unit.CheckpointCommit (a Checkpointer's checkpoint:
one file per rank and its COMMIT), fastckpt.commit.file_sets.FileSetCommit (a set of files
across ranks, e.g. a DeepSpeed tag) and fastckpt.commit.file_sets.GatheredCommit (a set whose
framework gathered every rank's files on one coordinator: DCP's finish).
"""
from __future__ import annotations

from typing import Optional

CALLS = ("finish", "in_order", "record", "landed", "afterwards")  # the unit's calls, in order (1, 3, 5, 6, 7)


class CommitUnit:
    """One checkpoint on its way to its commit record; each kind subclasses it."""

    label = "a checkpoint"  # how errors name it: "step 12", "tag 'global_step3' in /ckpt"

    def finish(self):
        """1. This rank's part, made durable; raises on failure. What it returns goes to in_order."""

    def in_order(self, finished):
        """3. Local work that must come after the previous unit landed; returns this rank's part
        of the record (by default what finish returned); raises on failure."""
        return finished

    def record(self, parts: list, rank: int):
        """5. Every rank's part is durable (parts: one per rank). Writes this rank's share of the
        record, rank 0 the record itself; returns what callers see of the commit."""

    def landed(self, info, error: Optional[BaseException]) -> None:
        """6. Committed (info) or failed (error); called once, before the next unit commits."""

    def afterwards(self) -> None:
        """7. After the next unit was let go: work no later commit waits for (retention)."""

    def timed(self, phase: str, seconds: float) -> None:
        """How long a step of its commit took: "order_wait" (2), "commit" (3-5); fastckpt.timings."""

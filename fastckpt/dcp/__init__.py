"""fastckpt under PyTorch Distributed Checkpoint (DCP): its storage, read and written as fastckpt does.

  layout.py    one rank's write items laid out in one file (each tensor a torch.save archive of
               its own, as DCP's stock reader reads them)
  names.py     a rank data file's suffix (`.distcp`) and the step a directory's name says
  check.py     `fastckpt verify` of a DCP checkpoint: every item checked, a damaged one named
  folders.py   `fastckpt ls` / `verify` of a folder of DCP checkpoints (its entry point)
  in_place.py  an item stored as the very tensor a load fills, read straight into it
  on_s3.py     s3:// checkpoints: the spool, the upload and the record object
  slots.py     FastStager's slots (one snapshot in flight) and SnapshotOwner
  stock_warning.py  the one warning that a checkpoint is DCP's own (no record to check it by)
  metadata.py  DCP's `.metadata`: written as DCP writes it, read by the restricted unpickler
  writer.py    FastStorageWriter: DCP's StorageWriter; finish() is fastckpt's commit
  reader.py    FastStorageReader: DCP's StorageReader; every item's CRC checked, no
               uncommitted checkpoint loaded
  staged.py    the copy of a leaf (a tensor, a DTensor's shard) made at stage()
  stager.py    FastStager: DCP's AsyncStager over the write path — snapshots handed on to
               the writer's save, N saves in flight, the gate
  groups.py    save_group(): a gloo group for async saves' own collectives, made once
  saved_paths.py  SavedPaths: saves into paths a caller names, saved into again and removed
               (a committed one swapped out only once the new one is committed)
  preempt.py   Preemption: a checkpoint of the step every rank agrees on when SIGTERM comes, then exit
  committed.py which checkpoints of a folder a run can resume from, newest first, whoever wrote
               them (fastckpt's committed ones and DCP's own): where to resume

Its __all__ is what a front end imports of it (the plugins import nothing deeper). DCP is torch,
which the backend may know: this package imports no framework but torch.
"""
from .committed import Resumable, committed, cut_short_below, newest_committed, resumable, withdraw
from .groups import save_group
from .metadata import NAME as METADATA
from .on_s3 import is_s3
from .preempt import Preemption
from .reader import FastStorageReader
from .saved_paths import SavedPaths, recover
from .stager import FastStager, SaveSkipped
from .writer import FastStorageWriter

__all__ = ["FastStager", "FastStorageReader", "FastStorageWriter", "METADATA", "Preemption", "Resumable", "SaveSkipped",
           "SavedPaths", "committed", "cut_short_below", "is_s3", "newest_committed", "recover", "resumable",
           "save_group", "withdraw"]

"""Which tag a DeepSpeed load reads: what DeepSpeed itself would load, checked by fastckpt.

DeepSpeed loads the tag it is given, or the one its `latest` file names (`latest_universal`
for universal checkpoints). Under `save_dir`, a tag is
  committed  fastckpt's record is there and every file it names has its size: loaded;
  torn       fastckpt began it (its open mark, a writer's hidden file) and never committed it
             (a save cut short): never loaded;
  damaged    its record is unreadable or disagrees with the files: never loaded;
  foreign    checkpoint files another engine wrote or put there (DeepSpeed's own before
             fastckpt was switched on, ds_to_universal, which also copies fastckpt's
             model-state files into its tag): there is no record to check, so it is
             loaded as DeepSpeed would load it, and a warning says so;
  empty      a directory without checkpoint files (a save cut short before any file);
  missing    no such directory.
An explicit tag loads when committed or foreign; otherwise a CorruptCheckpointError says
why. Without a tag: the tag `latest` names when it is committed or foreign; else (no
`latest`, or it names a torn, damaged, empty or missing tag) the newest committed tag, and a
warning says what `latest` named; with no committed tag either, nothing (and a warning).
With several ranks, rank 0 chooses and every rank checks and agrees (agreed_choice).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from fastckpt.commit.agreement import Agreement
from fastckpt.errors import CorruptCheckpointError

from .tag_records import SizeOf, newest_committed_tag, read_latest, read_record, tag_status


@dataclass
class Choice:
    """The tag to load (None: nothing), what it is, and what the user should be told."""

    tag: Optional[str]
    status: str
    warning: str = ""
    error: str = ""


def choose(save_dir: str, tag: Optional[str], size_of: SizeOf, latest_file: str = "latest") -> Choice:
    """What a load of `save_dir` with `tag` (None: DeepSpeed's latest) reads; see the module docstring."""
    if tag is not None:
        status, why = tag_status(save_dir, str(tag), size_of)
        if status in ("committed", "foreign"):
            return Choice(str(tag), status, why if status == "foreign" else "")
        return Choice(None, status, error=why)
    named = read_latest(save_dir, latest_file)
    status, why = tag_status(save_dir, named, size_of) if named else ("missing", f"no {latest_file!r} file")
    if status in ("committed", "foreign"):
        return Choice(named, status, why if status == "foreign" else "")
    newest = newest_committed_tag(save_dir, size_of)
    if newest is not None:
        note = "" if named is None else f"{latest_file!r} names {named!r}, which is not loadable ({why}); "
        return Choice(newest, "committed", f"{note}loading the newest committed tag {newest!r}" if note else "")
    return Choice(None, status, warning=f"no checkpoint to load under {save_dir}: {why}, and no tag there was "
                                        "committed by fastckpt; nothing was loaded")


def agreed_choice(agree: Agreement, save_dir: str, tag: Optional[str], size_of: SizeOf,
                  latest_file: str = "latest") -> Choice:
    """The choice every rank loads: rank 0 chooses and broadcasts; each rank then checks the
    record against the files it can see, and all agree (a committed tag is loaded by every
    rank, or by none: CorruptCheckpointError)."""
    choice = agree.broadcast(choose(save_dir, tag, size_of, latest_file) if agree.rank == 0 else None)
    why = ""
    if choice.status == "committed":
        try:
            read_record(save_dir, choice.tag, size_of)
        except CorruptCheckpointError as e:
            why = str(e)
    if not agree.all_ok(not why):
        raise CorruptCheckpointError(why or f"tag {choice.tag!r} in {save_dir} does not check out on another "
                                     "rank; nothing was loaded")
    return choice

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
With several ranks, rank 0 chooses and every rank checks and agrees (agreed_choice). With a
bucket ("bucket" in the entry), a newer tag there is fetched into save_dir first (agreed_choice).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

from fastckpt.session import Agreement
from fastckpt.errors import CorruptCheckpointError

from .tag_records import SizeOf, newest_committed_tag, read_latest, read_record, tag_status

log = logging.getLogger(__name__)


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
                  latest_file: str = "latest", mirror=None) -> Choice:
    """The choice every rank loads: rank 0 chooses and broadcasts; each rank then checks the
    record against the files it can see, and all agree (a committed tag is loaded by every
    rank, or by none: CorruptCheckpointError). mirror: the entry's bucket
    (fastckpt.store.s3.folder_mirror.FolderMirror): a tag it holds that is newer than the choice
    (or the tag asked for, missing here) is fetched into save_dir first, on every rank; a tag of it
    that does not fetch (an object missing or damaged) is passed over, with a warning naming it,
    for the next newest; and when the choice does not check out on every rank (a node that lost
    its disk), the bucket's newest is fetched instead."""
    choice, newer, held, notes = agree.broadcast(_decide(save_dir, tag, size_of, latest_file, mirror)
                                                 if agree.rank == 0 else None)
    fetched = _fetch_first(agree, save_dir, newer, mirror, notes)
    if fetched is not None:
        return _noted(fetched, notes)
    why = ""
    if choice.status == "committed":
        try:
            read_record(save_dir, choice.tag, size_of)
        except CorruptCheckpointError as e:
            why = str(e)
    if agree.all_ok(not why):
        return _noted(choice, notes)
    tried = {info.path for info in newer}
    fetched = _fetch_first(agree, save_dir, [info for info in held if info.path not in tried], mirror, notes)
    if fetched is not None:
        return _noted(fetched, notes)
    raise CorruptCheckpointError(why or f"tag {choice.tag!r} in {save_dir} does not check out on another "
                                 "rank; nothing was loaded")


def _decide(save_dir: str, tag: Optional[str], size_of: SizeOf, latest_file: str, mirror):
    """Rank 0: (the choice under save_dir, the bucket's tags to fetch first — newest first —, every
    tag the bucket holds that the choice may fall back to, what the user is told: a tag of the
    bucket passed over, naming its object)."""
    choice = choose(save_dir, tag, size_of, latest_file)
    if mirror is None:
        return choice, [], [], []
    problems: list[str] = []
    try:
        held = mirror.committed(problems)
    except OSError as e:
        return choice, [], [], [f"the bucket {mirror.url} could not be listed ({e}): loading from {save_dir} alone"]
    notes = [f"passed over in the bucket: {problem}" for problem in problems]
    if tag is not None:
        held = [info for info in held if _name(info) == str(tag)]
        return choice, ([] if choice.tag is not None else held), held, notes
    if choice.status == "foreign":  # another engine's tag, newer or not: loaded as DeepSpeed would
        return choice, [], held, notes
    here = read_record(save_dir, choice.tag, None).counter if choice.status == "committed" else -1
    return choice, [info for info in held if info.counter > here], held, notes


def _fetch_first(agree: Agreement, save_dir: str, infos: list, mirror, notes: list[str]) -> Optional[Choice]:
    """The first of infos (the bucket's tags) fetched into save_dir on every rank, as a choice; None
    when none fetches (each failure noted)."""
    for info in infos:
        try:
            mirror.fetch(info, save_dir)
        except CorruptCheckpointError as e:
            notes.append(f"tag {_name(info)!r} in {mirror.url} was passed over: {e}")
            continue
        log.info("fastckpt: tag %r fetched from %s into %s", _name(info), mirror.url, save_dir)
        return Choice(_name(info), "committed")
    return None


def _noted(choice: Choice, notes: list[str]) -> Choice:
    if not notes:
        return choice
    return Choice(choice.tag, choice.status, "; ".join(notes + ([choice.warning] if choice.warning else [])),
                  choice.error)


def _name(info) -> str:
    return info.path.rstrip("/").rsplit("/", 1)[-1]

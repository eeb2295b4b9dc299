"""Where a checkpoint's time went: the phases of one save (`Pending.timings`) and their sums over
a Checkpointer's saves (`Checkpointer.stats["timings"]`).

Every figure is in seconds. Durations, on the caller's thread inside save():

  slot         waiting for one of `concurrency` slots (checkpoints before it still in flight)
  plan         planning the file: every record's offset decided
  staging      staging sized and drawn (grown and pinned or registered when it falls short)
  begin        the store naming its folder and file
  start        the write built and its copies enqueued (strategy g: its whole copy into
               spare memory issued; on the host, made)
  save         the whole save() call

summed over the background threads that ran them (several threads: more than the wall time):

  enqueue      issuing each chunk's copies on a device's side stream
  stream_wait  waiting for a stream's copies (their events) to complete
  copy         copy threads copying host tensors into staging
  chunk_wait   waiting for a free staging chunk: the writers (the disk) are the limit
  crc          summing CRC-32s
  put          bytes into the sink (pwrite, or stores into a mapped pool)
  persist      each chunk made durable as it is put (msync, a fence; nothing for a file)
  open         the sink opened (a file created and reserved)
  finish       the file's headers written, the file truncated and fdatasync'ed

on the commit thread:

  order_wait   waiting for the checkpoint issued before it to land
  commit       its rename, the ranks' agreement, the record (and `latest`)

on the training thread:

  gate         the gate's wait for this checkpoint's copies

and, in the Checkpointer's stats only (the checkpoint's Pending is settled by then), on the
commit thread once the checkpoint landed:

  retain       removing checkpoints beyond `keep` (and dead partial ones). Off every save's own
               time, but not off the disk's: a delete takes disk time too (on a filesystem mounted
               with `discard`, each freed block is trimmed before unlink returns; on this project's
               VM a 1 GiB checkpoint's delete took ~0.26 s), which a save issued meanwhile shares

and instants, in seconds since save() was called:

  copied_at    the caller's tensors are no longer read (what the gate waits for)
  written_at   every data byte is in the sink
  durable_at   committed (or failed)

A phase that did not happen is absent. The write path's own phases come from
`SnapshotWrite.timings()` (a native job's, copy .. finish, from the job itself); the Pending
takes them once its write is finished or aborted.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

PHASES = ("slot", "plan", "staging", "begin", "start", "save", "enqueue", "stream_wait", "copy", "chunk_wait",
          "crc", "put", "persist", "open", "finish", "order_wait", "commit", "gate")
INSTANTS = ("copied_at", "written_at", "durable_at")
AFTER = ("retain",)  # after landing: the Checkpointer's stats only


class Timings:
    """Durations and instants (time.monotonic() values), added to from any thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._spent: dict[str, float] = {}

    def add(self, phase: str, seconds: float) -> None:
        with self._lock:
            self._spent[phase] = self._spent.get(phase, 0.0) + seconds

    @contextmanager
    def phase(self, name: str):
        t = time.monotonic()
        try:
            yield
        finally:
            self.add(name, time.monotonic() - t)

    def at(self, instant: str, when: float | None = None) -> None:
        """An instant (now by default); a later one replaces it (a latch falls once all its parts have)."""
        when = time.monotonic() if when is None else when
        with self._lock:
            self._spent[instant] = max(self._spent.get(instant, when), when)

    def take(self, other: dict[str, float]) -> None:
        """Another part's timings (a write's, a native job's): durations added, instants merged;
        an instant below 0 did not happen."""
        for name, value in other.items():
            if name in INSTANTS:
                if value >= 0:
                    self.at(name, value)
            elif value:
                self.add(name, value)

    def as_dict(self, since: float | None = None) -> dict[str, float]:
        """Every phase; instants in seconds after `since` when given."""
        with self._lock:
            out = dict(self._spent)
        if since is not None:
            for name in INSTANTS:
                if name in out:
                    out[name] = max(0.0, out[name] - since)
        return out


def summed(total: dict[str, float], one: dict[str, float]) -> None:
    """Adds one save's figures into a Checkpointer's running totals (its instants too: summed,
    they are the saves' latencies, whose mean is the total over the saves that landed)."""
    for name, value in one.items():
        total[name] = total.get(name, 0.0) + value


def steady(stats_list: list[dict]) -> dict[str, float]:
    """The mean of each figure per save after the first, over the stats of one or more
    Checkpointers in turn (a plugin opens one per run): their "timings" totals less their first
    save's ("timings_first": staging grown, threads started), over their "landed" saves less one."""
    total: dict[str, float] = {}
    n = 0
    for stats in stats_list:
        first = stats.get("timings_first") or {}
        landed = stats.get("landed", 0)
        if landed < 2:
            continue
        n += landed - 1
        for name, value in stats["timings"].items():
            total[name] = total.get(name, 0.0) + value - first.get(name, 0.0)
    return {name: value / n for name, value in total.items()} if n else {}

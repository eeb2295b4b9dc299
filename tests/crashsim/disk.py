"""What a power loss can leave on disk, replayed from a recorded log (oplog.Op).

The model is POSIX's, not one filesystem's:
- a file's bytes and size (write, pwrite, ftruncate, fallocate, an open with O_TRUNC, a page
  of a mapping) are durable once an fsync/fdatasync of that file follows them (a page: an
  msync of its range; a size: any msync, Linux's being fdatasync of a range); before that each
  may be lost or kept, a file's own in the order they were made;
- a name (a file or directory made, removed or renamed) is durable once its directory is
  fsync'ed after it (a rename: both directories); before that it may be lost or kept, a rename
  whole or not at all — in the order the names changed (a journal's), or any one of them lost
  alone (POSIX orders none of them);
- a page of a mapped file may reach the disk before its msync, any time after it last did.

crash_points() are the moments just before each fsync and the end: between two fsyncs what may
survive only grows, so a crash there is covered by the one just before the next. states(c) are
the disks a crash at c can leave, as choices of what not yet durable survived: all, none, a
prefix of the names' journal, one directory's names lost, one change of names alone lost, and
per file a prefix of its bytes (a few cuts of a file with many) with the others all or none.
materialize() writes one disk out.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from .oplog import Op

MAX_CUTS = 12  # prefixes tried of a file with many pending writes


@dataclass
class Snapshot:
    """The root as it was before the recording (all of it durable): rel path -> ('dir', ino) or
    ('file', ino, bytes)."""
    root_ino: int
    entries: dict

    @classmethod
    def take(cls, root: str) -> "Snapshot":
        entries = {}
        for d, dirs, files in os.walk(root):
            for n in dirs:
                p = os.path.join(d, n)
                entries[os.path.relpath(p, root)] = ("dir", os.lstat(p).st_ino)
            for n in files:
                p = os.path.join(d, n)
                with open(p, "rb") as f:
                    entries[os.path.relpath(p, root)] = ("file", os.lstat(p).st_ino, f.read())
        return cls(os.stat(root).st_ino, entries)


@dataclass
class Meta:
    """A change of names: create (dir, name -> node), remove (dir, name), rename (dir, name -> dir2,
    name2); dir, dir2 and ino are nodes."""
    seq: int
    kind: str
    dir: int
    name: str
    ino: int
    dir2: int = -1
    name2: str = ""

    @property
    def dirs(self) -> set:
        return {self.dir} | ({self.dir2} if self.kind == "rename" else set())


@dataclass
class Data:
    """A change of a file's (node ino's) bytes: write (off, bytes), size (new size), page (off,
    bytes, since)."""
    seq: int
    kind: str
    ino: int
    off: int = 0
    data: bytes = b""
    since: int = 0


@dataclass
class Sync:
    """An fsync/fdatasync of a file or directory (node), or an msync of a range of a file."""
    seq: int
    node: int
    ranged: bool = False
    off: int = 0
    length: int = 0


class Replay:
    """The history of a root: its names (Meta), its files' bytes (Data) and syncs, each about a
    node — a file or directory as the log saw it; an inode number reused by a later file is a
    new node."""

    def __init__(self, root: str, snapshot: Snapshot, ops: list[Op]):
        self.root, self.snapshot, self.ops = os.path.abspath(root), snapshot, ops
        self._nodes: dict[int, int] = {}  # inode number -> its node now
        self._count = 0
        self.top = self._new_node(snapshot.root_ino)
        self.kinds: dict[int, str] = {self.top: "dir"}
        self.initial_names: dict[int, dict[str, int]] = {self.top: {}}
        self.initial_data: dict[int, bytes] = {}
        for rel in sorted(snapshot.entries, key=lambda r: r.count(os.sep)):
            e = snapshot.entries[rel]
            parent = self._resolve_in(self.initial_names, os.path.dirname(rel))
            node = self._new_node(e[1])
            self.initial_names[parent][os.path.basename(rel)] = node
            self.kinds[node] = e[0]
            if e[0] == "dir":
                self.initial_names.setdefault(node, {})
            else:
                self.initial_data[node] = e[2]
        self.meta: list[Meta] = []
        self.data: list[Data] = []
        self.syncs: list[Sync] = []
        self.marks: list[tuple[int, str]] = []
        self._replay()
        self._by_ino: dict[int, list[Data]] = {}  # each file's changes of its bytes, in the order made
        for d in sorted(self.data, key=lambda d: d.seq):
            self._by_ino.setdefault(d.ino, []).append(d)
        self._digests: dict[tuple, bytes] = {}  # (node, its changes kept) -> SHA-256 of its bytes

    def _new_node(self, ino: int) -> int:
        self._count += 1
        self._nodes[ino] = self._count
        return self._count

    def _node(self, ino: int) -> int:
        return self._nodes[ino] if ino in self._nodes else self._new_node(ino)

    # -- building the history ---------------------------------------------------------------
    def _rel(self, path: str) -> str:
        rel = os.path.relpath(os.path.normpath(path), self.root)
        if rel.startswith(".."):
            raise ValueError(f"{path} is outside {self.root}")
        return "" if rel == "." else rel

    def _resolve_in(self, names: dict, rel: str) -> int:
        """The node of directory rel (relative to the root) in a namespace."""
        node = self.top
        for part in rel.split(os.sep) if rel else ():
            node = names[node][part]
        return node

    def _where(self, names: dict, path: str) -> tuple[int, str]:
        rel = self._rel(path)
        return self._resolve_in(names, os.path.dirname(rel)), os.path.basename(rel)

    def _replay(self) -> None:
        names = {k: dict(v) for k, v in self.initial_names.items()}  # the namespace as the process saw it
        for op in self.ops:
            if op.kind == "mark":
                self.marks.append((op.seq, op.path))
                continue
            if op.kind == "mkdir" or op.created:
                node = self._new_node(op.ino)
                d, n = self._where(names, op.path)
                names[d][n] = node
                self.kinds[node] = "dir" if op.kind == "mkdir" else "file"
                if op.kind == "mkdir":
                    names.setdefault(node, {})
                self.meta.append(Meta(op.seq, "create", d, n, node))
            node = self._node(op.ino)
            if op.kind == "open" and op.flags & os.O_TRUNC:
                self.data.append(Data(op.seq, "size", node, 0))
            elif op.kind in ("unlink", "rmdir"):
                d, n = self._where(names, op.path)
                # the node the name held: its inode number may be another process's already (the shim numbers
                # an unlink after it returned, so a create of the freed inode elsewhere can be numbered first)
                node = names[d].pop(n, node)
                self.meta.append(Meta(op.seq, "remove", d, n, node))
            elif op.kind == "rename":
                d, n = self._where(names, op.path)
                d2, n2 = self._where(names, op.path2)
                node = names[d].pop(n, node)
                names[d2][n2] = node
                self.meta.append(Meta(op.seq, "rename", d, n, node, d2, n2))
            elif op.kind == "write":
                self.data.append(Data(op.seq, "write", node, op.off, op.data))
            elif op.kind == "truncate":
                self.data.append(Data(op.seq, "size", node, op.off))
            elif op.kind == "page":
                self.data.append(Data(op.seq, "page", node, op.off, op.data, since=op.ino2))
            elif op.kind == "fsync":
                self.syncs.append(Sync(op.seq, node, bool(op.flags & 2), op.off, op.length))

    # -- crash points and what survives them -------------------------------------------------
    def crash_points(self) -> list[int]:
        """Seq numbers c: a crash leaves every op below c done, none from c on."""
        points = [s.seq for s in self.syncs] + [self.ops[-1].seq + 1 if self.ops else 1]
        return sorted(set(points))

    def committed_marks(self, c: int) -> list[str]:
        return [text for seq, text in self.marks if seq < c]

    def _durable_meta(self, m: Meta, c: int) -> bool:
        synced_before = {s.node for s in self.syncs if m.seq < s.seq < c and s.node in m.dirs}
        return m.dirs <= synced_before

    def _durable_at(self) -> dict[int, float]:
        """Data op seq -> the seq of the first sync that made it durable (inf: none did)."""
        if not hasattr(self, "_made_durable"):
            by_node: dict[int, list[Sync]] = {}
            for sync in self.syncs:
                by_node.setdefault(sync.node, []).append(sync)
            self._made_durable = {}
            for d in self.data:
                first = float("inf")
                for sync in by_node.get(d.ino, ()):
                    # msync is Linux's fdatasync of its range: the file's size goes with it
                    covers = (d.kind == "size" or sync.off <= d.off < sync.off + sync.length) if sync.ranged \
                        else d.kind != "page"
                    if sync.seq > d.seq and covers:
                        first = sync.seq
                        break
                self._made_durable[d.seq] = first
        return self._made_durable

    @staticmethod
    def _cuts(n: int) -> list[int]:
        """Where a file's pending bytes are cut (a prefix of k kept): every k for a few, else the
        first and last few and MAX_CUTS spread between (a pool's thousands of pages)."""
        if n <= MAX_CUTS:
            return list(range(n))
        spread = {round(i * n / MAX_CUTS) for i in range(MAX_CUTS)}
        return sorted(spread | {0, 1, 2, 3, n - 3, n - 2, n - 1})

    def states(self, c: int) -> list[tuple[str, frozenset, frozenset]]:
        """(label, metas kept, data kept) for the disks a crash at c can leave."""
        metas = [m for m in self.meta if m.seq < c]
        forced = frozenset(m.seq for m in metas if self._durable_meta(m, c))
        pending = [m for m in metas if m.seq not in forced]
        datas = [d for d in self.data if d.seq < c or (d.kind == "page" and d.since < c)]
        made = self._durable_at()
        dforced = frozenset(d.seq for d in datas if d.seq < c and made[d.seq] < c)
        dpending = [d for d in datas if d.seq not in dforced]
        meta_all = forced | {m.seq for m in pending}
        meta_choices = [("names: all", meta_all), ("names: durable only", forced)]
        for j in range(1, len(pending)):
            meta_choices.append((f"names: first {j} of {len(pending)} not durable", forced | {m.seq for m in pending[:j]}))
        for d in sorted({x for m in pending for x in m.dirs}):
            meta_choices.append((f"names: dir {d}'s lost", meta_all - {m.seq for m in pending if d in m.dirs}))
        for m in pending:  # POSIX orders no two names: a later one may land without an earlier one
            meta_choices.append((f"names: op {m.seq} ({m.kind} {m.name}) alone lost", meta_all - {m.seq}))
        data_all = dforced | {d.seq for d in dpending}
        data_choices = [("bytes: all", data_all), ("bytes: durable only", dforced)]
        by_file: dict[int, list[Data]] = {}
        for d in dpending:
            by_file.setdefault(d.ino, []).append(d)
        for ino, ds in by_file.items():
            others_all = data_all - {d.seq for d in ds}
            others_none = dforced
            for k in self._cuts(len(ds)):
                data_choices.append((f"bytes: file {ino} first {k} of {len(ds)}", others_all | {d.seq for d in ds[:k]}))
            data_choices.append((f"bytes: file {ino} all, others none", others_none | {d.seq for d in ds}))
        out = []
        for ml, mk in meta_choices[:2]:
            for dl, dk in data_choices:
                out.append((f"{ml}; {dl}", mk, dk))
        for ml, mk in meta_choices[2:]:
            for dl, dk in data_choices[:2]:
                out.append((f"{ml}; {dl}", mk, dk))
        return out

    # -- one disk ---------------------------------------------------------------------------
    def disk(self, metas: frozenset, datas: frozenset) -> dict:
        """rel path -> None (a directory) or a File, for the chosen survivors."""
        names = {k: dict(v) for k, v in self.initial_names.items()}
        for m in self.meta:
            if m.seq not in metas:
                continue
            if m.kind == "create":
                names.setdefault(m.dir, {})[m.name] = m.ino
                if self.kinds.get(m.ino) == "dir":
                    names.setdefault(m.ino, {})
            elif m.kind == "remove":
                if names.get(m.dir, {}).get(m.name) == m.ino:
                    del names[m.dir][m.name]
            elif names.get(m.dir, {}).get(m.name) == m.ino:  # a rename of a name that survived
                del names[m.dir][m.name]
                names.setdefault(m.dir2, {})[m.name2] = m.ino
        out: dict = {}

        def walk(ino: int, rel: str, seen: set) -> None:
            for name, child in names.get(ino, {}).items():
                path = os.path.join(rel, name) if rel else name
                if self.kinds.get(child) == "dir":
                    if child in seen:
                        continue
                    out[path] = None
                    walk(child, path, seen | {child})
                else:
                    out[path] = File(self, child, tuple(d.seq for d in self._by_ino.get(child, ()) if d.seq in datas))

        walk(self.top, "", {self.top})
        return out

    def content(self, ino: int, kept: tuple) -> bytes:
        """A file's bytes once the changes `kept` (seqs) are made to what it held before."""
        buf = bytearray(self.initial_data.get(ino, b""))
        survived = set(kept)
        for d in self._by_ino.get(ino, ()):
            if d.seq not in survived:
                continue
            if d.kind == "size":
                del buf[d.off:]
                buf.extend(bytes(d.off - len(buf)))
            else:
                if len(buf) < d.off:
                    buf.extend(bytes(d.off - len(buf)))
                buf[d.off:d.off + len(d.data)] = d.data
        return bytes(buf)

    def digest(self, ino: int, kept: tuple) -> bytes:
        """The SHA-256 of content(ino, kept), computed once: most disks share most of their files."""
        key = (ino, kept)
        if key not in self._digests:
            self._digests[key] = hashlib.sha256(self.content(ino, kept)).digest()
        return self._digests[key]


@dataclass(frozen=True)
class File:
    """A file on one disk: its node and which of its changes survived; its bytes are built when
    asked (many disks are alike, and only one of each kind is written out)."""
    replay: Replay
    ino: int
    kept: tuple

    def bytes(self) -> bytes:
        return self.replay.content(self.ino, self.kept)

    def digest(self) -> bytes:
        return self.replay.digest(self.ino, self.kept)


def fingerprint(disk: dict) -> str:
    h = hashlib.sha256()
    for path in sorted(disk):
        h.update(path.encode() + b"\0")
        h.update(b"D" if disk[path] is None else disk[path].digest())
    return h.hexdigest()


def materialize(disk: dict, into: str) -> None:
    os.makedirs(into, exist_ok=True)
    for path in sorted(disk, key=lambda p: p.count(os.sep)):
        full = os.path.join(into, path)
        if disk[path] is None:
            os.makedirs(full, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "wb") as f:
                f.write(disk[path].bytes())

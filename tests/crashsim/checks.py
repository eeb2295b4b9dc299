"""What a disk left by a power loss must give, per kind of save: check(folder, marks) -> problems.

The promise is the same everywhere: the newest checkpoint the reader picks without reading its
bytes (a record, `latest`) is complete — it loads bit-exact, no fallback needed — and it is not
older than the newest one the program was told was committed. Nothing committed before is lost,
and nothing torn is ever given. And the order on disk holds whoever reads it: a commit record
that can be read names files that are all there, intact (data durable first); a `latest`
pointer names a checkpoint whose record is there (the record before `latest`).
"""
from __future__ import annotations

import os
import warnings

import torch

from .saves import MODEL, PATH_SAVES, POOL, REPLICA_TIERS, SET_FILES, state_of


def _told(marks: list[str]) -> int | None:
    """The newest step (or save index) the program was told was committed."""
    done = [int(m.split(":", 1)[1]) for m in marks if m.startswith("committed:")]
    return max(done) if done else None


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def records_hold(folder: str, every_rank: bool = True, verify=None) -> list[str]:
    """Every folder under `folder` whose commit record (`COMMIT`, every kind's) reads (its own CRC intact) has every file
    the record names, each matching the record's size and CRC-32 (verify(path, entry): the
    check `fastckpt verify` makes of such a file; default fastckpt.verify.verify_file)."""
    from fastckpt.commit import record
    from fastckpt.errors import CorruptCheckpointError
    from fastckpt.verify import verify_file
    verify = verify or verify_file
    record_name = record.COMMIT_NAME
    problems = []
    for d, _, files in os.walk(folder):
        if record_name not in files:
            continue
        try:
            info = record.read(d, record_name, size_of=None, every_rank=every_rank)
        except (CorruptCheckpointError, OSError):
            continue  # a record that does not read commits nothing
        for f in info.files:
            path = os.path.join(d, f.name)
            try:
                if os.path.getsize(path) != f.bytes:
                    raise CorruptCheckpointError(f"{os.path.getsize(path)} bytes, the record says {f.bytes}")
                verify(path, f)
            except (OSError, CorruptCheckpointError) as e:
                problems.append(f"{os.path.relpath(d, folder)}/{record_name} is there, its file {f.name} is not "
                                f"intact: {str(e).splitlines()[0][:160]}")
    return problems


def _has_record(folder: str, every_rank: bool = True) -> bool:
    from fastckpt.commit import record
    from fastckpt.errors import CorruptCheckpointError
    try:
        record.read(folder, record.COMMIT_NAME, size_of=None, every_rank=every_rank)
        return True
    except (CorruptCheckpointError, OSError):
        return False


def latest_names_a_record(folder: str) -> list[str]:
    """A root's `latest`, when it reads, names a folder whose commit record reads (the record before `latest`)."""
    import json
    try:
        with open(os.path.join(folder, "latest"), "rb") as f:
            latest = json.loads(f.read())
    except (OSError, ValueError):
        latest = None
    if isinstance(latest, dict) and not _has_record(os.path.join(folder, str(latest.get("dir")))):
        return [f"`latest` names {latest.get('dir')}, which has no commit record that reads"]
    return []


def root_store(folder: str, marks: list[str]) -> list[str]:
    import fastckpt
    told, problems = _told(marks), records_hold(folder) + latest_names_a_record(folder)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ck = fastckpt.Checkpointer(folder)
        try:
            named = ck.latest()  # by its record and `latest`, no byte read
            verified = ck.latest(verified=True)
            state = ck.load() if verified is not None else None
        except Exception as e:  # noqa: BLE001 - any failure to read a disk left by a crash is the finding
            return problems + [f"reading it failed: {type(e).__name__}: {e}"]
        finally:
            ck.close()
    if told is not None and (named is None or named.step < told):
        problems.append(f"told step {told} was committed, the disk's newest is "
                        f"{None if named is None else named.step}")
    if named is not None and (verified is None or verified.step != named.step):
        problems.append(f"latest() names step {named.step}, whose bytes do not check (the newest that does: "
                        f"{None if verified is None else verified.step})")
    if verified is not None and not _same(state, state_of(verified.step)):
        problems.append(f"load() of step {verified.step} differs from what was saved")
    problems += [f"warned: {w.message}" for w in said if "fastckpt" in str(w.message) and named is not None
                 and "fall" in str(w.message)]
    return problems


def pool(folder: str, marks: list[str]) -> list[str]:
    """The pool opens at a version not older than told, whose bytes check, and loads it bit-exact."""
    import fastckpt
    told, problems = _told(marks), []
    path = os.path.join(folder, POOL)
    if not os.path.exists(path):
        return [f"told step {told} was committed, the pool file is gone"] if told is not None else []
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        try:
            with fastckpt.Checkpointer(path, store="pmem", model=MODEL, concurrency=1) as ck:
                named, verified = ck.latest(), ck.latest(verified=True)
                state = ck.load() if verified is not None else None
        except Exception as e:  # noqa: BLE001
            return [f"opening the pool failed: {type(e).__name__}: {str(e)[:200]}"]
    if told is not None and (named is None or named.step < told):
        problems.append(f"told step {told} was committed, the pool's current is {None if named is None else named.step}")
    if named is not None and (verified is None or verified.step != named.step):
        problems.append(f"the pool's current step {named.step} does not check (the newest that does: "
                        f"{None if verified is None else verified.step})")
    if verified is not None and not _same(state, state_of(verified.step)):
        problems.append(f"load() of step {verified.step} differs from what was saved")
    return problems


def path_store(folder: str, marks: list[str]) -> list[str]:
    """Each name is its old checkpoint or its new one, complete; a name told committed is there."""
    import fastckpt
    told, problems = _told(marks), []
    for name in sorted({n for n, _ in PATH_SAVES}):
        saves = [(i, step) for i, (n, step) in enumerate(PATH_SAVES) if n == name]
        owed = [i for i, _ in saves if told is not None and i <= told]
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            if owed:
                problems.append(f"{name}: told save {owed[-1]} was committed, the file is gone")
            continue
        try:
            got = fastckpt.load(path)
        except Exception as e:  # noqa: BLE001
            problems.append(f"{name}: present but does not load: {type(e).__name__}: {e}")
            continue
        allowed = [step for i, step in saves if not owed or i >= owed[-1]]
        if not any(_same(got, state_of(step)) for step in allowed):
            problems.append(f"{name}: loads as none of the saves it may hold (steps {allowed})")
    return problems


def dcp(folder: str, marks: list[str]) -> list[str]:
    """newest_committed names a folder DCP's load (our reader, every CRC) fills bit-exact."""
    import torch.distributed.checkpoint as dcp_api

    from fastckpt.dcp import FastStorageReader, newest_committed
    from fastckpt.dcp.check import check_file
    told, problems = _told(marks), records_hold(folder, every_rank=False, verify=check_file)
    try:
        newest = newest_committed(folder)
    except Exception as e:  # noqa: BLE001
        return [f"newest_committed failed: {type(e).__name__}: {e}"]
    step = None if newest is None else int(os.path.basename(newest).split("-")[1])
    if told is not None and (step is None or step < told):
        return problems + [f"told step {told} was committed, the newest committed is {step}"]
    if step is None:
        return problems
    target = {k: v for k, v in state_of(step).items()}
    target = {"model": {k: torch.zeros_like(v) for k, v in target["model"].items()},
              "opt": {"exp_avg": torch.zeros_like(target["opt"]["exp_avg"])}, "step": -1}
    try:
        dcp_api.load(target, storage_reader=FastStorageReader(newest))
    except Exception as e:  # noqa: BLE001
        return problems + [f"step {step}, named committed, does not load: {type(e).__name__}: {e}"]
    if not _same(target, state_of(step)):
        problems.append(f"step {step} loads other values than were saved")
    return problems


def newest_recorded(folder: str, every_rank: bool = True):
    """The step of the record with the highest counter among folder's folders whose record reads
    (what a reader that goes by records alone picks); None when there is none."""
    from fastckpt.commit import record
    from fastckpt.errors import CorruptCheckpointError
    newest = None
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        try:
            info = record.read(os.path.join(folder, name), record.COMMIT_NAME, size_of=None, every_rank=every_rank)
        except (CorruptCheckpointError, OSError):
            continue
        if newest is None or info.counter > newest.counter:
            newest = info
    return None if newest is None else newest.step


def file_set(folder: str, marks: list[str]) -> list[str]:
    """The newest set by its record is not older than told, and its two files load bit-exact."""
    told, problems = _told(marks), records_hold(folder, every_rank=False)
    step = newest_recorded(folder, every_rank=False)
    if told is not None and (step is None or step < told):
        return problems + [f"told set {told} was committed, the newest committed is {step}"]
    if step is None:
        return problems
    got = {}
    try:
        for name in SET_FILES:
            got.update(torch.load(os.path.join(folder, f"set-{step}", name), weights_only=True))
    except Exception as e:  # noqa: BLE001
        return problems + [f"set {step}, named committed, does not load: {type(e).__name__}: {e}"]
    if not _same(got, state_of(step)):
        problems.append(f"set {step} loads other values than were saved")
    return problems


def deepspeed(folder: str, marks: list[str], expected: str) -> list[str]:
    """The tag DeepSpeed's load would read (through fastckpt's choice) is committed, not older
    than told, and its every file is the one that was committed (expected/TAG); fastckpt-latest
    names a tag whose record is there."""
    from deepspeed_fastckpt.load_tag import choose
    from deepspeed_fastckpt.tag_records import LATEST, read_record
    from fastckpt.commit.record import file_size
    told, problems = _told(marks), records_hold(folder, every_rank=False)
    try:
        with open(os.path.join(folder, LATEST), "rb") as f:
            named = f.read().decode(errors="replace")
    except OSError:
        named = None
    if named and not _has_record(os.path.join(folder, named), every_rank=False):
        problems.append(f"{LATEST} names {named!r}, which has no commit record that reads")
    try:
        choice = choose(folder, None, file_size)
    except Exception as e:  # noqa: BLE001
        return problems + [f"choosing the tag to load failed: {type(e).__name__}: {e}"]
    step = int(choice.tag.removeprefix("global_step")) if choice.tag else None
    if told is not None and (step is None or step < told):
        problems.append(f"told step {told} was committed, a load would read {choice.tag} ({choice.status})")
    if choice.tag is None:
        return problems
    if choice.status != "committed":  # every tag here is fastckpt's: one without a record is torn
        return problems + [f"a load would read {choice.tag}, {choice.status}: {choice.warning}"]
    for f in read_record(folder, choice.tag).files:
        with open(os.path.join(folder, choice.tag, f.name), "rb") as got, \
                open(os.path.join(expected, choice.tag, f.name), "rb") as want:
            if got.read() != want.read():
                problems.append(f"{choice.tag}/{f.name} differs from the file that was committed")
    return problems


def replicas(folder: str, marks: list[str]) -> list[str]:
    """A node-local disk tier in front of a shared one, each rank's part also kept by its partner
    (saves.replicas): every record on either tier names files that are all there and intact — on
    a rank's local folder that is its own part and the replica it keeps, both durable before the
    record — and the shared tier's newest record is not older than told, `latest` naming a
    record that reads."""
    local, shared = (os.path.join(folder, t) for t in REPLICA_TIERS)
    told, problems = _told(marks), records_hold(folder) + latest_names_a_record(shared)
    newest = newest_recorded(shared)
    if told is not None and (newest is None or newest < told):
        problems.append(f"told step {told} was committed, the shared tier's newest is {newest}")
    for rank in (0, 1):
        kept = newest_recorded(os.path.join(local, f"rank-{rank}"))
        if kept is not None and newest is not None and told is not None and kept < told and newest < told:
            problems.append(f"rank {rank}'s local tier holds step {kept}, older than told ({told})")
    return problems

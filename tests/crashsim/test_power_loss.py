"""Power loss, simulated: every disk a crash could leave at every moment of a save, checked.

kill -9 keeps the page cache, so a wrong order of fdatasync and rename never shows in a killed
process. Here every file operation of a real save (its native writers' included) is recorded
(record_shim.c), and every state a power loss could leave — what was fsync'ed kept, anything
else kept or lost as POSIX allows (disk.py) — is written out and read back: the newest
committed checkpoint, bit-exact, never a torn one, never nothing once one was committed
(checks.py). The first test shows the simulator itself catches each order bug, on a program
of a few lines; `make test-planted` shows the suite catches them planted into fastckpt.
"""
from __future__ import annotations

import functools
import os
import sys

import pytest

from crashsim import checks
from crashsim.harness import SAVES, judge, record

CHECKS = {"path": checks.path_store, "pool": checks.pool}
# the tiers' own writes, each judged as what it must give: the copy to the root through the page
# cache (a filesystem refusing O_DIRECT), the persist of a named path from its memory copy (direct
# and through the page cache), and the replica a partner keeps on a node-local disk (2 ranks)
TIER_CHECKS = {"tiers_buffered": checks.root_store, "path_tiers": checks.path_store,
               "path_tiers_buffered": checks.path_store, "replicas": checks.replicas}


TOY = r'''
import os, sys
root, order = sys.argv[1], sys.argv[2]
def fsync_dir(d):
    fd = os.open(d, os.O_RDONLY); os.fsync(fd); os.close(fd)
def put(path, data, sync=True):
    with open(path + ".tmp", "wb") as f:
        f.write(data)
        if sync:
            f.flush(); os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
ck = os.path.join(root, "ck")
os.mkdir(ck); fsync_dir(root)
data = open(os.path.join(ck, "data"), "wb"); data.write(b"x" * 10000); data.flush()
if order != "data fsync after the record":
    os.fsync(data.fileno())
if order != "record before the directory fsync":
    fsync_dir(ck)
if order == "latest before the record":
    put(os.path.join(root, "latest"), b"ck"); fsync_dir(root)
put(os.path.join(ck, "COMMIT"), b"10000"); fsync_dir(ck)
if order != "latest before the record":
    put(os.path.join(root, "latest"), b"ck"); fsync_dir(root)
if order == "data fsync after the record":
    os.fsync(data.fileno())
'''


def toy_check(folder: str, marks: list[str]) -> list[str]:
    """The toy's promise: a COMMIT there means its data is all there; `latest` names a committed ck."""
    ck = os.path.join(folder, "ck")
    problems = []
    if os.path.exists(os.path.join(ck, "COMMIT")):
        size = open(os.path.join(ck, "COMMIT"), "rb").read()
        data = os.path.join(ck, "data")
        if size != b"10000" or not os.path.exists(data) or open(data, "rb").read() != b"x" * 10000:
            problems.append("COMMIT is there, its data is not all there")
    if os.path.exists(os.path.join(folder, "latest")) and not os.path.exists(os.path.join(ck, "COMMIT")):
        problems.append("latest is there, COMMIT is not")
    return problems


@pytest.mark.parametrize("order", ["right", "data fsync after the record", "record before the directory fsync",
                                   "latest before the record"])
def test_the_simulator_catches_each_write_order_bug_in_a_program_of_a_few_lines(tmp_path, shim, work, order):
    root = tmp_path / "root"
    rec = record(shim, str(root), [sys.executable, "-c", TOY, str(root), order])
    verdict = judge(rec, toy_check, work)
    print(f"\n{order}: {verdict.crash_points} crash points, {verdict.states} states")
    if order == "right":
        assert verdict.problems == [] and verdict.states >= 5
    else:
        assert verdict.problems, f"{order}: no state showed it"


MARKED_TAG = r'''
import os, sys
from deepspeed_fastckpt.tag_records import mark_open
from fastckpt.session import write_atomic
root = sys.argv[1]
mark_open(root, "global_step1")
write_atomic(os.path.join(root, "global_step1", "mp_rank_00_model_states.pt"), b"x" * 10000)
'''


def test_a_deepspeed_tag_begun_is_never_read_as_another_writers_after_a_power_loss(tmp_path, shim, work):
    """A tag fastckpt began (its open mark) whose first file is then written durably (tmp,
    fsync, rename, directory sync — as every writer does): no disk a power loss can leave shows
    that file without the mark, which would make the torn tag another engine's (foreign), loaded
    as DeepSpeed would. Deterministic (one thread); the DeepSpeed save above meets it only when
    its threads happen to order their renames so."""
    from deepspeed_fastckpt.tag_records import tag_status
    from fastckpt.session import file_size
    root = tmp_path / "root"
    rec = record(shim, str(root), [sys.executable, "-c", MARKED_TAG, str(root)])
    seen = []

    def check(folder: str, marks: list[str]) -> list[str]:
        status, why = tag_status(folder, "global_step1", file_size)
        seen.append(status)
        return [why] if status == "foreign" else []

    verdict = judge(rec, check, work)
    assert verdict.problems == [], "\n".join(verdict.problems)
    assert "torn" in seen and verdict.states >= 5, seen


# the Checkpointer's root store and DCP's saves are two implementations of the commit seam: the
# seam's conformance suite (tests/fastckpt/commit/test_commit_protocol.py) judges them, with a set
# of files, the same way
@pytest.mark.parametrize("kind", ["path", "pool", "deepspeed"])
def test_every_disk_a_power_loss_can_leave_gives_the_newest_committed_checkpoint(tmp_path, shim, work, kind):
    if kind == "deepspeed":
        pytest.importorskip("deepspeed")
    root = tmp_path / "root"
    rec = record(shim, str(root), [sys.executable, SAVES, kind, str(root)])
    assert any(op.kind == "fsync" for op in rec.ops) and any(op.kind == "mark" for op in rec.ops), rec.output[-2000:]
    check = (functools.partial(checks.deepspeed, expected=str(root) + ".expected") if kind == "deepspeed"
             else CHECKS[kind])
    verdict = judge(rec, check, work)
    print(f"\n{kind}: {len(rec.ops)} file operations, {verdict.crash_points} crash points, "
          f"{verdict.states} distinct disks checked")
    assert verdict.problems == [], "\n".join(verdict.problems)
    assert verdict.states >= 20


@pytest.mark.parametrize("kind", list(TIER_CHECKS))
def test_every_disk_a_power_loss_can_leave_over_the_tiers_holds_what_each_tier_claims(tmp_path, shim, work, kind):
    """The tiers' own durable writes, beyond the commit protocol (PersistCommit's suite:
    tests/fastckpt/commit/test_commit_protocol.py): at every cut, a checkpoint whose record on a
    tier says it is there (its COMMIT, `latest`, a path renamed into place) is whole on that tier,
    and none told durable is lost. The memory tier itself (ROOT.memory) lies outside the recorded
    disk: a power loss takes it. Removing any fdatasync of the copy or of the replica fails this
    (tests/planted/bugs.py: tier-copy-*, replica-*)."""
    root = tmp_path / "root"
    rec = record(shim, str(root), [sys.executable, SAVES, kind, str(root)])
    assert any(op.kind == "fsync" for op in rec.ops) and any(op.kind == "mark" for op in rec.ops), rec.output[-2000:]
    verdict = judge(rec, TIER_CHECKS[kind], work)
    print(f"\n{kind}: {len(rec.ops)} file operations, {verdict.crash_points} crash points, "
          f"{verdict.states} distinct disks checked")
    assert verdict.problems == [], "\n".join(verdict.problems)
    assert verdict.states >= 20

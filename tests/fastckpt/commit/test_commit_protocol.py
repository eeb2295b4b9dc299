"""The commit seam's conformance suite: every implementation of fastckpt.commit.protocol's
CommitUnit, through the same cases.

The implementations, each driven by a real program of tests/crashsim/saves.py (real saves,
real files, real fsync): the Checkpointer's unit (CheckpointCommit: a Checkpointer, two saves in
flight), a set of files (FileSetCommit: sets of two fastckpt saves, two sets in flight) and a
set gathered on a coordinator (GatheredCommit: DCP's save through FastStorageWriter), and a
checkpoint committed on a memory tier persisted to the root behind it (PersistCommit: a
Checkpointer with tiers; the root is what is checked, the memory tier being what a power loss
takes).

The cases:
- a process killed (os._exit, as kill -9) just before each numbered call of the second unit
  issued: the disk gives the newest checkpoint the program was told was committed, bit-exact;
  before `record` (5) the checkpoint before is still the newest, from `landed` (6) on the new
  one is — and the unit that died is the implementation's own, driven by the one ordered commit;
- every disk a power loss could leave at every moment (tests/crashsim: the page cache lost too):
  a record is never there without every byte it names;
- a deliberately broken commit — DCP's .metadata, the coordinator's part, written without its
  fsync, or a memory tier's copy to the root written without its fdatasync, so a record can
  land before its data is durable — fails the power-loss case.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from crashsim import checks
from crashsim.harness import SAVES, judge, record
from fastckpt.commit.protocol import CALLS
from support import warm

# implementation -> (the program of saves.py, its check, every rank writes a file)
KINDS = {
    "CheckpointCommit": ("root", checks.root_store, True),
    "FileSetCommit": ("file_set", checks.file_set, False),
    "GatheredCommit": ("dcp", checks.dcp, False),
    "PersistCommit": ("tiers", checks.root_store, True),
}


def run(kind: str, root: str, env: dict) -> subprocess.CompletedProcess:
    return warm.run([sys.executable, SAVES, kind, root], env={**os.environ, **env}, capture_output=True,
                    text=True, timeout=300)


def marks_of(output: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in output.splitlines() if line.startswith("sim-mark ")]


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("unit", list(KINDS))
def test_a_kill_before_each_numbered_call_leaves_the_newest_committed_checkpoint(tmp_path, unit, call):
    kind, check, every_rank = KINDS[unit]
    root = str(tmp_path / "root")
    os.makedirs(root)
    proc = run(kind, root, {"FASTCKPT_TEST_CRASH_BEFORE": f"{call}:2:{unit}"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 137 and f"crash before {call} of unit 2 ({unit}:" in out, out[-3000:]
    marks = marks_of(proc.stdout)
    assert check(root, marks) == []
    newest = checks.newest_recorded(root, every_rank)
    # the unit that died from `record` on is the second that recorded: step 2's, or with tiers
    # step 3's copy when step 2's gave way to it (Superseded, as it should while 3 landed first)
    went = re.search(rf"crash before {call} of unit 2 \(PersistCommit: the copy of step (\d+) to", out)
    step = int(went.group(1)) if went else 2
    if CALLS.index(call) <= CALLS.index("record"):
        assert newest == 1, f"killed before {call}: the newest committed is {newest}, not the one before (1)"
    elif call == "afterwards":  # the unit after it was let go at its landing and may have committed since
        assert newest in (step, 3), f"killed before {call}, after its record: the newest committed is {newest}"
    else:
        assert newest == step, f"killed before {call}, after its record: the newest committed is {newest}, not {step}"


@pytest.mark.parametrize("unit", list(KINDS))
def test_every_disk_a_power_loss_can_leave_gives_the_newest_committed_checkpoint(tmp_path, shim, work, unit):
    kind, check, _ = KINDS[unit]
    root = tmp_path / "root"
    rec = record(shim, str(root), [sys.executable, SAVES, kind, str(root)])
    assert any(op.kind == "fsync" for op in rec.ops) and any(op.kind == "mark" for op in rec.ops), rec.output[-2000:]
    verdict = judge(rec, check, work)
    print(f"\n{unit}: {len(rec.ops)} file operations, {verdict.crash_points} crash points, "
          f"{verdict.states} distinct disks checked")
    assert verdict.problems == [], "\n".join(verdict.problems)
    assert verdict.states >= 20


@pytest.mark.parametrize("unit, bug", [("GatheredCommit", "nondurable_metadata"),
                                       ("PersistCommit", "nondurable_tier_copy")])
def test_a_commit_whose_record_lands_before_its_data_is_durable_fails_the_suite(tmp_path, shim, work, unit, bug):
    kind, check, _ = KINDS[unit]
    root = tmp_path / "root"
    rec = record(shim, str(root), [sys.executable, SAVES, kind, str(root)], env={"FASTCKPT_TEST_PLANT": bug})
    verdict = judge(rec, check, work)
    assert verdict.problems, f"no disk of {verdict.states} showed a record naming data that is not durable ({bug})"
    print("\n" + "\n".join(verdict.problems[:3]))

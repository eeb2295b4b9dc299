"""fastckpt.commit.ordered: units land in the order they were issued whatever order their parts
finish in, a failure lands as an error without holding up the next unit, a record that fails
fails its unit, and a unit stuck before its turn stops the next one at the deadline, never hangs."""
from __future__ import annotations

import threading
import time

from fastckpt.commit.agreement import Agreement
from fastckpt.commit.ordered import CommitUnit, OrderedCommits
from fastckpt.errors import CheckpointWriteError
from fastckpt.write.deadline import Deadline, WriteStalled


class Unit(CommitUnit):
    def __init__(self, name: str, log: list, finish_after: float = 0.0, fail: str = "", gate=None):
        self.label, self.log, self.delay, self.fail, self.gate = name, log, finish_after, fail, gate
        self.done = threading.Event()
        self.info = self.error = None

    def finish(self):
        if self.gate is not None:
            self.gate.wait()
        time.sleep(self.delay)
        self.log.append(("finished", self.label))
        if self.fail == "finish":
            raise OSError(f"{self.label}: disk gone")
        return self.label.upper()

    def record(self, parts, rank):
        if self.fail == "record":
            raise CheckpointWriteError(f"{self.label}: record not written")
        self.log.append(("recorded", self.label, tuple(parts), rank))
        return {"unit": self.label}

    def landed(self, info, error):
        self.info, self.error = info, error
        self.log.append(("landed", self.label))

    def afterwards(self):
        self.done.set()


def commits(stall_s: float = 30.0) -> OrderedCommits:
    return OrderedCommits(Agreement(), Deadline(stall_s), slack_s=0.0)


def landings(log: list) -> list:
    return [entry[1] for entry in log if entry[0] == "landed"]


def test_units_land_in_issue_order_whatever_order_they_finish_in():
    log: list = []
    c = commits()
    units = [Unit("a", log, 0.3), Unit("b", log, 0.1), Unit("c", log, 0.0)]
    for u in units:
        c.issue(u)
    for u in units:
        assert u.done.wait(10)
    finished = [entry[1] for entry in log if entry[0] == "finished"]
    assert finished == ["c", "b", "a"]  # the parts were finished in parallel ...
    assert landings(log) == ["a", "b", "c"]  # ... and committed in issue order
    assert [u.info for u in units] == [{"unit": "a"}, {"unit": "b"}, {"unit": "c"}]
    assert ("recorded", "b", ("B",), 0) in log  # every rank's part (here one) reaches the record


def test_a_failed_unit_lands_with_its_error_and_the_next_commits():
    log: list = []
    c = commits()
    bad, failed_record, good = Unit("a", log, fail="finish"), Unit("b", log, fail="record"), Unit("c", log)
    for u in (bad, failed_record, good):
        c.issue(u)
    assert good.done.wait(10)
    assert isinstance(bad.error, OSError) and bad.info is None
    assert "record not written" in str(failed_record.error) and failed_record.info is None
    assert good.error is None and good.info == {"unit": "c"}
    assert not any(entry[:2] == ("recorded", "a") for entry in log)


def test_an_error_before_the_unit_began_still_takes_its_turn():
    log: list = []
    c = commits()
    first, second = Unit("a", log, 0.2), Unit("b", log)
    c.issue(first)
    c.issue(second, error=CheckpointWriteError("b: could not begin"))
    assert second.done.wait(10)
    assert landings(log) == ["a", "b"] and "could not begin" in str(second.error)
    assert ("finished", "b") not in log  # it never began, so nothing was finished


def test_a_unit_stuck_before_its_turn_stops_the_next_at_the_deadline():
    log: list = []
    c = commits(stall_s=0.3)
    release = threading.Event()
    stuck, next_one = Unit("a", log, gate=release), Unit("b", log)
    c.issue(stuck)
    t0 = time.monotonic()
    c.issue(next_one)
    assert next_one.done.wait(10)
    assert isinstance(next_one.error, WriteStalled) and "the commit before b" in str(next_one.error)
    assert time.monotonic() - t0 < 5
    release.set()
    assert stuck.done.wait(10) and stuck.error is None


class TwoRanks(Agreement):
    """The other rank agrees with everything; every collective is logged."""

    rank, world_size = 0, 2

    def __init__(self, log: list):
        self.log = log

    def all_ok(self, ok: bool, background: bool = False) -> bool:
        self.log.append(("all_ok",))
        return ok

    def gather(self, obj, background: bool = False) -> list:
        self.log.append(("gather", obj[1]))
        return [obj, obj]


def test_across_ranks_a_stall_before_its_turn_makes_no_collective_and_stops_later_commits():
    """The unit before may still be in its exchange with the other ranks: a unit that stopped
    waiting for it must not exchange on the same group (the two could pair up wrongly on another
    rank), and no later unit can be in step again."""
    log: list = []
    c = OrderedCommits(TwoRanks(log), Deadline(0.3), slack_s=0.0)
    release = threading.Event()
    stuck, stalled, later = Unit("a", log, gate=release), Unit("b", log), Unit("c", log)
    c.issue(stuck)
    c.issue(stalled)
    assert stalled.done.wait(10) and isinstance(stalled.error, WriteStalled)
    c.issue(later)
    assert later.done.wait(10)
    assert "not committed" in str(later.error) and "no longer commit in step" in str(later.error)
    release.set()
    assert stuck.done.wait(10) and stuck.error is None  # the unit in flight still commits with its peers
    assert [entry for entry in log if entry[0] == "gather"] == [("gather", "A")]

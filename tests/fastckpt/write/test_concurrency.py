"""write.concurrency.ConcurrencySlots, the bound a Checkpointer's checkpoints and FastStager's
snapshots are drawn from: made once and reused, skip and wait, a lower limit per take, slots
reclaimed from holders that cannot say when they are done, and a Checkpointer that never has
more than `concurrency` checkpoints in flight nor leaks a slot when it skips."""
import threading
import time

import pytest
import torch

from fastckpt import Checkpointer
from fastckpt.errors import ConfigError
from fastckpt.write.concurrency import ConcurrencySlots, limit_for
from fastckpt.write.deadline import Deadline


def wait_for(timeout_s):
    """The owner's wait, as theirs is made: its Deadline's, here giving up after timeout_s."""
    return lambda attempt: Deadline(60.0).wait("a free slot", attempt, timeout=timeout_s)


class Holder:
    def __init__(self, i):
        self.index, self.done = i, False


def test_slots_are_made_once_and_reused_in_order():
    made = []
    slots = ConcurrencySlots(2, lambda i: made.append(i) or Holder(i))
    a, b = slots.take(), slots.take()
    assert (a.index, b.index) == (0, 1) and slots.take() is None  # skip: none free, at once
    slots.give_back(a)
    assert slots.take() is a and made == [0, 1]
    assert slots.taken() == [b, a] and slots.every() == [a, b]
    with pytest.raises(RuntimeError, match="not taken"):
        slots.give_back(Holder(9))


def test_a_lower_limit_bounds_one_take_and_never_raises_the_bound():
    slots = ConcurrencySlots(3)
    first = slots.take(limit=1)
    assert slots.take(limit=1) is None  # one save of this size at a time
    assert slots.take(limit=10) is not None and slots.take(limit=10) is not None
    assert slots.take(limit=10) is None  # concurrency is the most, whatever the limit
    slots.give_back(first)
    assert limit_for(4, None, 10) == 4 and limit_for(4, 100, 60 << 20) == 1 and limit_for(4, 100, 30 << 20) == 3
    assert limit_for(4, 10, 1 << 30) == 1  # larger than staging_mb: still one, alone


def test_wait_returns_the_slot_given_back_meanwhile_or_none_when_it_gives_up():
    slots = ConcurrencySlots(1)
    held = slots.take()
    t0 = time.monotonic()
    assert slots.take(wait_for(0.2)) is None and time.monotonic() - t0 >= 0.2
    threading.Timer(0.1, slots.give_back, (held,)).start()
    t0 = time.monotonic()
    assert slots.take(wait_for(5.0)) == held and time.monotonic() - t0 < 2.0


def test_reclaim_gives_back_the_slots_whose_holders_are_done():
    slots = ConcurrencySlots(1, Holder, reclaim=lambda: [slots.give_back(s) for s in slots.taken() if s.done])
    held = slots.take()
    assert slots.take() is None
    held.done = True  # nobody told the slots: the next take asks
    again = slots.take()
    assert again is held


def test_concurrency_is_checked_where_the_slots_are_made():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="concurrency"):
            ConcurrencySlots(bad)


def test_a_checkpointer_never_has_more_than_concurrency_in_flight_and_a_skip_leaks_no_slot(tmp_path):
    """policy='skip' with staging too small for a second checkpoint: the save is skipped and its
    slot given back, so once the first lands the next save takes a slot again."""
    state = {"w": torch.arange(1 << 18, dtype=torch.float32)}  # 1 MiB
    with Checkpointer(str(tmp_path), concurrency=2, policy="skip", chunk_mb=1, staging_mb=1) as ck:
        first = ck.save(state, step=1)
        ck.gate()
        second = ck.save(state, step=2)  # a slot is free, staging is not (unless the first landed)
        assert len(ck._slots.taken()) <= 2
        ck.wait()
        assert len(ck._slots.taken()) == 0  # nothing leaked, skipped or not
        third = ck.save(state, step=3)
        ck.wait()
    assert not first.skipped and not third.skipped
    assert second.skipped or second.done()

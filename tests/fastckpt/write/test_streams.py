"""Marks of a stream: waited on without polling (the GIL released while blocked), errors raised."""
import time

import pytest
import torch

from fastckpt.write.streams import HostStream


def test_a_mark_blocks_until_the_copies_before_it_are_done():
    s = HostStream(delay_s=0.3)
    src, dst = torch.arange(1000.0), torch.zeros(1000)
    s.copy(dst, src)
    m = s.mark()
    t0 = time.monotonic()
    assert not m.wait(0.05) and not m.query()
    assert 0.04 < time.monotonic() - t0 < 0.25  # it blocked for its timeout, no longer
    assert m.wait(5.0) and m.query()
    assert torch.equal(dst, src)
    s.close()
    assert s.mark().wait(5.0)  # after close: complete once everything issued has run


def test_a_failed_copy_makes_its_mark_and_every_later_one_raise():
    s = HostStream()
    s.copy(torch.zeros(3), torch.zeros(4))  # shapes differ: the copy fails on the stream
    first = s.mark()
    with pytest.raises(RuntimeError):
        first.wait(5.0)
    s.copy(torch.zeros(3), torch.ones(3))
    with pytest.raises(RuntimeError):
        s.mark().wait(5.0)
    s.close()

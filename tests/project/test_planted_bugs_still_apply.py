"""Every bug of tests/planted/bugs.py still finds the text it replaces, exactly once, in this tree.

`make test-planted` plants each bug in a scratch copy and runs the tests that must catch it (ten
minutes, so not part of `make test`); a bug whose text the code no longer holds cannot be planted
and would fail that run late. This catches the drift at once: the code moved, so the bug must be
planted anew where the code now is."""
from __future__ import annotations

import os
import sys

import pytest

from support.paths import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests", "planted"))
import bugs  # noqa: E402


@pytest.mark.parametrize("bug", bugs.BUGS, ids=lambda bug: bug.name)
def test_each_planted_bug_finds_its_text_once(bug):
    for rel, old, new in bug.edits:
        with open(os.path.join(ROOT, rel)) as f:
            text = f.read()
        assert text.count(old) == 1, f"{bug.name}: {rel} holds its text {text.count(old)} times, not once"
        assert old != new, bug.name

"""A save during training copies at once what the optimizer update does not write (buffers,
frozen parameters: write.gate.freeze_unowned). Those copies keep the layout of what they copy:
views of one storage stay views of one copy, with their strides, and a Parameter stays one —
so a checkpoint saved during a run loads back as the same save outside a run would."""
from __future__ import annotations

import torch

import fastckpt
from fastckpt.write.gate import StepGate


def test_what_is_copied_at_once_keeps_its_views_strides_and_types(tmp_path):
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gate = StepGate(lambda: None)
    gate.install()
    try:
        model(torch.randn(2, 8)).sum().backward()
        opt.step()  # the gate now knows the optimizer: its parameters are owned
        base = torch.randn(64, 96)
        frozen = torch.nn.Parameter(torch.randn(3, 3), requires_grad=False)
        state = {"model": model.state_dict(), "base": base, "t": base.t(), "gaps": base[3:9, ::3],
                 "channels_last": torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last),
                 "frozen": frozen, "empty": torch.empty(0, 2)}
        view = gate.snapshot_view(state)
    finally:
        gate.remove()
    got = view.state
    assert got["model"]["weight"] is state["model"]["weight"]  # owned: left to the snapshot
    for k in ("base", "t", "gaps", "channels_last", "frozen", "empty"):
        assert got[k].stride() == state[k].stride() and torch.equal(got[k], state[k]), k
    copy = got["base"].untyped_storage().data_ptr()
    assert copy != base.untyped_storage().data_ptr()  # a copy, made now
    assert got["t"].untyped_storage().data_ptr() == got["gaps"].untyped_storage().data_ptr() == copy
    assert type(got["frozen"]) is torch.nn.Parameter and not got["frozen"].requires_grad
    before = base.clone()
    base.add_(1)  # what a forward pass might do before the snapshot is written
    fastckpt.save(got, tmp_path / "x.pt")
    back = fastckpt.load(tmp_path / "x.pt")
    for k in ("t", "gaps", "channels_last"):
        assert back[k].stride() == state[k].stride(), k
    assert torch.equal(back["gaps"], before[3:9, ::3])
    assert back["gaps"].untyped_storage().data_ptr() == back["base"].untyped_storage().data_ptr()

"""Child process of the crash tests: saves in a loop and reports each commit on stdout.

Usage: python crash_child.py ROOT [concurrency] [format] [device] [strategy]
Prints "ready", then "committed STEP" for every checkpoint whose wait() returned.
Each state is derived from its step, so a loaded checkpoint can be checked exactly.
"""
import sys

import torch

import fastckpt
from one_line import say  # noqa: E402


def state_for(step: int, device: str = "cpu") -> dict:
    """The model's tensors on `device`; the optimizer's step counter on the CPU, as Adam keeps it."""
    g = torch.Generator().manual_seed(step)
    return {"model": {f"w{i}": torch.randn(64, 1024, generator=g).to(device) for i in range(6)},
            "optim": {"state": {0: {"step": torch.tensor(float(step))}}}, "step": step}


def main() -> None:
    root = sys.argv[1]
    concurrency = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    fmt = sys.argv[3] if len(sys.argv) > 3 else "torch"
    device = sys.argv[4] if len(sys.argv) > 4 else "cpu"
    strategy = sys.argv[5] if len(sys.argv) > 5 else "c"
    ck = fastckpt.Checkpointer(root, concurrency=concurrency, chunk_mb=1, keep=2, format=fmt, strategy=strategy)
    latest = ck.latest()
    step = latest.step + 1 if latest else 1
    say("ready")
    pending = []
    while True:
        pending.append(ck.save(state_for(step, device), step=step))
        step += 1
        while pending and (len(pending) >= concurrency or pending[0].done()):
            info = pending.pop(0).wait()
            say(f"committed {info.step}")


if __name__ == "__main__":
    main()

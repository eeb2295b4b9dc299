"""One process of the named-tiers kill campaign (tests/fastckpt/tiers/test_named_tiers_campaign.py).

Usage: named_tiers_worker.py MEMORY DIR
  Resumes DIR/last.ckpt through NamedCheckpoints.by_path({"tiers": [MEMORY]}) (its memory copy or the file),
  checks it bit-exact against its step's state and prints "resumed STEP WHERE" ("resumed 0 none"
  when neither holds it); then saves step after step, as Lightning's ModelCheckpoint with
  save_last does: DIR/step-N.ckpt, then DIR/last.ckpt, removing step-(N-2).ckpt; prints
  "committed N" once last.ckpt's save of N is committed (in memory), until it is killed.
"""
import os
import sys

import torch

from fastckpt.named import NamedCheckpoints
from one_line import say  # noqa: E402


def state_for(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(256, 1024, generator=g), "b": torch.randn(77, generator=g), "step": step}


def main() -> None:
    memory, folder = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    os.makedirs(folder, exist_ok=True)
    named = NamedCheckpoints.by_path({"concurrency": 2, "tiers": [memory], "tier_keep": [3]})
    last = os.path.join(folder, "last.ckpt")
    try:
        got = named.load(last)
    except FileNotFoundError:
        step, where = 0, "none"
    else:
        step, where = got["step"], named.reads[-1].tier
        want = state_for(step)
        assert all(torch.equal(got[k], want[k]) for k in ("w", "b")), f"step {step} from {where} differs"
    say(f"resumed {step} {where}")
    while True:
        step += 1
        state = state_for(step)
        named.save(state, os.path.join(folder, f"step-{step}.ckpt"), step)
        pending = named.save(state, last, step)
        if step > 2:
            named.remove(os.path.join(folder, f"step-{step - 2}.ckpt"))
        pending.wait()
        say(f"committed {step}")


if __name__ == "__main__":
    main()

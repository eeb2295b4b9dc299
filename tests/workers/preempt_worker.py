"""One rank of the preemption tests (2 gloo ranks). Usage: preempt_worker.py MEMORY DISK EVERY MB
[PERSIST_EVERY [GATE]] (env: RANK, WORLD_SIZE, MASTER_*).

A training loop with a Checkpointer (tiers=[MEMORY, DISK], preempt_signal=SIGTERM,
preempt_grace_s=20): each step's state is derived from the step (tests/workers: state_for), saved
every EVERY steps (about MB MiB per rank), and Checkpointer.at_step_end(step, state) is called
after every step; PERSIST_EVERY (default 1): the Checkpointer's persist_every; GATE: after its
first save a rank waits until the file GATE exists (the test makes it once it signalled: the
signal lands as that save is issued, on a loaded machine too). Prints "saving STEP" as a save is issued and "step STEP" once a step ended.
It never stops by itself: SIGTERM ends it."""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import fastckpt


def state_for(rank: int, step: int, mb: int) -> dict:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return {"w": torch.randn(mb, 256 * 1024, generator=g), "rank": rank, "step": step}


def main() -> None:
    memory, disk, every, mb = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    persist_every = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    gate = sys.argv[6] if len(sys.argv) > 6 else None
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ck = fastckpt.Checkpointer(tiers=[memory, disk], concurrency=2, chunk_mb=4, tier_keep=[2, 3],
                               preempt_signal=signal.SIGTERM, preempt_grace_s=20, commit_timeout_s=30,
                               persist_every=persist_every)
    step = 0
    while True:
        step += 1
        state = state_for(rank, step, mb)
        if step % every == 0:
            ck.save(state, step)
            print(f"saving {step}", flush=True)
            while gate is not None and not os.path.exists(gate):  # the test signals, then makes it:
                time.sleep(0.01)  # the signal is surely noted before this step ends
            gate = None
            ck.gate()
        time.sleep(0.01)
        print(f"step {step}", flush=True)
        ck.at_step_end(step, state)


if __name__ == "__main__":
    main()

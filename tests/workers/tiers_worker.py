"""One rank of the tiers campaign (2 gloo ranks). Usage: tiers_worker.py MEMORY DISK [IDLE
[PERSIST_EVERY]] (env: RANK, WORLD_SIZE, MASTER_*; PERSIST_EVERY: the Checkpointer's, default 1).

Resumes from the newest step every rank can get (a Checkpointer with tiers=[MEMORY, DISK] and
replicas=1), prints "resumed STEP TIERS EXACT WARNED" (TIERS: where its part was read from,
comma-joined, a partner's replica as "replica_of_rank_P";
EXACT: 1 when the state equals what that step saved, bit for bit; WARNED: warnings the load gave),
or "resumed 0 - 1 0" when there is nothing; then "ready", then saves a step at a time forever,
printing "committed STEP" once a save is committed (on the memory tier). IDLE=N: after N saves,
waits until every one is durable on the disk too (wait()), prints "idle HELD" (HELD: 1 when its
partner's part in the newest checkpoint was received straight into a held mapping of its file)
and sleeps."""
import os
import time
import sys
import warnings

import torch
import torch.distributed as dist

import fastckpt
from fastckpt import _native
from one_line import say  # noqa: E402


def state_for(rank: int, step: int) -> dict:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return {"w": torch.randn(256, 1024, generator=g), "rank": rank, "step": step}


def held_replica(ck, ward: int) -> int:
    """1 when the ward's replica in the newest checkpoint of this rank's memory tier lies in a
    mapping this process holds (received straight into its file: the native memory_maps.h)."""
    newest = ck.store.tiers[0].committed()[0]
    entry = newest.entry_for(ward)
    at = _native.find_memory_map(os.path.join(newest.path, entry.name), entry.bytes)
    if at:
        _native.give_back_memory_map(at)
    return int(at != 0)


def main() -> None:
    memory, disk = sys.argv[1], sys.argv[2]
    idle = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    persist_every = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ck = fastckpt.Checkpointer(tiers=[memory, disk], concurrency=2, chunk_mb=1, tier_keep=[2, 2], replicas=1,
                               commit_timeout_s=30, persist_every=persist_every)
    step = 0
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            loaded = ck.load_with_record()
        except fastckpt.NoCheckpointError:
            loaded = None
    if loaded is None:
        say("resumed 0 - 1 0")
    else:
        step = loaded.info.step
        want = state_for(rank, step)
        exact = torch.equal(loaded.state["w"], want["w"]) and loaded.state["step"] == step
        tiers = ",".join(sorted({r.tier.replace(" ", "_") for r in ck.store.reads}))
        say(f"resumed {step} {tiers} {int(exact)} {len(said)}")
        for w in said:
            say(f"warned {w.message}")
    say("ready")
    pending, saves = [], 0
    while True:
        if idle and saves == idle:
            ck.wait()
            say(f"committed {step}")
            say(f"idle {held_replica(ck, 1 - rank)}")
            time.sleep(3600)
        step, saves = step + 1, saves + 1
        pending.append(ck.save(state_for(rank, step), step=step))
        ck.gate()
        while pending and (len(pending) >= 2 or pending[0].done()):
            say(f"committed {pending.pop(0).wait().step}")


if __name__ == "__main__":
    main()

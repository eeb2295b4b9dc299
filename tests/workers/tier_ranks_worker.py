"""One rank of the tier tests on 2 gloo ranks (tests/fastckpt/tiers/test_tier_ranks.py). Usage:
tier_ranks_worker.py MODE MEMORY DISK (env: RANK, WORLD_SIZE, MASTER_*). Prints one line
`result JSON` at the end; every mode saves states derived from (rank, step) (state_for).

  retention  two Checkpointers one after the other, each 7 saves (waited for): tiers [MEMORY/a,
             DISK/a] with tier_keep [2, 3] and replicas=1, every save persisted; then [MEMORY/b,
             DISK/b], tier_keep [2, 3], persist_every=3. The result: per run, the number of step
             folders in this rank's memory-tier folder after each save landed, and at the end the
             steps committed there, its step folders, and the disk's steps.
  bound      replicas=1, tier_keep [1, 2], concurrency 1, both ranks on one node (one memory tier
             shared): 4 saves of 4 MiB each; the result: the warnings, the tier saves go to
             (`first`), the steps committed on the memory tier, the failed count and the steps on
             the disk.
  flip       replicas=1 (FASTCKPT_NODE tells the ranks apart): 3 saves; on rank 1, one byte of
             what rank 0 sends it at the commit of step 2 is flipped as it arrives (after the real
             exchange: a fault TCP never gives, so it is made here). The result: the warnings, the
             wards whose replicas this rank keeps per step (kept()), and whether rank 0's replica
             file of step 2 is still there; then rank 0's memory-tier folder is removed and a new
             Checkpointer loads: where each rank's part came from, and whether it is exact.
"""
import json
import os
import shutil
import sys
import time
import warnings

import torch
import torch.distributed as dist

import fastckpt
from fastckpt.commit.agreement import DistAgreement


def state_for(rank: int, step: int, mb: float = 1) -> dict:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return {"w": torch.randn(int(mb * 256 * 1024), generator=g), "rank": rank, "step": step}


def steps_in(store) -> list[int]:
    return sorted(i.step for i in store.committed())


def step_folders(folder: str) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.startswith("step-")) if os.path.isdir(folder) else []


def settled(count, want: int, within_s: float = 10.0) -> int:
    """count() once it is at most want, or what it is after within_s."""
    end = time.monotonic() + within_s
    while count() > want and time.monotonic() < end:
        time.sleep(0.02)
    return count()


def retention(memory: str, disk: str, rank: int) -> dict:
    out = {}
    for run, extra in (("a", {"replicas": 1}), ("b", {"persist_every": 3})):
        ck = fastckpt.Checkpointer(tiers=[os.path.join(memory, run), os.path.join(disk, run)], tier_keep=[2, 3],
                                   concurrency=2, chunk_mb=1, commit_timeout_s=60, **extra)
        own, held = ck.store.tiers[0], []
        for step in range(1, 8):
            ck.save(state_for(rank, step), step).wait()
            ck.wait()  # committed and persisted; retention may still run on the commit thread (it
            held.append(settled(lambda: len(step_folders(own.root)), min(step, 2)))  # never delays a commit)
        ck.close()
        dist.barrier()  # the shared disk is rank 0's to prune: read once its close() is done too
        out[run] = {"memory": steps_in(own), "folders": step_folders(own.root), "held": held,
                    "disk": steps_in(ck.store.tiers[-1])}
    return out


def bound(memory: str, disk: str, rank: int) -> dict:
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ck = fastckpt.Checkpointer(tiers=[memory, disk], tier_keep=[1, 2], replicas=1, concurrency=1, chunk_mb=1,
                                   commit_timeout_s=60)
        in_memory = []
        for step in range(1, 5):
            ck.save(state_for(rank, step, mb=4), step).wait()
            if memory in ck.store.holding().get(step, []):
                in_memory.append(step)
            ck.wait()
        first, failed = ck.store.first, ck.stats["failed"] + ck.stats["persist_failed"]
        ck.close()
    exact = all(torch.equal(fastckpt.Checkpointer(disk, distributed=False).load(step=s, rank=rank)["w"],
                            state_for(rank, s, mb=4)["w"]) for s in (3, 4))
    return {"warnings": [str(w.message) for w in said], "first": first, "failed": failed, "in_memory": in_memory,
            "disk": steps_in(fastckpt.Checkpointer(disk, distributed=False).store), "exact": exact}


def flip_on_arrival(at_step_of: dict) -> None:
    """Rank 1: the bytes rank 0 sends at the commit of the save numbered at_step_of["flip"] arrive
    with one byte flipped (each later background exchange counts one save)."""
    real = DistAgreement.exchange

    def exchange(self, sends, recvs, background=False):
        real(self, sends, recvs, background)
        if background and recvs:
            at_step_of["seen"] += 1
            if at_step_of["seen"] == at_step_of["flip"]:
                for buf, _ in recvs:
                    buf[buf.numel() // 2] ^= 0x5A
    DistAgreement.exchange = exchange


def flip(memory: str, disk: str, rank: int) -> dict:
    if rank == 1:
        flip_on_arrival({"seen": 0, "flip": 2})
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ck = fastckpt.Checkpointer(tiers=[memory, disk], tier_keep=[5, 5], replicas=1, concurrency=1, chunk_mb=1,
                                   commit_timeout_s=60)
        for step in (1, 2, 3):
            ck.save(state_for(rank, step), step).wait()
            ck.wait()  # persisted too (a copy waiting its turn would give way to a newer one)
        kept = {str(info.step): list(wards) for info, wards in ck.store._replicas.kept().values()}
        step2 = next(i for i in ck.store.tiers[0].committed() if i.step == 2)
        ward = 1 - rank
        replica_there = os.path.exists(os.path.join(step2.path, step2.entry_for(ward).name))
        committed = steps_in(ck.store.tiers[0])
        ck.close()
    out = {"warnings": [str(w.message) for w in said], "kept": kept, "replica_of_step_2_there": replica_there,
           "committed": committed}
    dist.barrier()
    if rank == 0:
        shutil.rmtree(os.path.join(memory, "rank-0"))
    dist.barrier()
    for step in (2, 1):  # step 2: rank 0's replica was refused (the disk); step 1: kept by rank 1
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            ck = fastckpt.Checkpointer(tiers=[memory, disk], tier_keep=[5, 5], replicas=1, commit_timeout_s=60)
            loaded = ck.load_with_record(step=step)
            out[f"load_{step}"] = {"from": sorted({r.tier for r in ck.store.reads}), "warnings": len(said),
                                   "exact": bool(torch.equal(loaded.state["w"], state_for(rank, step)["w"]))}
            ck.close()
    return out


def main() -> None:
    mode, memory, disk = sys.argv[1], sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result = {"retention": retention, "bound": bound, "flip": flip}[mode](memory, disk, rank)
    print("result " + json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

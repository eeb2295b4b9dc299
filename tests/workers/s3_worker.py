"""One rank of the 2-rank gloo tests of the S3 store. Usage: s3_worker.py MODE URL [FLAGS]
(env: RANK, WORLD_SIZE, MASTER_*, and the S3 server as AWS tools find one: AWS_ENDPOINT_URL, ...).

MODE: roundtrip (3 saves of ~12 MiB per rank, each a multipart upload; each rank loads its own),
outage (step 1 committed; once FLAGS/down exists — the test stopped the server, or made it refuse
one rank's writes — step 2, which must fail; once FLAGS/up exists, step 3, which must commit: what
each rank was told, and how long each wait took),
campaign (a job restarted after a kill -9 of the last: the newest committed checkpoint loaded and
compared bit for bit, one save committed, the unfinished uploads older than the bucket's newest
counted; then saves until killed; FLAGS: a memory tier in front of the bucket, drained to it,
replicas=1, FASTCKPT_NODE telling the ranks apart),
tiers (two "nodes", FASTCKPT_NODE apart, each rank's local tier its own folder FLAGS/node-R, the bucket
behind them, replicas=1: 3 saves, closed (each persisted); the steps in the bucket; then rank 1's node
wiped and a new job loads: where each part came from; then every node wiped and a new job loads again)."""
import os
import shutil
import sys
import time

import torch
import torch.distributed as dist

import fastckpt
from one_line import save_until_killed, say  # noqa: E402

MIB = 1 << 20


def state_for(rank: int, step: int, mib: int = 12) -> dict:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return {"w": torch.randn(mib * MIB // 4, generator=g), "rank": rank, "step": step}


def wait_for(path: str, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise SystemExit(f"{path} never appeared")
        time.sleep(0.05)


def outcome(ck) -> str:
    t = time.monotonic()
    try:
        ck.wait()
        return f"committed in {time.monotonic() - t:.1f} s"
    except fastckpt.CheckpointWriteError as e:
        return f"failed in {time.monotonic() - t:.1f} s ({str(e).splitlines()[0][:160]})"


def latest_everywhere(ck) -> list:
    steps = [None] * dist.get_world_size()
    info = ck.latest()
    dist.all_gather_object(steps, info.step if info is not None else None)
    return steps


def main() -> None:
    mode, url = sys.argv[1], sys.argv[2]
    flags = sys.argv[3] if len(sys.argv) > 3 else ""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if mode == "tiers":
        return tiers(url, flags, rank)
    if mode == "campaign" and flags:  # over a memory tier (FLAGS) drained to the bucket
        ck = fastckpt.Checkpointer(tiers=[flags, url], tier_keep=[1, 2], replicas=1, concurrency=2, chunk_mb=5,
                                   commit_timeout_s=60, stall_timeout_s=8)
    else:
        ck = fastckpt.Checkpointer(url, concurrency=2, chunk_mb=5, keep=2, commit_timeout_s=60, stall_timeout_s=8)
    bucket = ck.store.tiers[-1] if hasattr(ck.store, "tiers") else ck.store
    if mode == "roundtrip":
        for step in range(1, 4):
            ck.save(state_for(rank, step), step=step)
        ck.wait()
        assert latest_everywhere(ck) == [3, 3]
        out = ck.load()
        assert torch.equal(out["w"], state_for(rank, 3)["w"]) and out["rank"] == rank
        assert ck.load(step=2)["step"] == 2
        say(f"rank {rank} OK {ck.latest().step} {len(ck.store.committed())}")
    elif mode == "outage":
        ck.save(state_for(rank, 1, 6), step=1)
        say(f"rank {rank} step 1 {outcome(ck)}")
        wait_for(os.path.join(flags, "down"))
        ck.save(state_for(rank, 2, 6), step=2)
        say(f"rank {rank} step 2 {outcome(ck)}")
        wait_for(os.path.join(flags, "up"))
        ck.save(state_for(rank, 3, 6), step=3)
        say(f"rank {rank} step 3 {outcome(ck)} | latest on each rank {latest_everywhere(ck)}")
    elif mode == "campaign":
        problems: list = []
        newest = ck.store.committed(problems)  # this rank's view (with tiers: its own memory tier's too)
        info = newest[0] if newest else None
        agreed = 0
        if info is not None:
            out = ck.load()  # the newest every rank can get: the same step on every rank
            agreed = out["step"]
            exact = torch.equal(out["w"], state_for(rank, agreed, 11)["w"])
        say(f"resumed {agreed} {int(info is None or exact)} {len(problems)}")
        step = agreed + 1
        ck.save(state_for(rank, step, 11), step=step).wait()
        ck.wait()  # with tiers: drained to the bucket too
        counter = bucket.committed()[0].counter
        prefix = bucket.where.key("")
        older = [u for u in bucket.bucket.uploads(prefix)
                 if int(u.key[len(prefix):].split("/")[0].rsplit(".c", 1)[1]) < counter]
        say(f"orphans {len(older)}")
        say("ready")
        save_until_killed(ck, lambda step: state_for(rank, step, 11), step + 1)
    ck.close()
    dist.destroy_process_group()


def tiers(url: str, nodes: str, rank: int) -> None:
    """Mode tiers (see the module docstring): each rank's node folder, the bucket behind."""
    local = os.path.join(nodes, f"node-{rank}")

    def opened():
        return fastckpt.Checkpointer(tiers=[local, url], tier_keep=[2, 2], replicas=1, chunk_mb=5,
                                     commit_timeout_s=60, stall_timeout_s=8)
    ck = opened()
    for step in range(1, 4):
        ck.save(state_for(rank, step), step=step).wait()
    ck.close()
    dist.barrier()  # rank 0's retention of the bucket done (it alone prunes the shared last tier)
    say(f"rank {rank} in the bucket {sorted(i.step for i in ck.store.tiers[-1].committed())}")
    for wiped in ("node-1", "every node"):
        dist.barrier()
        if wiped == "every node" or rank == 1:
            shutil.rmtree(local)
        dist.barrier()
        ck = opened()
        out = ck.load()
        exact = out["step"] == 3 and torch.equal(out["w"], state_for(rank, 3)["w"])
        say(f"rank {rank} after {wiped} wiped: step {out['step']} exact {exact} from {ck.store.read_from(ck.latest(), rank)}")
        ck.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

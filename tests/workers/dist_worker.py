"""One rank of the 2-rank gloo tests. Usage: dist_worker.py MODE ROOT [STORE] (env: RANK, WORLD_SIZE, MASTER_*).

MODE: roundtrip (5 saves, each rank loads its own), loop (saves until killed), one-fails (step 1
committed, then step 2, whose file on a rank run under the EIO shim fails: what each rank was told).

STORE: root (default) or pmem (ROOT is then a pool both ranks share, one model per rank)."""
import sys

import torch
import torch.distributed as dist

import fastckpt
from one_line import save_until_killed, say  # noqa: E402


def state_for(rank: int, step: int) -> dict:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return {"w": torch.randn(128, 512, generator=g), "rank": rank, "step": step}


def main() -> None:
    mode, root = sys.argv[1], sys.argv[2]
    store = sys.argv[3] if len(sys.argv) > 3 else "root"
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pool = {"store": "pmem", "pool_mb": 64} if store == "pmem" else {}
    ck = fastckpt.Checkpointer(root, concurrency=2, chunk_mb=1, keep=3, commit_timeout_s=20, **pool)
    if mode == "roundtrip":
        for step in range(1, 6):
            ck.save(state_for(rank, step), step=step)
        ck.wait()
        info = ck.latest()
        steps = [None, None]
        dist.all_gather_object(steps, info.step)
        assert steps == [5, 5], steps
        out = ck.load()
        assert torch.equal(out["w"], state_for(rank, 5)["w"]) and out["rank"] == rank
        assert ck.load(step=4)["step"] == 4
        assert info.world_size == 2 and len(info.files) == 2
        print(f"rank {rank} OK {info.step}", flush=True)
    elif mode == "one-fails":  # rank 1's file of step 2 fails to write (its process runs under the EIO shim)
        ck.save(state_for(rank, 1), step=1)
        ck.wait()
        ck.save(state_for(rank, 2), step=2)
        try:
            ck.wait()
            outcome = "committed"
        except fastckpt.CheckpointWriteError as e:
            outcome = f"failed ({str(e).splitlines()[0][:100]})"
        steps = [None, None]
        dist.all_gather_object(steps, ck.latest().step)
        print(f"rank {rank} {outcome} | latest on each rank {steps}", flush=True)
    elif mode == "loop":
        say("ready")
        save_until_killed(ck, lambda step: state_for(rank, step), 1)
    ck.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

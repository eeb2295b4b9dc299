"""One rank of benchmarks/tiers.py (2 gloo ranks, env RANK, WORLD_SIZE, MASTER_*), started fresh as a
restarted job would be.

  tiers_child.py save MEMORY DISK MB       one checkpoint of MB MiB per rank (tiers + replica),
                                           durable on both tiers, then "saved" and sleeps (killed)
  tiers_child.py resume MEMORY DISK MB     load the newest step, one training step: "resumed
                                           LOAD_S WHERE" (WHERE: where this rank's part came from)
  tiers_child.py preempt MEMORY DISK MB    train (a step every 50 ms, a save every 10) with
                                           preempt_signal=SIGTERM until a SIGTERM ends it
  tiers_child.py train MEMORY DISK MB CONTENDER STEPS EVERY
                                           STEPS steps of a fixed compute, a save every EVERY steps
                                           through CONTENDER (none | disk | tiers | "tiers,
                                           persist_every=4" | tiers+replica):
                                           "steps T0 T1 ..." (each step's seconds), "final_wait S"
"""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import fastckpt


def state_for(rank: int, mb: int) -> dict:
    g = torch.Generator().manual_seed(rank)
    return {"w": torch.randn(mb, 256 * 1024, generator=g), "rank": rank}


def fixed_step(a: torch.Tensor) -> torch.Tensor:
    """The step's compute (about 40 ms on one thread here)."""
    for _ in range(12):
        a = torch.tanh(a @ a * 0.01)
    return a


def checkpointer(memory, disk, replicas=1, **kw):
    return fastckpt.Checkpointer(tiers=[memory, disk], tier_keep=[1, 1], replicas=replicas, concurrency=2,
                                 commit_timeout_s=120, **kw)


def main() -> None:
    mode, memory, disk, mb = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if mode == "save":
        ck = checkpointer(memory, disk)
        ck.save(state_for(rank, mb), step=1)
        ck.wait()
        print("saved", flush=True)
        time.sleep(3600)
    elif mode == "resume":
        ck = checkpointer(memory, disk)
        t0 = time.perf_counter()
        loaded = ck.load_with_record()
        load_s = time.perf_counter() - t0
        assert torch.equal(loaded.state["w"], state_for(rank, mb)["w"])
        (loaded.state["w"][:1024] * 2).sum()  # the first training step touches the state
        where = sorted({r.tier for r in ck.store.reads})
        print(f"resumed {load_s:.4f} {','.join(w.replace(' ', '_') for w in where)}", flush=True)
        ck.close()
    elif mode == "preempt":
        ck = checkpointer(memory, disk, preempt_signal=signal.SIGTERM, preempt_grace_s=120)
        state, step = state_for(rank, mb), 0
        print("ready", flush=True)
        while True:
            step += 1
            state["w"][0, 0] = step
            time.sleep(0.05)
            if step % 10 == 0:
                ck.save(state, step=step)
                ck.gate()
            print(f"step {step}", flush=True)
            ck.at_step_end(step, state)
    elif mode == "train":
        contender, steps, every = sys.argv[5], int(sys.argv[6]), int(sys.argv[7])
        ck = {"none": lambda: None, "disk": lambda: fastckpt.Checkpointer(disk, keep=1, concurrency=2),
              "tiers": lambda: checkpointer(memory, disk, replicas=0),
              "tiers, persist_every=4": lambda: checkpointer(memory, disk, replicas=0, persist_every=4),
              "tiers+replica": lambda: checkpointer(memory, disk)}[contender]()
        state = state_for(rank, mb)
        a = torch.randn(512, 512)
        times = []
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            a = fixed_step(a)
            state["w"][0, 0] = step
            dist.barrier()  # ranks in step, as a gradient all-reduce keeps them
            if ck is not None and step % every == 0:
                ck.save(state, step=step)
                ck.gate()
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        if ck is not None:
            ck.close()
        print("steps " + " ".join(f"{t:.5f}" for t in times), flush=True)
        print(f"final_wait {time.perf_counter() - t0:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()

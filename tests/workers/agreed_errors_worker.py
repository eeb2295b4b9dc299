"""One of 2 gloo ranks for tests/fastckpt/test_agreed_errors.py: a checkpoint whose write fails on
rank 0 alone (the test's fault shim), while rank HOLD_RANK's thread records the outcome HOLD_S
seconds late. Usage: agreed_errors_worker.py MODE ROOT OUT (env: RANK, WORLD_SIZE, MASTER_*).

  checkpointer  a Checkpointer over ROOT (every rank saves its part): steps 1, 2, 3, each once the
                one before landed on this rank, unless it is HOLD_RANK, whose commit thread
                records a failure late
  dcp           FastStorageWriter: dcp.save of ROOT/step-1, step-2 and step-3; the thread of
                HOLD_RANK that waits for its file to be durable takes HOLD_S longer on step 2
  steps         a Checkpointer over ROOT whose ranks are given different steps at one save
OUT.RANK: the step whose call raised on this rank, its error, how long that call took, and any
error of the close that follows.
"""
import os
import sys
import time

import torch
import torch.distributed as dist

import fastckpt
from one_line import raised

RANK = None


def state_for(rank: int, step: int) -> dict:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return {"w": torch.randn(64, 1024, generator=g), "step": step}


def hold_failures_here(module, owner: str, method: str) -> None:
    """On HOLD_RANK: owner.method (a commit thread's record of an outcome) takes HOLD_S seconds
    longer when it records a failure."""
    if RANK != int(os.environ.get("HOLD_RANK", "-1")):
        return
    cls = getattr(module, owner)
    real = getattr(cls, method)

    def held(self, *args, **kwargs):
        if any(isinstance(a, BaseException) for a in args):
            time.sleep(float(os.environ["HOLD_S"]))
        return real(self, *args, **kwargs)
    setattr(cls, method, held)


def checkpointer(root: str, out: dict) -> None:
    from fastckpt.commit import agreed_errors
    hold_failures_here(agreed_errors, "AgreedErrors", "landed")
    ck = fastckpt.Checkpointer(root, concurrency=2, chunk_mb=1, commit_timeout_s=60, stall_timeout_s=60)
    held = RANK == int(os.environ.get("HOLD_RANK", "-1"))
    for step in (1, 2, 3):
        while ck.in_flight() and not held:  # the checkpoint before landed here (a failure recorded first);
            time.sleep(0.01)  # on the held rank it lands late
        if raised(out, step, lambda: ck.save(state_for(RANK, step), step)):
            break
    try:
        ck.close()
    except Exception as e:  # noqa: BLE001
        out["close_error"] = f"{type(e).__name__}: {e}"


def steps(root: str, out: dict) -> None:
    """Step 1 on both ranks; then rank 0 saves step 2 while rank 1 saves step 3 (raised on both, at
    that call: nothing written); then step 4 on both."""
    with fastckpt.Checkpointer(root, chunk_mb=1, commit_timeout_s=60, stall_timeout_s=60) as ck:
        ck.save(state_for(RANK, 1), 1).wait()
        raised(out, 2, lambda: ck.save(state_for(RANK, 2 + RANK), 2 + RANK))
        ck.save(state_for(RANK, 4), 4).wait()


def dcp(root: str, out: dict) -> None:
    import torch.distributed.checkpoint as dcp_api

    from fastckpt.dcp import FastStorageWriter
    from fastckpt.dcp import writer as writer_module
    if RANK == int(os.environ.get("HOLD_RANK", "-1")):  # its wait for step 2's file to be durable, late
        real = writer_module.FastStorageWriter._begin_file

        def begin(self, plan, planner, name, path):
            landed, pending = real(self, plan, planner, name, path)
            if "step-2" not in path:
                return landed, pending

            def late():
                time.sleep(float(os.environ["HOLD_S"]))
                return landed()
            return late, pending
        writer_module.FastStorageWriter._begin_file = begin
    writer = FastStorageWriter(os.path.join(root, "step-1"), chunk_mb=1, commit_timeout_s=60)
    for step in (1, 2, 3):
        if raised(out, step, lambda: dcp_api.save(state_for(RANK, step), checkpoint_id=os.path.join(root, f"step-{step}"),
                                                  storage_writer=writer)):
            break
    try:
        writer.close()
    except Exception as e:  # noqa: BLE001
        out["close_error"] = f"{type(e).__name__}: {e}"


def main() -> None:
    global RANK
    mode, root, out_path = sys.argv[1], sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo")
    RANK = dist.get_rank()
    out = {"raised_at": None}
    {"checkpointer": checkpointer, "dcp": dcp, "steps": steps}[mode](root, out)
    torch.save(out, f"{out_path}.{RANK}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

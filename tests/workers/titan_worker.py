"""One rank of the torchtitan tests: torchtitan's own checkpoint manager, optimizers container and
LR schedulers over a tiny model under fully_shard (FSDP2) on gloo ranks (CPU), trained as
torchtitan's Trainer trains (load, then per step: maybe_wait_for_staging, optimizers.step,
lr_schedulers.step, save), one checkpoint per step.

Usage: titan_worker.py MANAGER MODE CKPT OUT STEPS   (env: RANK, WORLD_SIZE, MASTER_*)
  MANAGER  fast: torchtitan_fastckpt.CheckpointManager; stock: torchtitan's CheckpointManager;
           none: checkpointing off (the uninterrupted reference)
  MODE     torchtitan's checkpoint.async_mode (disabled, async, async_with_pinned_mem)
  Loads the newest checkpoint of CKPT (the manager's load(), as the Trainer does), prints
  "loaded N" and keeps the state in OUT/loaded.pt; then trains up to step STEPS, keeping each
  step's full state in OUT/state-N.pt (rank 0) and printing "saved N" after each save call.
  env KILL_IN_COMMIT=N: rank 0 kills itself with SIGKILL as step N's commit record is about to
  be written (fastckpt's DCP commit, after every rank's file and .metadata are durable).
  After the manager's close(), rank 0 prints the names of the fastckpt threads still alive.
  env HOLD_FIRST_COMMIT=1: step 1's commit waits (at most 120 s) until OUT/release exists; after
  step 2's save call the worker prints "in flight N" (saves not yet done) and creates it.
  env TIERS=MEMORY (fast): a memory tier in front of CKPT (the Config's tiers); after the load rank 0
  prints "read WHERE,..." (where the files it read came from).
One thread per process: every run computes each step with the same arithmetic.
"""
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

torch.set_num_threads(1)
TOTAL = 8  # the LR schedule's length, the same in every run


class TrainState:
    """What torchtitan's Trainer saves of itself (its `train_state`)."""

    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, sd):
        self.step = int(sd["step"])


def full_state(model, optimizers, train_state) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    m, o = get_state_dict(model, optimizers.optimizers,
                          options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    state = torch.utils._pytree.tree_map_only(torch.Tensor, torch.clone, {"model": m, "optim": o})
    state["lr"] = [g["lr"] for opt in optimizers.optimizers for g in opt.param_groups]
    state["step"] = train_state.step
    return state


def keep(state: dict, path: str) -> None:
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def kill_in_commit(step: int) -> None:
    import fastckpt.dcp.writer as writer
    commit_gathered = writer.commit_gathered

    def killing(directory, part, at_step, *args, **kwargs):
        if at_step == step:
            part()  # .metadata durable, the record not yet written
            print(f"killing in commit {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return commit_gathered(directory, part, at_step, *args, **kwargs)

    writer.commit_gathered = killing


def hold_first_commit(release: str) -> None:
    import fastckpt.dcp.writer as writer
    commit_gathered = writer.commit_gathered

    def holding(directory, part, at_step, *args, **kwargs):
        if at_step == 1:
            deadline = time.monotonic() + 120
            while not os.path.exists(release) and time.monotonic() < deadline:
                time.sleep(0.01)
        return commit_gathered(directory, part, at_step, *args, **kwargs)

    writer.commit_gathered = holding


def main() -> None:
    manager, mode, ckpt, out, steps = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    dist.init_process_group("gloo")
    from torch.distributed.device_mesh import init_device_mesh
    from fsdp2_worker import build  # the FSDP2 tests' model (tests/workers/ is on the path)
    from torchtitan.components.checkpointer import CheckpointManager as Stock
    from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer
    from torchtitan.components.optimizer.optimizer import OptimizersContainer, ParamGroupConfig

    rank = dist.get_rank()
    if os.environ.get("KILL_IN_COMMIT") and rank == 0:
        kill_in_commit(int(os.environ["KILL_IN_COMMIT"]))
    release = os.path.join(out, "release")
    if os.environ.get("HOLD_FIRST_COMMIT") and rank == 0:
        hold_first_commit(release)
    model, _ = build(init_device_mesh("cpu", (dist.get_world_size(),)))  # its own optimizer unused
    optimizers = OptimizersContainer.Config(
        param_groups=[ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-2})],
        implementation="for-loop").build(model_parts=[model])
    lr_schedulers = LRSchedulersContainer.Config(warmup_steps=2).build(optimizers=optimizers, training_steps=TOTAL)
    train_state = TrainState()
    kind = Stock
    if manager == "fast":  # the torchtitan lines of docs/dcp.md
        from torchtitan_fastckpt import CheckpointManager  # torchtitan's own, through fastckpt.dcp
        config = CheckpointManager.Config(enable=True, folder=ckpt, interval=1, async_mode=mode, concurrency=2,
                                          keep_latest_k=3, last_save_model_only=False)
        if os.environ.get("TIERS"):  # the tiers line of docs/tiers.md
            config = CheckpointManager.Config(enable=True, folder=ckpt, interval=1, async_mode=mode, concurrency=2,
                                              keep_latest_k=3, last_save_model_only=False, tiers=[os.environ["TIERS"]])
        kind = CheckpointManager
    else:  # torchtitan's own manager, or checkpointing off
        config = Stock.Config(enable=manager == "stock", folder=ckpt, interval=1, async_mode=mode, keep_latest_k=3,
                              last_save_model_only=False)
    checkpointer = config.build(dataloader=None, model_parts=[model], optimizers=optimizers,
                                lr_schedulers=lr_schedulers, states={"train_state": train_state}, sd_adapter=None,
                                base_folder="")
    assert type(checkpointer) is kind, type(checkpointer)  # torchtitan's build() made the Config's own class
    checkpointer.load(step=-1)
    loaded = full_state(model, optimizers, train_state)
    if rank == 0:
        keep(loaded, os.path.join(out, "loaded.pt"))
        print(f"loaded {train_state.step}", flush=True)
        if os.environ.get("TIERS"):
            print(f"read {','.join(sorted({where for where, _ in checkpointer.reads})) or 'nothing'}", flush=True)
    for step in range(train_state.step + 1, steps + 1):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(32, 16, generator=g), torch.randn(32, 4, generator=g)
        torch.nn.functional.mse_loss(model(x), y).backward()
        checkpointer.maybe_wait_for_staging()
        optimizers.step()
        lr_schedulers.step()
        optimizers.zero_grad()
        train_state.step = step
        state = full_state(model, optimizers, train_state)
        if rank == 0:
            keep(state, os.path.join(out, f"state-{step}.pt"))
        checkpointer.save(step, last_step=step == TOTAL)
        if rank == 0:
            print(f"saved {step}", flush=True)
        if step == 2 and os.environ.get("HOLD_FIRST_COMMIT") and rank == 0:
            print(f"in flight {sum(not f.done() for _, f in checkpointer.in_flight)}", flush=True)
            open(release, "w").close()
    checkpointer.close()
    if rank == 0:
        left = sorted(t.name for t in threading.enumerate() if t.name.startswith("fastckpt"))
        print(f"closed, fastckpt threads left: {left}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

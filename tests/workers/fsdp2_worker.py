"""One rank of the FSDP2 tests: a tiny model under fully_shard on gloo ranks (CPU), checkpointed with
dcp.async_save through fastckpt's FastStorageWriter and FastStager — the FSDP2 lines of docs/dcp.md, run.

Usage: fsdp2_worker.py train CKPT STEPS [REF]   (env: RANK, WORLD_SIZE, MASTER_*)
         each step trains, then (REF given) rank 0 keeps the full state in REF/step-N.pt, then step
         N is saved with async_save into CKPT/step-N on its own gloo group, through FastStager
         (2 saves in flight: nothing waits for a save but, REF given, the last, staged with none in
         flight so it is handed on live; the next optimizer step waits only for the snapshot's
         copy); prints "committed N" once step N's save is done ("ready" after the first);
         STEP_PAUSE_S=T: T seconds' pause after each step (the arithmetic unchanged), for a kill to land in
       fsdp2_worker.py preempt CKPT REF
         trains until a SIGTERM ends it: an async save every 3 steps (FastStager, 2 in flight), rank 0
         keeping the full state in REF/step-N.pt, "step N" printed, then fastckpt.dcp.Preemption's
         at_step_end (a blocking dcp.save of the agreed step into CKPT/step-N, the saves in flight first)
       fsdp2_worker.py resume CKPT OUT
         loads the newest committed checkpoint of CKPT (fastckpt.dcp.newest_committed) into a
         fresh sharded model and optimizer on this world's ranks, keeps its full state in
         OUT/loaded.pt, trains the next step and keeps that in OUT/next.pt (rank 0); prints the step.
One thread per process: every run computes each step with the same arithmetic.
"""
import gc
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from one_line import say  # noqa: E402

torch.set_num_threads(1)


def build(mesh):
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 4))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model, optim, step: int) -> None:
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(32, 16, generator=g), torch.randn(32, 4, generator=g)
    torch.nn.functional.mse_loss(model(x), y).backward()
    optim.step()
    optim.zero_grad()


def full_state(model, optim) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    m, o = get_state_dict(model, optim, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    # copies: on one rank the full tensors are the live parameters and optimizer state themselves
    return torch.utils._pytree.tree_map_only(torch.Tensor, torch.clone, {"model": m, "optim": o})


def keep(state: dict, path: str) -> None:
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def report(saves: list, wait: bool) -> None:
    """Prints "committed N" for each save done, oldest first ("ready" after the first)."""
    while saves and (wait or saves[0][1].upload_completion.done()):
        step, saving = saves.pop(0)
        saving.upload_completion.result()
        say(f"committed {step}")
        if step == 1:
            say("ready")


def main() -> None:
    mode, ckpt = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from fastckpt.dcp import FastStager, FastStorageReader, FastStorageWriter, newest_committed, save_group
    rank = dist.get_rank()
    model, optim = build(init_device_mesh("cpu", (dist.get_world_size(),)))
    if mode == "train":
        steps, ref = int(sys.argv[3]), (sys.argv[4] if len(sys.argv) > 4 else None)
        ckpt_group = save_group()  # async saves talk on a gloo group of their own
        writer = FastStorageWriter(ckpt, chunk_mb=1)
        stager = FastStager(concurrency=2, writer=writer)  # snapshots staged or being written at once
        saves = []
        for step in range(1, steps + 1):
            train_step(model, optim, step)
            if ref is not None:
                full = full_state(model, optim)
                if rank == 0:
                    keep(full, os.path.join(ref, f"step-{step}.pt"))
            msd, osd = get_state_dict(model, optim)
            if step == steps and ref is not None:
                report(saves, wait=True)  # none in flight: the last save's snapshot is handed on live
                gc.collect()  # no snapshot of an earlier save left behind in a reference cycle
            saving = dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(ckpt, f"step-{step}"),
                                    storage_writer=writer, async_stager=stager, process_group=ckpt_group)
            saves.append((step, saving))
            report(saves, wait=False)
            time.sleep(float(os.environ.get("STEP_PAUSE_S", "0")))  # a pace a kill can land in
        report(saves, wait=True)
        stager.close()
        writer.close()
        print(f"stager {json.dumps(stager.stats)}", flush=True)
    elif mode == "preempt":
        import signal
        from fastckpt.dcp import Preemption
        ref = sys.argv[3]
        ckpt_group = save_group()
        writer = FastStorageWriter(ckpt, chunk_mb=1)
        stager = FastStager(concurrency=2, writer=writer)
        preemption = Preemption(signal.SIGTERM, grace_s=20)
        saves, step = [], 0

        def save_now(n: int) -> None:
            msd, osd = get_state_dict(model, optim)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(ckpt, f"step-{n}"),
                     storage_writer=FastStorageWriter(ckpt, chunk_mb=1))
        while True:
            step += 1
            train_step(model, optim, step)
            full = full_state(model, optim)
            if rank == 0:
                keep(full, os.path.join(ref, f"step-{step}.pt"))
            if step % 3 == 0:
                msd, osd = get_state_dict(model, optim)
                saves.append(dcp.async_save({"model": msd, "optim": osd},
                                            checkpoint_id=os.path.join(ckpt, f"step-{step}"), storage_writer=writer,
                                            async_stager=stager, process_group=ckpt_group))
            print(f"step {step}", flush=True)
            time.sleep(0.03)
            preemption.at_step_end(step, save_now, in_flight=[s.upload_completion for s in saves])
    elif mode == "resume":
        out = sys.argv[3]
        newest = newest_committed(ckpt)
        msd, osd = get_state_dict(model, optim)
        state = {"model": msd, "optim": osd}
        dcp.load(state, storage_reader=FastStorageReader(newest))
        set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
        step = newest.step
        loaded = full_state(model, optim)
        train_step(model, optim, step + 1)
        after = full_state(model, optim)
        if rank == 0:
            keep(loaded, os.path.join(out, "loaded.pt"))
            keep(after, os.path.join(out, "next.pt"))
        say(f"resumed {step}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Not through interpreter shutdown: a gloo worker thread may still be destroying the last
    # collective's work, whose tensors' Python objects it decrefs; taking the GIL while Python
    # finalizes makes CPython end that thread (pthread_exit) inside a noexcept C++ destructor,
    # and the process aborts ("terminate called without an active exception"; seen 4 times in
    # 124 FSDP2 resumes, the core's stack in ProcessGroupGloo::runLoop). What this program
    # produced is written (atomically) and printed before this point.
    sys.stdout.flush()
    os._exit(0)

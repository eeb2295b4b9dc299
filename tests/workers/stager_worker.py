"""One gloo rank of FastStager's agreement tests: a small model, trained and saved with dcp.async_save
through FastStorageWriter and FastStager on 2 ranks.

Usage: stager_worker.py skip CKPT   (env: RANK, WORLD_SIZE, MASTER_*)
         concurrency 1, policy 'skip': rank 1 keeps its first snapshot referenced, so its only slot
         stays taken; the next async_save raises SaveSkipped on *both* ranks ("skipped"); once rank 1
         lets go, the next save commits ("saved N").
       stager_worker.py wait CKPT
         as skip, with policy 'wait', stall_timeout_s 1 and commit_timeout_s 2: rank 1 waits for a
         slot in vain, nothing moving for 3 s;
         the save is refused on *both* ranks ("refused"), then the next one commits ("saved 3").
       stager_worker.py rounds CKPT
         policy 'wait', stall_timeout_s 1 and commit_timeout_s 1 (rounds of 2 s, the agreement's
         gloo timeout 4 s): rank 1's only slot stays taken for 7 s while its writer's saves move
         (its progress counter, read by the stager, grows); rank 0 has a slot at once. Both wait
         on round after round, past the agreement's timeout, and save once rank 1 lets go
         ("saved 2"), then the next save too ("saved 3").
       stager_worker.py fail CKPT
         rank 1's copy of the third save fails (an injected error: a stager not given the writer
         copies every snapshot whole at stage()); that save fails on both ranks, before DCP's
         collectives ("failed <error type>"), nothing of it is committed, and the next save
         commits ("saved N").
       stager_worker.py replicated CKPT
         one replicated tensor (a bias-free Linear under SGD without momentum): DCP plans it on one
         rank only, whose save is slowed (2 s before it begins). The other rank's save copies
         nothing of its snapshot, handed on live: its optimizer step goes on at once, before the
         save ends ("stepped before the save ended"), not once the whole save is over.
"""
import os
import sys
import threading

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

torch.set_num_threads(1)


def main() -> None:
    mode, ckpt = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    from fastckpt.dcp import FastStager, FastStorageWriter, SaveSkipped, staged
    from fastckpt.errors import CheckpointWriteError
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 32, bias=mode != "replicated")
    optim = torch.optim.Adam(model.parameters(), lr=1e-2) if mode != "replicated" else \
        torch.optim.SGD(model.parameters(), lr=1e-2)
    group = dist.new_group(backend="gloo")
    writer = FastStorageWriter(ckpt, chunk_mb=1)
    # 'fail': a stager not given the writer, so that it copies the optimizer's tensors itself
    # (one given its writer hands them to the writer's save, which copies them)
    waits = {"wait": dict(stall_timeout_s=1, commit_timeout_s=2), "rounds": dict(stall_timeout_s=1, commit_timeout_s=1)}
    stager = FastStager(concurrency=1, policy="skip" if mode == "skip" else "wait",
                        writer=writer if mode != "fail" else None, **waits.get(mode, {}))

    def step(n: int) -> None:
        model(torch.full((4, 32), float(n))).sum().backward()
        optim.step()
        optim.zero_grad()

    def save(n: int):
        state = {"model": model.state_dict(), "optim": optim.state_dict()}
        return dcp.async_save(state, checkpoint_id=os.path.join(ckpt, f"step-{n}"), storage_writer=writer,
                              async_stager=stager, process_group=group)

    if mode in ("skip", "wait"):
        step(1)
        held = stager.stage({"model": model.state_dict()})
        kept = held.result() if rank == 1 else None  # rank 1's only slot stays taken
        del held
        step(2)
        try:
            save(2)
            print("saved 2", flush=True)
        except SaveSkipped:
            print("skipped", flush=True)
        except CheckpointWriteError as e:
            print(f"refused: {e}", flush=True)
        del kept
        step(3)
        save(3).upload_completion.result()
        print("saved 3", flush=True)
    elif mode == "rounds":
        import itertools
        step(1)
        held = stager.stage({"model": model.state_dict()})
        kept = [held.result()] if rank == 1 else []  # rank 1's only slot stays taken for 7 s
        del held
        if rank == 1:
            moved = itertools.count()
            writer.progress = lambda: next(moved)  # an earlier save on a slow disk, still moving
            threading.Timer(7.0, kept.clear).start()
        step(2)
        save(2).upload_completion.result()
        print("saved 2", flush=True)
        step(3)
        save(3).upload_completion.result()
        print("saved 3", flush=True)
    elif mode == "fail":
        real = staged.copy_leaf
        fail = threading.Event()

        def failing_copy(src, buf):
            if fail.is_set() and rank == 1:
                raise RuntimeError("injected: this rank's copy failed")
            real(src, buf)

        staged.copy_leaf = failing_copy
        for n in (1, 2):
            step(n)
            save(n).upload_completion.result()
        step(3)
        fail.set()
        try:
            save(3).upload_completion.result()
            print("saved 3", flush=True)
        except BaseException as e:  # noqa: BLE001 - what each rank saw
            print(f"failed {type(e).__name__}: {e}", flush=True)
        fail.clear()
        step(4)
        save(4).upload_completion.result()
        print("saved 4", flush=True)
        print(f"stats {stager.stats}", flush=True)
    elif mode == "replicated":
        import time
        planned: list = []
        real_begin = FastStorageWriter._begin_file

        def begin(self, plan, planner, name, path):
            tensors = any(item.type.name != "BYTE_IO" for item in plan.items)
            planned.append(tensors)
            if tensors and len(planned) > 3:  # the save measured: the rank that writes the tensor is slow
                time.sleep(2)
            return real_begin(self, plan, planner, name, path)

        FastStorageWriter._begin_file = begin
        for n in (1, 2, 3):  # the run earns trust: the next snapshot is handed on live
            step(n)
            save(n).upload_completion.result()
        model(torch.full((4, 32), 4.0)).sum().backward()
        saving = save(4)
        optim.step()  # waits for this rank's own copy only
        ended = saving.upload_completion.done()
        saving.upload_completion.result()
        print(f"planned tensors {planned[-1]}; stepped {'after' if ended else 'before'} the save ended; "
              f"handed on {stager.stats['handed_on']}", flush=True)
    stager.close()
    writer.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # as fsdp2_worker.py: never through interpreter shutdown with gloo threads about

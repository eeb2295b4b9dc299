"""One rank of the DCP tests. Usage: dcp_worker.py MODE DIR (env: RANK, WORLD_SIZE, MASTER_*; with
WORLD_SIZE unset: one process, no process group).

save: the full state (full_state()) sharded over this world's ranks as DTensors (Shard(0) for
      matrices, Replicate for the rest), saved with dcp.save through FastStorageWriter.
load: a blank state sharded over this world's ranks (plain tensors without a process group),
      loaded with dcp.load through FastStorageReader (READER=stock: DCP's FileSystemReader);
      prints "rank R EQUAL" when every full tensor and value equals full_state()'s.
fill: one writer saves step 1, 2, ... into DIR/step-N (a 1 MiB matrix sharded over the ranks,
      its values the step's) until a save fails, at most 4; prints "rank R saved N" and then
      "rank R failed N: ERROR" (a full disk: every rank's save of N fails, none hangs).
group: an async_save through FastStager with no process_group (step 1), training's all-reduces
      running meanwhile on a group of their own; then one with process_group=save_group() (step 2),
      training's all-reduces running meanwhile on the default group. Training all-reduces until no
      rank's save is still uploading; "rank R saved N" once the save's upload completed, "rank R
      reduced N beside K" when every all-reduce summed right and K of them ran while a save was
      in flight.
load-step N: loads DIR/step-N (fill's state of step N) through FastStorageReader; "rank R EQUAL".
With TIERS=MEMORY, save and load go through that memory tier (FastStorageWriter / FastStorageReader
tiers=[MEMORY]); load then prints "rank R READ WHERE,..." (where each file came from).
"""
import glob
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp


def spooled() -> list[str]:
    """What this process's spools (fastckpt.store.s3.spool, named by its pid) hold but their spare
    files: each entry is the folder of an s3:// checkpoint a writer or reader has not let go of."""
    return [name for base in ("/dev/shm", tempfile.gettempdir())
            for folder in glob.glob(os.path.join(base, f"fastckpt-s3-{os.getpid()}-*"))
            for name in os.listdir(folder) if name != ".spare"]


def full_state() -> dict:
    g = torch.Generator().manual_seed(1234)
    return {"model": {"embed.weight": torch.randn(30, 16, generator=g),  # 30 rows: uneven on 4 ranks
                      "proj.weight": torch.randn(16, 16, generator=g).to(torch.bfloat16),
                      "proj.bias": torch.randn(16, generator=g)},
            "optim": {"step": 7, "lr": 0.01, "exp_avg": torch.randn(30, 16, generator=g)},
            "extra": {"name": "run-1", "counts": [1, 2, 3]}}


def filled(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(256, 1024, generator=g), "step": step}


def _sharded(state: dict, mesh, blank: bool) -> dict:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    out = {}
    for k, v in state.items():
        if isinstance(v, dict):
            out[k] = _sharded(v, mesh, blank)
        elif isinstance(v, torch.Tensor):
            t = torch.zeros_like(v) if blank else v
            if mesh is not None:
                t = distribute_tensor(t, mesh, [Shard(0)] if t.dim() == 2 else [Replicate()])
            out[k] = t
        else:
            out[k] = type(v)() if blank else v
    return out


def _equal(got: dict, want: dict, where: str = "") -> list[str]:
    bad = []
    for k, v in want.items():
        g = got[k]
        if isinstance(v, dict):
            bad += _equal(g, v, f"{where}{k}.")
        elif isinstance(v, torch.Tensor):
            g = g.full_tensor() if hasattr(g, "full_tensor") else g
            if g.dtype != v.dtype or not torch.equal(g, v):
                bad.append(where + k)
        elif g != v:
            bad.append(where + k)
    return bad


def main() -> None:
    mode, directory = sys.argv[1], sys.argv[2]
    mesh, rank = None, 0
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
        from torch.distributed.device_mesh import init_device_mesh
        mesh, rank = init_device_mesh("cpu", (dist.get_world_size(),)), dist.get_rank()
    from fastckpt.dcp import FastStorageReader, FastStorageWriter
    tiers = [os.environ["TIERS"]] if os.environ.get("TIERS") else None
    if mode == "save":
        writer = FastStorageWriter(directory, step=7, chunk_mb=1, tiers=tiers)
        dcp.save(_sharded(full_state(), mesh, blank=False), storage_writer=writer)
        writer.close()
        print(f"rank {rank} SAVED", flush=True)
    elif mode == "fill":
        writer = FastStorageWriter(directory, chunk_mb=1)
        for step in range(1, 5):
            try:
                dcp.save(_sharded(filled(step), mesh, blank=False), storage_writer=writer,
                         checkpoint_id=os.path.join(directory, f"step-{step}"))
            except BaseException as e:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
                why = {r: f"{type(x).__name__}: {x}"[:300] for r, x in getattr(e, "failures", {0: e}).items()}
                print(f"rank {rank} failed {step}: {type(e).__name__}: {why}", flush=True)
                break
            print(f"rank {rank} saved {step} spooled {len(spooled())}", flush=True)
        writer.close()
    elif mode == "group":
        from fastckpt.dcp import FastStager, save_group
        writer = FastStorageWriter(directory, chunk_mb=1)
        stager = FastStager(concurrency=2, writer=writer)
        training_group = dist.new_group(backend="gloo")  # every rank, in the same order
        for step, saves_on, trains_on in ((1, None, training_group), (2, save_group(), None)):
            state = _sharded(filled(step), mesh, blank=False)
            saving = dcp.async_save(state, checkpoint_id=os.path.join(directory, f"step-{step}"),
                                    storage_writer=writer, async_stager=stager, process_group=saves_on)
            right, beside = True, 0
            while True:  # training's collectives, as long as any rank's save is in flight
                busy = torch.tensor([0.0 if saving.upload_completion.done() else 1.0])
                dist.all_reduce(busy, group=trains_on)
                x = torch.full((4,), float(rank + 1))
                dist.all_reduce(x, group=trains_on)
                right = right and torch.equal(x, torch.full((4,), float(sum(range(1, dist.get_world_size() + 1)))))
                if busy.item() == 0:
                    break
                beside += 1
            saving.upload_completion.result()
            print(f"rank {rank} saved {step}", flush=True)
            if right:
                print(f"rank {rank} reduced {step} beside {beside}", flush=True)
        stager.close()
        writer.close()
    elif mode == "load-step":
        step = int(sys.argv[3])
        state = _sharded(filled(0), mesh, blank=True)
        dcp.load(state, storage_reader=FastStorageReader(os.path.join(directory, f"step-{step}")))
        bad = _equal(state, filled(step))
        print(f"rank {rank} EQUAL" if not bad else f"rank {rank} DIFFERS {bad}", flush=True)
    elif mode == "load":
        state = _sharded(full_state(), mesh, blank=True)
        reader = dcp.FileSystemReader(directory) if os.environ.get("READER") == "stock" else \
            FastStorageReader(directory, tiers=tiers)
        dcp.load(state, storage_reader=reader)
        if tiers:
            print(f"rank {rank} READ {','.join(sorted({where for where, _ in reader.reads}))}", flush=True)
        bad = _equal(state, full_state())
        print(f"rank {rank} EQUAL" if not bad else f"rank {rank} DIFFERS {bad}", flush=True)
    if mesh is not None:
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

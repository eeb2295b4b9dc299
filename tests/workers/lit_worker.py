"""One Lightning training process for the DDP and kill -9 tests (see test_lightning_ddp.py).

Run directly (single process) or as one of several ranks: the launcher sets LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR/PORT, and Lightning then joins them instead of spawning.

    python lit_worker.py OUT [--ddp] [--epochs N] [--layerwise] [--resume] [--per-rank]
                             [--sleep S] [--big N] [--staging-mb M]
                             [--gpu] [--io-strategy c|g|d] [--precision P]

--gpu: one CUDA device (with --ddp: DDP of one process over NCCL, which still runs the
gradient buckets through the communication hook).

Writes OUT/ck/*.ckpt (or --ck DIR's: a bucket's prefix, s3://...), OUT/loss-rank0.txt (one "step loss.hex()" line per step, flushed),
OUT/sync/*.pt (a synchronous torch.save of every checkpoint dict, as it was built),
OUT/final-rankR.pt (final weights) and OUT/loaded-rankR.pt (what each rank resumed from).
"""
from __future__ import annotations

import argparse
import json
import os
import time


import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy  # noqa: E402

import fastckpt  # noqa: E402
from lightning_fastckpt import FastCheckpointIO, LayerwiseCheckpointing  # noqa: E402
from lit_app import TinyModule, loader, trainer  # noqa: E402

fastckpt.reproducible()  # runs compared bit for bit across processes compute alike


class Record(L.Callback):
    """Loss per step (rank 0), a synchronous copy of each checkpoint, and what a resume loaded."""

    def __init__(self, out: str, sleep: float):
        self.out, self.sleep = out, sleep
        self._loss_file = None

    def on_train_start(self, trainer, pl_module):
        if trainer.global_rank == 0:
            self._loss_file = open(os.path.join(self.out, "loss-rank0.txt"), "a")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, i):
        if self._loss_file is not None:
            self._loss_file.write(f"{trainer.global_step} {outputs['loss'].item().hex()}\n")
            self._loss_file.flush()
        if self.sleep:
            time.sleep(self.sleep)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        if trainer.global_rank == 0:  # the dict as Lightning built it, written synchronously
            os.makedirs(os.path.join(self.out, "sync"), exist_ok=True)
            torch.save({"state_dict": checkpoint["state_dict"], "optimizer_states": checkpoint["optimizer_states"]},
                       os.path.join(self.out, "sync", f"step-{trainer.global_step}.pt"))

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        torch.save({"global_step": checkpoint["global_step"], "state_dict": checkpoint["state_dict"]},
                   os.path.join(self.out, f"loaded-rank{trainer.global_rank}.pt"))


class EveryRankSavesDDP(DDPStrategy):
    """What a sharded strategy does: ask every rank to save its part."""

    def save_checkpoint(self, checkpoint, filepath, storage_options=None):
        self.checkpoint_io.save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    def remove_checkpoint(self, filepath):
        if self.is_global_zero:
            self.checkpoint_io.remove_checkpoint(filepath)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ddp", action="store_true")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--layerwise", action="store_true")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--per-rank", action="store_true")
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--big", type=int, default=0)
    ap.add_argument("--staging-mb", type=int, default=None)
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--io-strategy", default="c")
    ap.add_argument("--precision", default=None)
    ap.add_argument("--resume-from", default=None, help="ckpt_path (Lightning's 'last' finds none in a bucket)")
    ap.add_argument("--top-k", type=int, default=-1, help="ModelCheckpoint's save_top_k (-1: every epoch's kept)")
    ap.add_argument("--ck", default=None, help="ModelCheckpoint's dirpath (default OUT/ck; an s3:// URL too)")
    ap.add_argument("--tiers", default=None, help="a memory tier in front of the checkpoints (FastCheckpointIO(tiers=))")
    a = ap.parse_args()
    L.seed_everything(0, verbose=False)
    io = FastCheckpointIO(strategy=a.io_strategy, per_rank=a.per_rank, chunk_mb=4 if a.staging_mb else 64,
                          staging_mb=a.staging_mb, stall_timeout_s=60, tiers=[a.tiers] if a.tiers else None)
    cbs = [ModelCheckpoint(dirpath=a.ck or os.path.join(a.out, "ck"), every_n_epochs=1, save_top_k=a.top_k, save_last=True,
                           save_on_train_epoch_end=True), Record(a.out, a.sleep)]
    if a.layerwise:
        cbs.append(LayerwiseCheckpointing())
    kw = dict(max_epochs=a.epochs, limit_val_batches=0)
    if a.precision:
        kw.update(precision=a.precision)
    if a.gpu:
        kw.update(accelerator="gpu", devices=1)
    if a.ddp:
        strategy = EveryRankSavesDDP() if a.per_rank else DDPStrategy()
        kw.update(strategy=strategy, devices=1 if a.gpu else 2, num_nodes=1)
    t = trainer(io, cbs, **kw)
    model = TinyModule(big=a.big)
    t.fit(model, loader(), ckpt_path=a.resume_from or ("last" if a.resume else None))
    torch.save(model.state_dict(), os.path.join(a.out, f"final-rank{t.global_rank}.pt"))
    with open(os.path.join(a.out, f"stats-rank{t.global_rank}.json"), "w") as f:
        json.dump({**io.stats, "layerwise_released": io.saves.held.released}, f)


if __name__ == "__main__":
    main()

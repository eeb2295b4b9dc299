"""One Lightning training process (or one of 2 DDP ranks, as torchrun starts them) with
FastCheckpointIO and lightning_fastckpt.PreemptCheckpoint(OUT/ck, grace_s=20) — the preemption
tests (tests/lightning_fastckpt/test_lightning_preempt.py).

    python lit_preempt_worker.py OUT [--ddp] [--every K] [--last K] [--big N] [--resume PATH|last]
        [--max-steps M]

Trains until a SIGTERM ends it (or, with --resume, resumes from PATH — or from what Lightning's
ckpt_path="last" resolves — and trains 8 more steps, or up to M). Prints "step N" at every batch
end (before the preemption callback), writes OUT/sync/step-N.pt (a synchronous torch.save of
every checkpoint dict as Lightning built it) and OUT/loaded-rankR.pt (what a resume loaded).
--every K: a ModelCheckpoint saves every K steps too (OUT/every); --last K: one in the
preemption's folder (OUT/ck) saves every K steps with save_last (its last.ckpt).
"""
from __future__ import annotations

import argparse
import os
import signal

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy

import fastckpt
from lightning_fastckpt import FastCheckpointIO, PreemptCheckpoint
from lit_app import TinyModule, loader, trainer
from lit_worker import Record

fastckpt.reproducible()


class Steps(Record):
    """lit_worker's Record (the sync copy of every checkpoint dict, what a resume loaded) and a
    "step N" line at every batch end."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, i):
        super().on_train_batch_end(trainer, pl_module, outputs, batch, i)
        print(f"step {trainer.global_step}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ddp", action="store_true")
    ap.add_argument("--every", type=int, default=0)
    ap.add_argument("--big", type=int, default=0)
    ap.add_argument("--last", type=int, default=0)
    ap.add_argument("--resume", default=None)
    ap.add_argument("--max-steps", type=int, default=0)
    a = ap.parse_args()
    L.seed_everything(0, verbose=False)
    cbs = [Steps(a.out, sleep=0.03)]
    if a.every:
        cbs.append(ModelCheckpoint(dirpath=os.path.join(a.out, "every"), every_n_train_steps=a.every, save_top_k=-1))
    if a.last:
        cbs.append(ModelCheckpoint(dirpath=os.path.join(a.out, "ck"), every_n_train_steps=a.last, save_last=True))
    cbs.append(PreemptCheckpoint(dirpath=os.path.join(a.out, "ck"), signal=signal.SIGTERM, grace_s=20))
    kw = dict(max_epochs=1000 if a.resume is None else None, limit_val_batches=0)
    if a.resume:
        kw.update(max_steps=a.max_steps or fastckpt.load(a.resume)["global_step"] + 8)
    if a.ddp:
        kw.update(strategy=DDPStrategy(), devices=2, num_nodes=1)
    t = trainer(FastCheckpointIO(stall_timeout_s=60), cbs, **kw)
    model, data = TinyModule(big=a.big), loader()
    if a.resume == "last":
        t.fit(model=model, train_dataloaders=data, ckpt_path="last")
    else:
        t.fit(model=model, train_dataloaders=data, ckpt_path=a.resume)


if __name__ == "__main__":
    main()

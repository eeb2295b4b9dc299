"""Child of the faults part: trains and checkpoints every step while the parent's fault bites.

    python fault_child.py checkpointer|lightning ROOT ON_ERROR STEPS [READONLY_AFTER]

checkpointer: a fastckpt.Checkpointer loop (states from states.state_for, so the parent can
check what survived bit for bit). lightning: a real Trainer with FastCheckpointIO and
ModelCheckpoint(every_n_train_steps=1). Prints "committed STEP" as commits land, "warned N"
and "trained STEPS" when it finished, or "stopped TYPE: MESSAGE" when an error stopped it.
READONLY_AFTER: after that many committed checkpoints the child remounts ROOT's mount
read-only (`mount -o remount,ro`), as a disk that turns read-only under a running job.
"""
from __future__ import annotations

import subprocess
import sys
import time
import warnings



def remount_ro(root: str) -> None:
    mount = subprocess.run(["findmnt", "-n", "-o", "TARGET", "--target", root], capture_output=True, text=True)
    subprocess.run(["mount", "-o", "remount,ro", mount.stdout.strip()], check=True)


def checkpointer(root: str, on_error: str, steps: int, ro_after: int | None) -> None:
    import fastckpt
    from states import state_for
    ck = fastckpt.Checkpointer(root, on_error=on_error, keep=100, chunk_mb=1, concurrency=2)
    pending = []

    def report() -> None:  # commits that landed; failures are the Checkpointer's to raise or warn
        while pending and pending[0].done():
            p = pending.pop(0)
            if p.error is None and not p.skipped:
                print(f"committed {p.step}", flush=True)

    for step in range(1, steps + 1):
        pending.append(ck.save(state_for(step, mib=2), step=step))
        report()
        if ro_after is not None and step == ro_after:
            while not all(p.done() for p in pending):
                time.sleep(0.01)
            report()
            remount_ro(root)
    ck.close()
    report()


def lightning(root: str, on_error: str, steps: int, ro_after: int | None) -> None:
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint

    from lightning_fastckpt import FastCheckpointIO

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(256, 1024)

        def training_step(self, batch, _):
            return self.net(batch).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    class ReadOnlyAfter(Callback):
        def on_train_batch_end(self, trainer, *_):
            if ro_after is not None and trainer.global_step == ro_after:
                io.wait()
                remount_ro(root)

    io = FastCheckpointIO(on_error=on_error, chunk_mb=1)
    data = torch.utils.data.DataLoader(torch.randn(steps * 4, 256), batch_size=4)
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, plugins=[io],
                        callbacks=[ModelCheckpoint(dirpath=root, every_n_train_steps=1, save_top_k=-1),
                                   ReadOnlyAfter()])
    trainer.fit(Tiny(), data)


def main() -> None:
    mode, root, on_error, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    ro_after = int(sys.argv[5]) if len(sys.argv) > 5 else None
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            (checkpointer if mode == "checkpointer" else lightning)(root, on_error, steps, ro_after)
        except Exception as e:  # noqa: BLE001 - the parent judges what stopped training
            print(f"stopped {type(e).__name__}: {e}", flush=True)
            return
    ours = [w for w in seen if "fastckpt" in str(w.message) and "training goes on" in str(w.message)]
    print(f"warned {len(ours)}", flush=True)
    print(f"trained {steps}", flush=True)


if __name__ == "__main__":
    main()

"""One Lightning process driving DeepSpeed through DeepSpeedStrategy, for tests/deepspeed_fastckpt/test_deepspeed.py.

    python ds_lightning_worker.py fit    CKPT_DIR OUT --steps N --every K --top-k T [--concurrency C]
    python ds_lightning_worker.py resume CKPT_DIR OUT --steps N --from NAME
Rank 0 writes OUT: the checkpoint engine's class, the files ModelCheckpoint left (when fit
returns and after destroy) and the parameters at the end. Lightning's DeepSpeedStrategy refuses any accelerator but CUDA in
setup_environment; CPUDeepSpeedStrategy changes only that (CPU devices carry the rank as
their index, which the strategy checks), so everything else is the real strategy.
"""
from __future__ import annotations

import argparse
import os
import sys

for k, v in (("DS_ACCELERATOR", "cpu"), ("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("WORLD_SIZE", "1"),
             ("LOCAL_RANK", "0")):
    os.environ.setdefault(k, v)

import lightning as L  # noqa: E402
import torch  # noqa: E402
from small_buckets import SMALL_BUCKETS  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy  # noqa: E402

import deepspeed_fastckpt  # noqa: E402,F401  (registers the engine)
import fastckpt  # noqa: E402

fastckpt.reproducible(threads=1)  # runs compared bit for bit across processes compute alike


class CPUDeepSpeedStrategy(DeepSpeedStrategy):
    def setup_environment(self) -> None:
        self.parallel_devices = [torch.device("cpu", i) for i in range(len(self.parallel_devices))]
        DDPStrategy.setup_environment(self)


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))

    def training_step(self, batch, i):
        x, y = batch
        return (self.net(x) - y).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["fit", "resume"])
    ap.add_argument("ckpt_dir")
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--top-k", type=int, default=-1)
    ap.add_argument("--stage", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--from", dest="start", default=None)
    a = ap.parse_args()
    g = torch.Generator().manual_seed(0)  # epochs of 4 steps: a resume at step 4 starts a fresh epoch
    data = torch.utils.data.TensorDataset(torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g))
    config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": a.stage, **SMALL_BUCKETS},
              "fastckpt": {"concurrency": a.concurrency}}
    callbacks = [ModelCheckpoint(dirpath=a.ckpt_dir, every_n_train_steps=a.every, save_top_k=a.top_k,
                                 monitor="step", mode="max")] if a.mode == "fit" else []
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=a.steps, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=callbacks, enable_checkpointing=a.mode == "fit",
                        strategy=CPUDeepSpeedStrategy(config=config, process_group_backend="gloo"))
    torch.manual_seed(0)
    model = Net()
    start = os.path.join(a.ckpt_dir, a.start) if a.start else None
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=4), ckpt_path=start)
    engine = trainer.strategy.deepspeed_engine
    out = {"engine": type(engine.checkpoint_engine).__name__, "global_step": trainer.global_step,
           "params": {n: p.detach().clone() for n, p in engine.module.named_parameters()}}
    out["files_before_destroy"] = sorted(os.listdir(a.ckpt_dir)) if os.path.isdir(a.ckpt_dir) else []
    if os.environ.get("FASTCKPT_FAULT_HOLD"):  # a test held some writes until now (the fault shim): let them go
        open(os.environ["FASTCKPT_FAULT_HOLD"], "w").close()
    engine.destroy()  # every tag in flight committed
    out["files"] = sorted(os.listdir(a.ckpt_dir)) if os.path.isdir(a.ckpt_dir) else []
    if trainer.global_rank == 0:
        torch.save(out, a.out)


if __name__ == "__main__":
    main()
    sys.exit(0)

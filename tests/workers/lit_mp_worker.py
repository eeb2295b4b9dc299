"""One rank of the FastModelParallelStrategy tests: Lightning's ModelParallelStrategy (FSDP2 in
configure_model) on 2 gloo ranks on CPU, started as torchrun starts them (env: RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_*).

Usage: lit_mp_worker.py OUT STEPS [--stock [--io]] [--last] [--resume CKPT] [--fail-second-save]
  trains to STEPS steps (ModelCheckpoint every 2 steps into OUT/ck, the 2 newest kept); with
  --resume, from that checkpoint directory. --stock: Lightning's own ModelParallelStrategy
  (--io: with FastCheckpointIO as its plugin, which that strategy bypasses). --last: ModelCheckpoint
  keeps only last.ckpt, saved into again every 2 steps. --fail-second-save: rank 1's file of the
  second save fails to write (an OSError raised in FastStorageWriter.write_data).
  Rank 0 keeps the full model and optimizer state at the end in OUT/final.pt.
One thread per process: every run computes each step with the same arithmetic.
"""
import json
import os
import sys

import torch

torch.set_num_threads(1)


def main() -> None:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.strategies import ModelParallelStrategy
    from lightning_fastckpt import FastCheckpointIO
    from lightning_fastckpt import FastModelParallelStrategy

    out, steps = sys.argv[1], int(sys.argv[2])
    if "--fail-second-save" in sys.argv and os.environ["RANK"] == "1":
        from fastckpt.dcp import writer
        real, calls = writer.plan_items, []

        def plan_items(values):  # the first step of FastStorageWriter.write_data's file
            calls.append(1)
            if len(calls) == 2:
                raise OSError("injected: rank 1 cannot write its file of the second save")
            return real(values)
        writer.plan_items = plan_items
    resume = sys.argv[sys.argv.index("--resume") + 1] if "--resume" in sys.argv else None

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

        def configure_model(self):
            from torch.distributed.fsdp import fully_shard
            mesh = self.device_mesh["data_parallel"]
            for layer in self.net:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=mesh)
            fully_shard(self.net, mesh=mesh)

        def training_step(self, batch, i):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("step_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    g = torch.Generator().manual_seed(1)
    # two steps an epoch: each checkpoint falls at an epoch's end, where Lightning resumes exactly
    data = torch.utils.data.TensorDataset(torch.randn(16, 16, generator=g), torch.randn(16, 4, generator=g))
    if "--stock" in sys.argv:
        strategy = ModelParallelStrategy()
    else:
        strategy = FastModelParallelStrategy(fastckpt={"concurrency": 2, "chunk_mb": 1})
    if "--last" in sys.argv:  # only last.ckpt, saved into again every 2 steps
        keep = ModelCheckpoint(dirpath=os.path.join(out, "ck"), every_n_train_steps=2, save_top_k=0, save_last=True)
    else:
        keep = ModelCheckpoint(dirpath=os.path.join(out, "ck"), every_n_train_steps=2, save_top_k=2,
                               monitor="step", mode="max")
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=steps, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[keep],
                        default_root_dir=out, plugins=[FastCheckpointIO()] if "--io" in sys.argv else None)
    model = Net()
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=8), ckpt_path=resume)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    msd, osd = get_state_dict(model.net, trainer.optimizers[0], options=StateDictOptions(full_state_dict=True))
    if trainer.global_rank == 0:
        torch.save({"model": msd, "optim": osd, "step": trainer.global_step}, os.path.join(out, "final.pt"))
    print(f"rank {trainer.global_rank} done {trainer.global_step}", flush=True)
    print(f"stager {json.dumps(getattr(strategy, 'stager_stats', {}))}", flush=True)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # as fsdp2_worker.py: never through interpreter shutdown with gloo threads about

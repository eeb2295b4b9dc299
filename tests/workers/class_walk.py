"""What fastckpt changes in Lightning's and DeepSpeed's classes, for tests/project/test_no_patched_classes.py.

    python class_walk.py WORK OUT

Takes every class of Lightning's strategies, CheckpointIO plugins, callbacks and Trainer, and
DeepSpeed's engine, optimizers and offline checkpoint readers (their class __dict__s, and the
functions of those reader modules) before any fastckpt plugin is imported; then imports both
plugins and uses them as a user would: a Lightning Trainer with FastCheckpointIO fits and
saves; a Lightning Trainer drives a DeepSpeed engine with a "fastckpt" entry (ModelCheckpoint
keeping one, so a removal goes through the plugin); a DeepSpeed engine with a "fastckpt"
entry, activation offload and interval="auto" trains, saves, loads and is destroyed. Then it
takes them again. OUT (JSON): "changed", every "module.Class.attr" (or "module.function")
added, removed or replaced; "planted": the same after this process itself replaced
FSDPStrategy.save_checkpoint, which the walk must see.
"""
from __future__ import annotations

import importlib
import inspect
import json
import os
import sys
import warnings

for k, v in (("DS_ACCELERATOR", "cpu"), ("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("WORLD_SIZE", "1"),
             ("LOCAL_RANK", "0")):
    os.environ.setdefault(k, v)
if "MASTER_PORT" not in os.environ:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(s.getsockname()[1])

import torch  # noqa: E402
from small_buckets import SMALL_BUCKETS  # noqa: E402

torch.set_num_threads(1)
MODULES = [  # whose classes (and, for the last two, functions) are walked
    "lightning.pytorch.strategies", "lightning.pytorch.plugins.io", "lightning.fabric.plugins.io",
    "lightning.pytorch.callbacks", "lightning.pytorch.trainer.trainer", "lightning.pytorch.core.module",
    "deepspeed.runtime.engine", "deepspeed.runtime.zero.stage_1_and_2", "deepspeed.runtime.zero.stage3",
    "deepspeed.runtime.checkpoint_engine.checkpoint_engine", "deepspeed.checkpoint.deepspeed_checkpoint",
    "deepspeed.checkpoint.ds_to_universal", "deepspeed.utils.zero_to_fp32",
]
FUNCTIONS_OF = ("deepspeed.checkpoint.ds_to_universal", "deepspeed.utils.zero_to_fp32")


def snapshot() -> dict[str, int]:
    """'module.Class.attr' -> id of the value, for every class (and its bases) the modules hold."""
    seen: dict[str, int] = {}
    classes: dict[type, None] = {}
    for name in MODULES:
        module = importlib.import_module(name)
        for value in vars(module).values():
            if inspect.isclass(value):
                for cls in value.__mro__:
                    if cls.__module__.split(".")[0] in ("lightning", "deepspeed"):
                        classes[cls] = None
            elif name in FUNCTIONS_OF and inspect.isfunction(value):
                seen[f"{name}.{value.__name__}"] = id(value)
        if name in FUNCTIONS_OF:
            for attr, value in vars(module).items():
                if inspect.isfunction(value):
                    seen[f"{name}.{attr}"] = id(value)
    for cls in classes:
        for attr, value in vars(cls).items():
            seen[f"{cls.__module__}.{cls.__qualname__}.{attr}"] = id(value)
    return seen


def changed(before: dict[str, int], after: dict[str, int]) -> list[str]:
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def lightning_fit(work: str) -> None:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightning_fastckpt import FastCheckpointIO
    from lit_app import TinyModule, loader

    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=3, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, plugins=[FastCheckpointIO()],
                        callbacks=[ModelCheckpoint(dirpath=os.path.join(work, "lit"), every_n_train_steps=1,
                                                   save_top_k=1, monitor="step", mode="max")])
    trainer.fit(TinyModule(), loader())


def lightning_deepspeed_fit(work: str) -> None:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy

    from lit_app import TinyModule, loader

    class CPUDeepSpeedStrategy(DeepSpeedStrategy):  # Lightning refuses DeepSpeed without CUDA otherwise
        def setup_environment(self) -> None:
            self.parallel_devices = [torch.device("cpu", i) for i in range(len(self.parallel_devices))]
            DDPStrategy.setup_environment(self)

    config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 1, **SMALL_BUCKETS},
              "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
              "fastckpt": {"concurrency": 2}}
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=3, logger=False, enable_progress_bar=False,
                        enable_model_summary=False,
                        strategy=CPUDeepSpeedStrategy(config=config, process_group_backend="gloo"),
                        callbacks=[ModelCheckpoint(dirpath=os.path.join(work, "lds"), every_n_train_steps=1,
                                                   save_top_k=1, monitor="step", mode="max")])
    trainer.fit(TinyModule(), loader())
    trainer.strategy.deepspeed_engine.destroy()


def deepspeed_run(work: str) -> None:
    import deepspeed

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    config = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4,
              "zero_optimization": {"stage": 2, **SMALL_BUCKETS},
              "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
              "fastckpt": {"concurrency": 2, "interval": 2,
                           "offload": {"directory": os.path.join(work, "act"), "threshold_mb": 0.0001}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    import deepspeed_fastckpt
    save_dir = os.path.join(work, "ds")
    for _ in range(4):
        loss = engine(torch.randn(4, 32)).pow(2).mean()
        engine.backward(loss)
        engine.step()
        if deepspeed_fastckpt.checkpoint_due(engine, save_dir):
            engine.save_checkpoint(save_dir)
    engine.load_checkpoint(save_dir)
    engine.destroy()


def main() -> None:
    work, out = sys.argv[1], sys.argv[2]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    warnings.simplefilter("ignore")
    before = snapshot()
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    import deepspeed_fastckpt  # noqa: F401
    import lightning_fastckpt  # noqa: F401
    for name in lightning_fastckpt.__all__:
        getattr(lightning_fastckpt, name)
    lightning_fit(work)
    lightning_deepspeed_fit(work)
    deepspeed_run(work)
    after = snapshot()
    from lightning.pytorch.strategies import FSDPStrategy
    original = FSDPStrategy.save_checkpoint
    FSDPStrategy.save_checkpoint = lambda self, *a, **k: original(self, *a, **k)  # what the walk must catch
    planted = snapshot()
    FSDPStrategy.save_checkpoint = original
    with open(out, "w") as f:
        json.dump({"changed": changed(before, after), "planted": changed(after, planted)}, f)


if __name__ == "__main__":
    main()

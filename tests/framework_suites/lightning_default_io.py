"""A pytest plugin for Lightning's own test suite: FastCheckpointIO becomes the default CheckpointIO.

Loaded with `-p lightning_default_io` (run_suites.py puts this folder on PYTHONPATH). Every
strategy that would build TorchCheckpointIO for lack of a plugin builds FastCheckpointIO
instead, in Lightning (pytorch) and in Fabric; an explicitly given plugin is left alone.

With FASTCKPT_SUITE_IO=async the default is Lightning's own AsyncCheckpointIO around
TorchCheckpointIO instead (Lightning only; Fabric has no asynchronous IO): the peer run that
tells a failure inherent to saving asynchronously from one of fastckpt's.
"""
from __future__ import annotations

import os


def pytest_configure(config) -> None:
    import lightning.fabric.strategies.strategy as fabric_strategy
    import lightning.pytorch.strategies.strategy as pytorch_strategy

    if os.environ.get("FASTCKPT_SUITE_IO", "fastckpt") == "async":
        from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

        pytorch_strategy.TorchCheckpointIO = lambda: AsyncCheckpointIO(TorchCheckpointIO())
        return
    from lightning_fastckpt import FastCheckpointIO

    pytorch_strategy.TorchCheckpointIO = FastCheckpointIO
    fabric_strategy.TorchCheckpointIO = FastCheckpointIO

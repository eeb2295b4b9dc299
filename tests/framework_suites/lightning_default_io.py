"""A pytest plugin for Lightning's own test suite: FastCheckpointIO becomes the default CheckpointIO.

Loaded with `-p lightning_default_io` (run_suites.py puts this folder on PYTHONPATH). Every
strategy that would build TorchCheckpointIO for lack of a plugin builds FastCheckpointIO
instead, in Lightning (pytorch) and in Fabric; an explicitly given plugin is left alone.
"""
from __future__ import annotations


def pytest_configure(config) -> None:
    import lightning.fabric.strategies.strategy as fabric_strategy
    import lightning.pytorch.strategies.strategy as pytorch_strategy

    from lightning_fastckpt import FastCheckpointIO

    pytorch_strategy.TorchCheckpointIO = FastCheckpointIO
    fabric_strategy.TorchCheckpointIO = FastCheckpointIO

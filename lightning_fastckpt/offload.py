"""TensorOffload: Fastensor's activation offload for `Trainer(callbacks=[TensorOffload(...)])`.

Owns the placement of fastckpt.offload.ActivationOffload in Lightning's training step: its
hooks are entered when a training batch starts (the forward of training_step saves its
activations through them) and left before backward; the step's files are removed when the
batch ends, and also when it raised. The learned I/O dictionaries are saved at the end of
training when `learned_path` is set.
"""
from __future__ import annotations

from typing import Any, Optional

from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from fastckpt.offload import ActivationOffload, TensorIO


class TensorOffload(Callback):
    """Args: directory (on the SSD), threshold_mb (smaller activations stay), mode/aware/tool/
    dict_path/learned_path/refresh_every (TensorIO's choice of tool), max_inflight_mb, prefetch."""

    def __init__(self, directory: Optional[str] = None, threshold_mb: float = 1.0, mode: str = "aware",
                 aware: str = "wr", tool: Optional[str] = None, dict_path: Optional[str] = None,
                 learned_path: Optional[str] = None, refresh_every: Optional[int] = None,
                 max_inflight_mb: float = 256.0, prefetch: int = 2):
        self.io = TensorIO(mode=mode, aware=aware, tool=tool, dict_path=dict_path, learned_path=learned_path,
                           refresh_every=refresh_every)
        self.offload = ActivationOffload(directory, threshold_mb, self.io, max_inflight_mb, prefetch)
        self._hooks = None

    def _leave_hooks(self) -> None:
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            hooks.__exit__(None, None, None)

    @override
    def on_train_batch_start(self, trainer, pl_module, batch: Any, batch_idx: int) -> None:
        self.offload.start()
        self._hooks = self.offload.hooks()
        self._hooks.__enter__()

    @override
    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self._leave_hooks()

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch: Any, batch_idx: int) -> None:
        self._leave_hooks()
        self.offload.close()

    @override
    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._leave_hooks()
        self.offload.close()

    @override
    def on_train_end(self, trainer, pl_module) -> None:
        if self.io.learned_path:
            self.io.save_dictionaries()

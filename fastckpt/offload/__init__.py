"""Tensor offload (Fastensor): one interface over several tensor I/O tools, an adaptive
per-size choice among them, activation offload to SSD, and checkpoints written by tool.

    from fastckpt.offload import TensorIO
    io = TensorIO(mode="aware", aware="wr")   # or mode="tool", tool="direct" / mode="dict", dict_path=...
    io.save(tensor, "/ssd/x.fct"); io.load("/ssd/x.fct")
    with ActivationOffload("/ssd/tmp", threshold_mb=1, io=io):
        model(x).sum().backward()     # activations went to SSD and came back for backward
    fastckpt.save(state, "m.pt", tool="auto")   # plan_writer: records placed by the chosen tool

Modules: tensor_file (the file format), io_tools (each tool), adaptive (TensorIO and its
dictionaries), activations (ActivationOffload), settings (OffloadConfig, one spelling for
Hydra, DeepSpeed and Lightning), plan_writer (save(tool=...)), malloc_release (freed
activations leave the process).
"""
from .activations import ActivationOffload
from .adaptive import AWARE_MODES, MODES, TensorIO
from .settings import OffloadConfig, offload_from
from .io_tools import TOOLS, available_tools

__all__ = ["ActivationOffload", "TensorIO", "OffloadConfig", "offload_from", "TOOLS", "MODES", "AWARE_MODES",
           "available_tools"]

"""Tensor offload (Fastensor): one interface over several tensor I/O tools, an adaptive
per-size choice among them, and activation offload to SSD.

    from fastckpt.offload import TensorIO
    io = TensorIO(mode="aware", aware="wr")   # or mode="tool", tool="direct" / mode="dict", dict_path=...
    io.save(tensor, "/ssd/x.fct"); io.load("/ssd/x.fct")
    with ActivationOffload("/ssd/tmp", threshold_mb=1, io=io):
        model(x).sum().backward()     # activations went to SSD and came back for backward
"""
from .activations import ActivationOffload
from .adaptive import AWARE_MODES, MODES, TensorIO
from .tools import TOOLS, available_tools

__all__ = ["ActivationOffload", "TensorIO", "TOOLS", "MODES", "AWARE_MODES", "available_tools"]

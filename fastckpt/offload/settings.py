"""One spelling of the activation-offload settings for every face: the Hydra group `offload/`,
the DeepSpeed entry's `"offload": {...}`, and the Lightning callback's keyword arguments.

offload_from(node) turns such a node (a dict, an OmegaConf node, None/False for off) into an
ActivationOffload, or None when offload is off; unknown keys are a ConfigError naming the
valid ones. The group's files carry `name` (off, aware_w, aware_r, aware_wr, specific),
which only says which file it was.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from ..settings import to_plain
from ..errors import ConfigError
from .activations import ActivationOffload
from .adaptive import TensorIO


@dataclass
class OffloadConfig:
    enabled: bool = True
    directory: Optional[str] = None    # on the SSD; None: the system temporary directory
    threshold_mb: float = 1.0          # saved activations smaller than this stay in memory
    mode: str = "aware"                # tool | dict | aware  (SpecificTool / SpecificDic / AwareDic)
    aware: str = "w"                   # w | r | wr: which learned dictionary decides (adaptive.py: why w)
    tool: Optional[str] = None         # mode=tool: posix | direct | numpy | torch | kvikio
    dict_path: Optional[str] = None    # mode=dict: JSON {size in MB: tool}
    learned_path: Optional[str] = None  # where learned dictionaries are loaded from / saved to
    refresh_every: Optional[int] = None
    max_inflight_mb: float = 256.0     # bound on activation bytes being written at once
    prefetch: int = 2                  # reads started ahead during backward
    writers: int = 2                   # background I/O threads
    release_memory: bool = True        # freed activation-sized buffers go back to the system (glibc)

    @classmethod
    def from_node(cls, node: Any) -> "OffloadConfig":
        if node is None or node is False:
            return cls(enabled=False)
        if node is True:
            return cls()
        node = to_plain(node)
        if not isinstance(node, dict):
            raise ConfigError(f"offload settings must be a mapping, got {node!r}")
        node = dict(node)
        node.pop("name", None)
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(node) - fields)
        if unknown:
            raise ConfigError(f"unknown offload setting(s) {unknown}; valid: {sorted(fields)}")
        return cls(**node)

    def io(self) -> TensorIO:
        return TensorIO(mode=self.mode, aware=self.aware, tool=self.tool, dict_path=self.dict_path,
                        learned_path=self.learned_path, refresh_every=self.refresh_every)

    def offload(self) -> ActivationOffload:
        """The ActivationOffload these settings describe (`enabled` aside)."""
        return ActivationOffload(self.directory, self.threshold_mb, self.io(), self.max_inflight_mb,
                                 self.prefetch, self.writers, self.release_memory)

    def build(self) -> Optional[ActivationOffload]:
        """The ActivationOffload, or None when these settings say off."""
        return self.offload() if self.enabled else None


def offload_from(node: Any) -> Optional[ActivationOffload]:
    """An ActivationOffload from settings (None/False/{"enabled": false}: offload off -> None)."""
    return OffloadConfig.from_node(node).build()

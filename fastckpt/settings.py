"""One spelling of every setting: a dataclass, the Hydra YAML in configs/, plugin kwargs.

CheckpointerConfig holds every Checkpointer setting and its default and checks values;
flatten(cfg) turns the Hydra layout (groups `strategy` and `store`, optional top-level
overrides like `concurrency=4`) into its flat kwargs; unknown keys are a ConfigError naming
the valid ones. What a config builds is fastckpt.config.hydra's; this module sits low in the
house (it imports only errors and write.deadline) so that every layer can read the settings.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .write.deadline import DEFAULT_STALL_S


@dataclass
class CheckpointerConfig:
    """Every Checkpointer setting with its default: the one place defaults live (Checkpointer,
    FastCheckpointIO and the DeepSpeed entry take theirs from here; tests check the YAML's)."""

    root: str | None = "checkpoints"
    strategy: str = "c"
    concurrency: int = 2
    writers: int = 4
    chunk_mb: int = 64
    staging_mb: int | None = None
    store: str = "root"
    format: str = "torch"
    keep: int = 2
    verify: bool = True
    policy: str = "wait"
    direct_io: bool = True
    commit_timeout_s: float = 600.0
    distributed: bool | None = None
    model: str | None = "default"
    pool_mb: int | None = None
    persist: str = "auto"
    on_error: str = "raise"
    stall_timeout_s: float = DEFAULT_STALL_S

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CheckpointerConfig":
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise ConfigError(f"unknown fastckpt setting(s) {unknown}; valid: {sorted(fields)}")
        return cls(**d).validate()

    def validate(self) -> "CheckpointerConfig":
        """Every value checked, nothing built or touched on disk (a pool path under /dev aside,
        which must name a DAX device); a ConfigError of one line names the first bad one."""
        from .format import FORMATS
        from .pmem.pool import PERSIST, check_device_path
        from .store import STORES
        from .write import STRATEGIES
        for name, choices in (("strategy", STRATEGIES), ("store", tuple(STORES)), ("format", FORMATS),
                              ("policy", POLICIES), ("on_error", ON_ERROR), ("persist", PERSIST)):
            if getattr(self, name) not in choices:
                renamed = " (store='file' is store='root' since 0.2)" if (name, self.store) == ("store", "file") else ""
                raise ConfigError(f"unknown {name} {getattr(self, name)!r}; choose one of: {', '.join(choices)}"
                                  + renamed)
        for name, low in (("concurrency", 1), ("writers", 1), ("chunk_mb", 1), ("keep", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.staging_mb is not None and (not isinstance(self.staging_mb, int) or self.staging_mb < self.chunk_mb):
            raise ConfigError(f"staging_mb must be null/None or an integer >= chunk_mb ({self.chunk_mb}), "
                              f"got {self.staging_mb!r}")
        for name in ("commit_timeout_s", "stall_timeout_s"):
            check_seconds(name, getattr(self, name))
        if self.pool_mb is not None and (not isinstance(self.pool_mb, int) or self.pool_mb <= 0):
            raise ConfigError(f"pool_mb must be null/None or an integer > 0, got {self.pool_mb!r}")
        for name in ("verify", "direct_io"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.store == "pmem" and self.root is not None:
            check_device_path(self.root)
        return self


def check_seconds(name: str, value) -> None:
    """A setting that is a number of seconds > 0 (a ConfigError naming it otherwise)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{name} must be a number of seconds > 0, got {value!r}")


DEFAULTS = CheckpointerConfig()
POLICIES = ("wait", "skip")
ON_ERROR = ("raise", "warn")


GROUP_KEYS = {"strategy": ("concurrency", "writers", "chunk_mb"),
              "store": ("direct_io", "model", "pool_mb", "persist")}
NON_CHECKPOINTER = {"demo", "hydra", "offload", "tune"}  # offload_of() and tuner_of() read those


def to_plain(node):
    """An OmegaConf node as plain dicts and lists (resolved); anything else as it is."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
        if isinstance(node, (DictConfig, ListConfig)):
            return OmegaConf.to_container(node, resolve=True)
    except ImportError:
        pass
    return node


def flatten(cfg) -> dict[str, Any]:
    """Hydra layout (groups with a `name`) -> flat constructor kwargs; top-level wins when set."""
    cfg = dict(to_plain(cfg))
    flat: dict[str, Any] = {}
    for group, keys in GROUP_KEYS.items():
        node = cfg.pop(group, None)
        if isinstance(node, dict):
            node = dict(node)
            flat[group] = node.pop("name", group)
            extra = sorted(set(node) - set(keys))
            if extra:
                raise ConfigError(f"unknown key(s) {extra} in the {group} group; valid: {list(keys)}")
            flat.update(node)
        elif node is not None:
            flat[group] = node
    for k, v in cfg.items():
        if k in NON_CHECKPOINTER or k.startswith("_"):
            continue
        if v is None and k in ("concurrency", "writers", "chunk_mb", "direct_io"):
            continue  # unset top-level override: the group's value stands
        flat[k] = v
    return flat

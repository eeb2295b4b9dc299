"""One spelling of every setting: a dataclass, the Hydra YAML in configs/, plugin kwargs.

instantiate(cfg) builds a Checkpointer from a Hydra/OmegaConf config (groups
`strategy` and `store`, optional top-level overrides like `concurrency=4`) or
from a plain dict; unknown keys are a ConfigError naming the valid ones.
offload_of(cfg) builds the activation offload of the `offload` group (None when off);
tuner_of(cfg) the AutoInterval of the `tune` group (tune=auto; None when off).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError


@dataclass
class CheckpointerConfig:
    root: str = "checkpoints"
    strategy: str = "c"
    concurrency: int = 2
    writers: int = 4
    chunk_mb: int = 64
    staging_mb: int | None = None
    store: str = "file"
    format: str = "torch"
    keep: int = 2
    verify: bool = True
    policy: str = "wait"
    direct_io: bool = True
    commit_timeout_s: float = 600.0
    distributed: bool | None = None
    model: str = "default"
    pool_mb: int | None = None
    persist: str = "auto"
    on_error: str = "raise"
    stall_timeout_s: float = 120.0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CheckpointerConfig":
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise ConfigError(f"unknown fastckpt setting(s) {unknown}; valid: {sorted(fields)}")
        return cls(**d)


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


def instantiate(cfg):
    """A Checkpointer from a Hydra config, a dict, or a CheckpointerConfig."""
    from .checkpointer import Checkpointer
    if isinstance(cfg, CheckpointerConfig):
        c = cfg
    else:
        c = CheckpointerConfig.from_dict(flatten(cfg))
    return Checkpointer(**dataclasses.asdict(c))


def offload_of(cfg):
    """The ActivationOffload the config's `offload` group asks for, or None (absent or off)."""
    from .offload.settings import offload_from
    node = cfg.get("offload") if hasattr(cfg, "get") else None
    return offload_from(node)


def tuner_of(cfg):
    """The AutoInterval the config's `tune` group asks for (tune=auto), or None."""
    from .auto_interval import AutoInterval
    node = to_plain(cfg.get("tune") if hasattr(cfg, "get") else None)
    if not node or not node.get("enabled", True):
        return None
    settings = {k: v for k, v in node.items() if k not in ("name", "enabled")}
    try:
        return AutoInterval(**settings)
    except TypeError as e:
        raise ConfigError(f"unknown tune setting: {e}") from None

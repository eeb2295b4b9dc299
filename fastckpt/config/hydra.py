"""What a Hydra/OmegaConf config (or a plain dict) builds, each checked before any work.

instantiate(cfg): a Checkpointer (fastckpt.settings' settings and layout);
offload_of(cfg): the activation offload of the `offload` group (None when off);
tuner_of(cfg): the AutoInterval of the `tune` group (tune=auto; None when off);
check(cfg): all three groups checked, nothing built.
"""
from __future__ import annotations

from ..tune.auto_interval import AutoInterval
from ..checkpointer import Checkpointer
from ..settings import CheckpointerConfig, flatten, to_plain
from ..errors import ConfigError
from ..offload.settings import OffloadConfig, offload_from


def instantiate(cfg):
    """A Checkpointer from a Hydra config, a dict, or a CheckpointerConfig."""
    if isinstance(cfg, CheckpointerConfig):
        c = cfg  # checked when it was made
    else:
        c = CheckpointerConfig.from_dict(flatten(cfg))
    return Checkpointer.from_config(c)


def check(cfg) -> CheckpointerConfig:
    """The whole config checked before any work (Checkpointer settings, the offload and tune
    groups), nothing built: a ConfigError of one line names the first problem."""
    c = CheckpointerConfig.from_dict(flatten(cfg))
    offload = OffloadConfig.from_node(cfg.get("offload") if hasattr(cfg, "get") else None)
    if offload.enabled:
        offload.io()
    tuner_of(cfg)
    return c


def offload_of(cfg):
    """The ActivationOffload the config's `offload` group asks for, or None (absent or off)."""
    node = cfg.get("offload") if hasattr(cfg, "get") else None
    return offload_from(node)


def tuner_of(cfg):
    """The AutoInterval the config's `tune` group asks for (tune=auto), or None."""
    node = to_plain(cfg.get("tune") if hasattr(cfg, "get") else None)
    if not node or not node.get("enabled", True):
        return None
    settings = {k: v for k, v in node.items() if k not in ("name", "enabled")}
    try:
        return AutoInterval(**settings)
    except TypeError as e:
        raise ConfigError(f"unknown tune setting: {e}") from None

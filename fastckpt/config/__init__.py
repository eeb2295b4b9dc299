"""The settings, spelled once: what each is, its default and its check, and what a config builds.

  schema.py  CheckpointerConfig (every Checkpointer setting, its one default, its checks) and
             flatten (the Hydra layout -> its flat fields); its names are this package's
  hydra.py   what a Hydra/OmegaConf config or a plain dict builds: instantiate (a Checkpointer),
             offload_of, tuner_of, check (everything checked, nothing built)

Only schema's names are imported here: hydra.py builds a Checkpointer, which itself reads the
schema (import fastckpt.config.hydra where a config is built).
"""
from .schema import (DEFAULTS, GROUP_KEYS, NON_CHECKPOINTER, ON_ERROR, POLICIES, CheckpointerConfig,
                     check_seconds, flatten, to_plain)

__all__ = ["CheckpointerConfig", "DEFAULTS", "GROUP_KEYS", "NON_CHECKPOINTER", "ON_ERROR", "POLICIES",
           "check_seconds", "flatten", "to_plain"]

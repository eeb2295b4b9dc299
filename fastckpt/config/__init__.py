"""What a Hydra/OmegaConf config builds: the top of the house, above everything it builds.

  hydra.py   what a Hydra/OmegaConf config or a plain dict builds: instantiate (a Checkpointer),
             offload_of, tuner_of, check (everything checked, nothing built)

The settings themselves (CheckpointerConfig, flatten: the Hydra layout -> its flat fields) are
fastckpt.settings', low in the house so every layer can read them; their names are re-exported
here for a config's users. Import fastckpt.config.hydra where a config is built.
"""
from ..settings import (DEFAULTS, GROUP_KEYS, NON_CHECKPOINTER, ON_ERROR, POLICIES, CheckpointerConfig,
                        check_seconds, flatten, to_plain)

__all__ = ["CheckpointerConfig", "DEFAULTS", "GROUP_KEYS", "NON_CHECKPOINTER", "ON_ERROR", "POLICIES",
           "check_seconds", "flatten", "to_plain"]

"""The `"fastckpt": {...}` entry of a DeepSpeed JSON config: what it may hold, checked once.

DeepSpeed keeps unknown top-level keys in `engine.config`; this module checks that entry once
and turns it into the one CheckpointerConfig the engine's saves use, refusing keys it does not
know, naming the valid ones, and places it where it enters (fastckpt.settings.placed_by_path:
its pool or memory tier, the job's ranks). DeepSpeed decides paths and which tags exist, so
PLACEMENT's other fields are not settings here. `pool` (with `pool_mb`, `persist`) puts
the tag's files into a persistent-memory pool as models named by their paths; `tiers` (with
`tier_keep`) puts a memory tier in front of them (each file committed there first and persisted
to its path from that copy; loaded from it: fastckpt.store.named_tiers). `offload`
(OffloadConfig's settings) turns on activation offload for the engine; it is checked here
and is not a Checkpointer setting. `interval` ("auto" or steps) with `tune` (AutoInterval's
settings) is what deepspeed_fastckpt.checkpoint_due answers by. `preempt_signal` (with
`preempt_grace_s`) is what deepspeed_fastckpt.at_step_end acts on. `bucket` (an s3:// URL, with
`bucket_keep`) mirrors every committed tag there, uploaded in the background from its committed local
copy, and a load on a node whose save_dir lacks the newest tag fetches it from there
(fastckpt.store.s3.folder_mirror; the server as `endpoint` says, else as AWS tools find it).
"""
from __future__ import annotations

from typing import Any, Optional

from fastckpt.errors import ConfigError
from fastckpt.session import WRITING, AutoInterval, CheckpointerConfig, OffloadConfig, S3Place, placed

CONFIG_KEY = "fastckpt"
PREEMPT = ("preempt_signal", "preempt_grace_s")  # deepspeed_fastckpt.at_step_end's, not a save's
BUCKET = ("bucket", "bucket_keep")  # the tags mirrored in a bucket (fastckpt.store.s3.folder_mirror)
VALID = WRITING + ("pool", "tiers", "tier_keep", "offload", "interval", "tune") + PREEMPT + BUCKET
TUNE_KEYS = ("overhead", "drift", "warmup_steps", "window", "ns", "ps", "repeats", "host_bytes", "storage_bytes",
             "feedback_intervals")


def entry_of(config_params) -> Optional[dict]:
    """The raw entry from a DeepSpeedConfig (or a plain dict config); None when absent."""
    if config_params is None:
        return None
    raw = config_params if isinstance(config_params, dict) else getattr(config_params, "_param_dict", {})
    return raw.get(CONFIG_KEY)


def checkpointer_config(entry: Any) -> tuple[CheckpointerConfig, Optional[str]]:
    """The entry checked once, here, where it enters: (the CheckpointerConfig every file of every
    tag is saved with, the pool or None). True or {} means all defaults."""
    if entry is True or entry is None:
        entry = {}
    if not isinstance(entry, dict):
        raise ConfigError(f'the "{CONFIG_KEY}" entry of the DeepSpeed config must be an object, got {entry!r}')
    unknown = sorted(set(entry) - set(VALID))
    if unknown:
        raise ConfigError(f'unknown key(s) {unknown} in the "{CONFIG_KEY}" entry of the DeepSpeed config; '
                          f"valid: {sorted(VALID)}")
    OffloadConfig.from_node(entry.get("offload"))  # its errors now, before anything is built
    interval_of(entry)
    preempt_of(entry)
    bucket_of(entry)
    values = {k: v for k, v in entry.items() if k not in ("pool", "offload", "interval", "tune") + PREEMPT + BUCKET}
    pool = entry.get("pool")
    return placed(values, pool=pool, distributed=None), pool  # the job's ranks (its bucket's)


def bucket_of(entry: Any) -> Optional[tuple[str, int]]:
    """The entry's "bucket" (an s3:// URL the tags are mirrored under) and "bucket_keep" (tags kept
    there; 0: all), checked; None without a bucket."""
    if not isinstance(entry, dict) or not any(k in entry for k in BUCKET):
        return None
    url, keep = entry.get("bucket"), entry.get("bucket_keep", 0)
    if url is None:
        raise ConfigError(f'"bucket_keep" in the "{CONFIG_KEY}" entry needs "bucket"')
    if not isinstance(url, str) or not url.startswith("s3://"):
        raise ConfigError(f'"bucket" in the "{CONFIG_KEY}" entry must be an s3:// URL (s3://bucket/prefix), got {url!r}')
    S3Place.parse(url, '"bucket"')
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise ConfigError(f'"bucket_keep" must be a whole number of tags (0: all), got {keep!r}')
    if entry.get("pool") is not None:
        raise ConfigError('"bucket" and "pool" cannot be combined: the tags of a pool are models in it, '
                          "not files to upload")
    return url, keep


def preempt_of(entry: Any) -> Optional[tuple[int, float]]:
    """The entry's "preempt_signal" (and "preempt_grace_s"), checked as CheckpointerConfig checks
    them: (signal number, grace seconds); None without a signal."""
    if not isinstance(entry, dict) or not any(k in entry for k in PREEMPT):
        return None
    checked = CheckpointerConfig(**{k: entry[k] for k in PREEMPT if k in entry})
    if checked.preempt_signal is None:
        if "preempt_grace_s" in entry:
            raise ConfigError(f'"preempt_grace_s" in the "{CONFIG_KEY}" entry needs "preempt_signal"')
        return None
    return checked.preempt_signal, checked.preempt_grace_s


def offload_node(entry: Any) -> Any:
    """The entry's "offload" settings, or None."""
    return entry.get("offload") if isinstance(entry, dict) else None


def interval_of(entry: Any) -> Optional[tuple[Any, dict]]:
    """The entry's "interval" ("auto" or steps) and "tune" (AutoInterval's settings), checked;
    None without "interval"."""
    if not isinstance(entry, dict) or "interval" not in entry:
        if isinstance(entry, dict) and "tune" in entry:
            raise ConfigError(f'"tune" in the "{CONFIG_KEY}" entry needs "interval": "auto"')
        return None
    interval, tune = entry["interval"], dict(entry.get("tune") or {})
    unknown = sorted(set(tune) - set(TUNE_KEYS))
    if unknown:
        raise ConfigError(f'unknown key(s) {unknown} in "tune" of the "{CONFIG_KEY}" entry; valid: {list(TUNE_KEYS)}')
    if interval == "auto":
        AutoInterval(**tune)  # its own checks of the values
    elif not (isinstance(interval, int) and not isinstance(interval, bool) and interval >= 1):
        raise ConfigError(f'"interval" in the "{CONFIG_KEY}" entry is "auto" or a positive integer, got {interval!r}')
    return interval, tune

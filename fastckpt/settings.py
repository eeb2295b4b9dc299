"""One spelling of every setting: a dataclass, the Hydra YAML in configs/, plugin kwargs.

CheckpointerConfig holds every Checkpointer setting, its default and its doc, and is checked
once, where it is made (frozen: nothing changes it after; a changed copy,
dataclasses.replace, is made and checked anew). Nothing else lists the settings' names: a
front end takes `settings=` (this object, or a mapping) or keywords (`from_dict`, which names
the valid ones when one is unknown), checked one way by `given_one_way`; `PLACEMENT` — the
fields a front end decides itself (where the checkpoints live, how many are kept, which ranks
take part) — is derived from the fields' own metadata, and `placed_by_path` sets them for
checkpoints named by path (the path store, a memory tier in front, or a pool's models) where
their settings enter. A new setting is one field here, its check in `_check`, and its doc.
flatten(cfg) turns the Hydra layout (groups `strategy` and `store`, optional top-level
overrides like `concurrency=4`) into its flat kwargs; unknown keys are a ConfigError naming
the valid ones. What a config builds is fastckpt.config.hydra's. The check asks the layers
below what they offer (formats, stores, strategies, the pool's persistence modes, an S3 place):
this module sits above store/ and restore/ (floor 7 of tests/fastckpt/test_imports.py's LAYERS),
and the layers below it are handed the settings (or their values), never import this module.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from .errors import ConfigError
from .write.deadline import DEFAULT_STALL_S


POLICIES = ("wait", "skip")
DEFAULT_ROOT = "checkpoints"  # the root's default; with tiers, the last tier is the root
ON_ERROR = ("raise", "warn")
_PLACED = {"placement": True}  # decided by the front end that names the checkpoints, not a user setting there
_PER_TIER = {"placement": True, "per_tier": True}  # a list with one value per tier: its length is checked


@dataclass(frozen=True)
class CheckpointerConfig:
    """Every Checkpointer setting with its default: the one place defaults live (Checkpointer,
    FastCheckpointIO, the DeepSpeed entry, DCP's writer and stager take theirs from here; tests
    check the YAML's). Checked when made (a ConfigError of one line names the first bad value)."""

    root: str | None = field(default=DEFAULT_ROOT, metadata=_PLACED)
    """Where the checkpoints live: a directory, or a pool (store='pmem')."""
    strategy: str = "c"
    """How a snapshot is taken: 'c' copy through staging, 'g' a full copy in spare memory first, 'd' direct."""
    concurrency: int = 2
    """Checkpoints in flight at once (PCcheck's N)."""
    writers: int = 4
    """Writer threads per unit of concurrency, one shared pool (PCcheck's p)."""
    chunk_mb: int = 64
    """Staging chunk size."""
    staging_mb: int | None = None
    """Bound on staging memory (None: concurrency checkpoints' worth, at most half the RAM)."""
    store: str = field(default="root", metadata=_PLACED)
    """'root' (step directories), 's3' (step prefixes in a bucket: root='s3://bucket/prefix', chosen by such a
    root), 'path' (the caller's paths and URLs) or 'pmem' (pool models)."""
    format: str = "torch"
    """'torch' (what torch.load reads) or 'safetensors'."""
    keep: int = field(default=2, metadata=_PLACED)
    """Committed checkpoints kept (0: all)."""
    verify: bool = True
    """Check every CRC on load."""
    policy: str = "wait"
    """'wait' for a free slot, or 'skip' the save (with a warning) when concurrency are in flight."""
    direct_io: bool = True
    """O_DIRECT writes where the filesystem allows."""
    commit_timeout_s: float = 600.0
    """The longest wait for the other ranks of a commit (and for a free slot)."""
    distributed: bool | None = field(default=None, metadata=_PLACED)
    """None: every rank of an initialised process group saves and commits together; False: alone."""
    model: str | None = field(default="default", metadata=_PLACED)
    """The pool model checkpoints go to (store='pmem')."""
    pool_mb: int | None = None
    """Size of a new pool."""
    persist: str = "auto"
    """How a pool's writes are made durable: 'auto', 'fence' or 'msync' (docs/pmem.md)."""
    on_error: str = "raise"
    """'raise' a failed checkpoint at the next call, or 'warn' and keep training on the previous one."""
    stall_timeout_s: float = DEFAULT_STALL_S
    """A wait of the write path that sees no progress for this long fails its checkpoint."""
    tiers: tuple[str, ...] | None = field(default=None, metadata=_PLACED)
    """Places fastest first, e.g. ('/dev/shm/run7', '/ssd/run7'): a save commits to the first at memory
    speed and is persisted behind it to each later one from that committed copy; the last is the root, which
    may be a bucket's prefix ('s3://bucket/run7': the object store, drained to in the background).
    With store='path' (checkpoints named by the caller's paths: FastCheckpointIO, DeepSpeed), one
    memory tier, e.g. ('/dev/shm/run7',): the caller's paths are the last tier. None: no tiers."""
    tier_keep: tuple[int, ...] | None = field(default=None, metadata=_PER_TIER)
    """Committed checkpoints kept on each tier (None: 1 on each tier before the last, `keep` on the last)."""
    persist_every: int = field(default=1, metadata=_PLACED)
    """With tiers: every n-th checkpoint committed on the memory tier is persisted behind it; the others
    live in memory alone (and in a partner's, with replicas=1) until a newer one replaces them. close() and
    a preemption persist the newest. 1: every one. Checkpoints named by path are each persisted."""
    replicas: int = field(default=0, metadata=_PLACED)
    """1: each rank's memory-tier part is also kept in a partner rank's memory tier, on another node when
    there is one (sent over the job's process group, CRC-checked on arrival); 0: none. Needs tiers."""
    preempt_signal: int | str | None = field(default=None, metadata=_PLACED)
    """A signal (signal.SIGTERM, 'SIGTERM') on which every rank agrees on one step, checkpoints it and exits
    (Checkpointer.at_step_end); None: off."""
    preempt_grace_s: float = field(default=30.0, metadata=_PLACED)
    """From the signal: the time the checkpoint has to become durable on the last tier before the process ends."""
    endpoint: str | None = None
    """The S3 server of an s3:// root (e.g. 'http://127.0.0.1:8333'); None: the one AWS tools find
    (AWS_ENDPOINT_URL, the config file; else AWS's own for the region)."""

    def __post_init__(self) -> None:
        if self.tiers is not None:  # a Hydra list or any sequence: one frozen spelling
            tiers = tuple(self.tiers) if isinstance(self.tiers, (list, tuple)) else self.tiers
            object.__setattr__(self, "tiers", tiers)
            if isinstance(tiers, tuple) and self.store == "root" and self.root in (None, DEFAULT_ROOT) and tiers:
                object.__setattr__(self, "root", tiers[-1])
        if self.store == "root" and isinstance(self.root, str) and self.root.startswith("s3://"):
            object.__setattr__(self, "store", "s3")  # an s3:// root is a bucket's prefix
        for name in PER_TIER:
            if isinstance(getattr(self, name), list):  # a Hydra list or a plugin's: one frozen spelling
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.preempt_signal is not None:
            from .preempt import signal_number
            try:
                object.__setattr__(self, "preempt_signal", signal_number(self.preempt_signal))
            except (AttributeError, TypeError, ValueError):
                raise ConfigError(f"preempt_signal must be a signal (signal.SIGTERM, 'SIGTERM', 15) or None, "
                                  f"got {self.preempt_signal!r}") from None
        self._check()

    def keep_on_tiers(self) -> tuple[int, ...]:
        """How many committed checkpoints each tier keeps (tiers set; store='path': the memory tier's)."""
        if self.tier_keep is not None:
            return self.tier_keep
        if self.store == "path":
            return (1,)
        return (1,) * (len(self.tiers) - 1) + (self.keep,)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CheckpointerConfig":
        """From keywords; an unknown one is a ConfigError naming the valid ones."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"unknown fastckpt setting(s) {unknown}; valid: {sorted(names)}")
        return cls(**d)

    def writing(self) -> dict[str, Any]:
        """The settings of how checkpoints are written: every field but PLACEMENT's."""
        return {k: getattr(self, k) for k in WRITING}

    def _check(self) -> None:
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
        if self.store == "root" and isinstance(self.root, str):
            local_place(self.root, "the root")
        if self.store == "pmem" and self.root is not None:
            check_device_path(self.root)
        if self.store == "s3":
            from .store.s3.place import S3Place
            if not isinstance(self.root, str) or not self.root.startswith("s3://"):
                raise ConfigError(f"store='s3' needs root='s3://bucket/prefix', got {self.root!r}")
            S3Place.parse(self.root)
        if self.endpoint is not None and (not isinstance(self.endpoint, str) or not URL.match(self.endpoint)):
            raise ConfigError(f"endpoint must be the S3 server's URL (e.g. 'https://s3.example.com'), got "
                              f"{self.endpoint!r}")
        check_seconds("preempt_grace_s", self.preempt_grace_s)
        if self.preempt_signal is not None:
            import signal
            if self.preempt_signal not in set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}:
                raise ConfigError(f"preempt_signal {self.preempt_signal!r} is not a signal a handler can catch")
        if self.replicas not in (0, 1) or isinstance(self.replicas, bool):
            raise ConfigError(f"replicas must be 0 or 1, got {self.replicas!r}")
        if not isinstance(self.persist_every, int) or isinstance(self.persist_every, bool) or self.persist_every < 1:
            raise ConfigError(f"persist_every must be an integer >= 1 (1: every checkpoint persisted behind the "
                              f"memory tier), got {self.persist_every!r}")
        if self.tiers is not None:
            self._check_tiers()
        elif self.persist_every != 1:
            raise ConfigError("persist_every needs tiers (the places, fastest first)")
        else:
            given = [name for name in PER_TIER if getattr(self, name) is not None] + (["replicas"] if self.replicas
                                                                                     else [])
            if given:
                raise ConfigError(f"{given[0]} needs tiers (the places, fastest first)")

    def _check_tiers(self) -> None:
        tiers = self.tiers
        bucket_last = self.store != "path" and isinstance(tiers, tuple) and bool(tiers) and isinstance(
            tiers[-1], str) and tiers[-1].startswith("s3://")  # an object store: the last tier only
        for i, tier in enumerate(tiers if isinstance(tiers, tuple) else ()):
            if isinstance(tier, str) and not (bucket_last and i == len(tiers) - 1):
                local_place(tier, "the tier" if self.store == "path" or not tier.startswith("s3://") else
                            "the tier (an s3:// tier is the last one: tiers=['/dev/shm/run7', 's3://bucket/run7'])")
        if self.store == "path":
            return self._check_tiers_before_paths()
        if not isinstance(tiers, tuple) or len(tiers) < 2 or not all(isinstance(t, str) and t for t in tiers):
            raise ConfigError(f"tiers must be two or more paths, fastest first (e.g. ['/dev/shm/run7', "
                              f"'/ssd/run7']), got {tiers!r}")
        places = [os.path.abspath(t) for t in (tiers[:-1] if bucket_last else tiers)]
        if len(set(places)) != len(places) or any(
                a != b and b.startswith(a + os.sep) for a in places for b in places):
            raise ConfigError(f"tiers must be separate places (none inside another), got {list(tiers)}")
        if self.store != ("s3" if bucket_last else "root"):
            raise ConfigError(f"tiers need store='root' (checkpoints named by fastckpt), not store={self.store!r}")
        last = tiers[-1].rstrip("/") if bucket_last else places[-1]
        if not isinstance(self.root, str) or (self.root.rstrip("/") if bucket_last else os.path.abspath(self.root)) != last:
            raise ConfigError(f"root is the last tier ({tiers[-1]!r}), got root={self.root!r}: "
                              "leave root out or pass the last tier")
        self._check_per_tier(len(tiers), f"each of the {len(tiers)} tiers")
        keep = self.tier_keep
        if keep is not None and any(not isinstance(k, int) or isinstance(k, bool) or k < (0 if i == len(tiers) - 1
                                                                                           else 1)
                                    for i, k in enumerate(keep)):
            raise ConfigError(f"tier_keep must give each of the {len(tiers)} tiers a count (>= 1; the last "
                              f"may be 0: all kept), got {keep!r}")

    def _check_per_tier(self, n: int, which: str) -> None:
        """Every setting with one value per tier (PER_TIER) is a list of exactly n values, one for
        `which`: a list that is short or long is a ConfigError here, never an IndexError on a
        commit thread later nor a tier that silently keeps another tier's count."""
        for name in PER_TIER:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, tuple) or len(value) != n):
                count = f"{len(value)} value{'s' * (len(value) != 1)}" if isinstance(value, tuple) else "no list"
                raise ConfigError(f"{name} must give {which} one value ({n} in all), got {count}: {value!r}")


    def _check_tiers_before_paths(self) -> None:
        """store='path': one memory tier in front of the caller's paths."""
        tiers, keep = self.tiers, self.tier_keep
        if not isinstance(tiers, tuple) or len(tiers) != 1 or not isinstance(tiers[0], str) or not tiers[0]:
            raise ConfigError(f"tiers in front of checkpoints named by path is one place, the memory tier (e.g. "
                              f"['/dev/shm/run7']; the paths are the last tier), got {tiers!r}")
        self._check_per_tier(1, "the memory tier (the paths behind it keep what their framework keeps)")
        if keep is not None and (not isinstance(keep[0], int) or isinstance(keep[0], bool) or keep[0] < 1):
            raise ConfigError(f"tier_keep in front of checkpoints named by path is one count >= 1 (the memory "
                              f"tier's), got {keep!r}")
        if self.replicas:
            raise ConfigError("replicas need store='root' (checkpoints named by fastckpt, saved by every rank "
                              "together); checkpoints named by path are each process's own")
        if self.persist_every != 1:
            raise ConfigError("persist_every needs store='root' (checkpoints named by fastckpt): a checkpoint "
                              "named by path is always persisted to its path")


PLACEMENT = tuple(f.name for f in dataclasses.fields(CheckpointerConfig) if f.metadata.get("placement"))
PER_TIER = tuple(f.name for f in dataclasses.fields(CheckpointerConfig) if f.metadata.get("per_tier"))
WRITING = tuple(f.name for f in dataclasses.fields(CheckpointerConfig) if f.name not in PLACEMENT)


URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")  # s3://, gs://, file://, ...


def local_place(path, what: str) -> str:
    """path, when it is a local path; a one-line ConfigError when it is a URL (`s3://bucket/run`),
    which, taken for a local path, would silently become a folder named `s3:` and leave the bucket
    empty. what: the place, for the message ("the root", "a tier", "the DCP checkpoint")."""
    p = os.fspath(path)
    if isinstance(p, str) and URL.match(p):
        scheme = p.split("://", 1)[0]
        where = (" (an s3:// URL is the root of a Checkpointer: Checkpointer('s3://bucket/run'))"
                 if scheme == "s3" else "")
        raise ConfigError(f"{what} {p!r} is a URL: fastckpt has no {scheme}:// store here, only local paths (it "
                          f"makes no folder named '{scheme}:'); give a local folder{where}")
    return p


def check_seconds(name: str, value) -> None:
    """A setting that is a number of seconds > 0 (a ConfigError naming it otherwise)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{name} must be a number of seconds > 0, got {value!r}")


DEFAULTS = CheckpointerConfig()


BY_PATH = ("tiers", "tier_keep")  # PLACEMENT's settings that checkpoints named by path take as given


def refuse_placement(settings: Mapping[str, Any], given: tuple[str, ...] = BY_PATH) -> None:
    """A ConfigError naming any PLACEMENT field among settings given to checkpoints named by path,
    but those they take as `given` (the memory tier in front, where they are first placed)."""
    placed = sorted(set(settings) & set(PLACEMENT) - set(given))
    if placed:
        raise ConfigError(f"{placed} are not settings here: checkpoints named by path decide where they "
                          f"live, how many are kept and which ranks save; the settings are "
                          f"{sorted(WRITING + given)}")


def placed_by_path(given: "CheckpointerConfig | Mapping[str, Any]", *, pool: Optional[str] = None,
                   distributed: Optional[bool] = False) -> "CheckpointerConfig":
    """The settings of checkpoints named by path (fastckpt.named.NamedCheckpoints), placed: the
    path store (with a memory tier in front when the settings' `tiers` name one), or with `pool`
    the pool's models named by path; `distributed` as the Checkpointer's. given: a mapping of
    every setting but PLACEMENT's others (a ConfigError names any of those), or a front end's
    CheckpointerConfig. The copy is checked as it is made."""
    tiers = given.tiers if isinstance(given, CheckpointerConfig) else given.get("tiers")
    if tiers is not None and not isinstance(tiers, (list, tuple)):
        raise ConfigError(f"tiers is a list of paths (e.g. ['/dev/shm/run7']), got {tiers!r}")
    if pool is not None:
        if tiers:
            raise ConfigError("tiers and pool both name where checkpoints go first: give one of them")
        where: dict = dict(root=os.fspath(pool), store="pmem", model=None)
    else:  # a tier_keep without tiers: the config's own check says so
        where = dict(store="path", tiers=tuple(os.fspath(t) for t in tiers) if tiers is not None else None)
    if isinstance(given, CheckpointerConfig):
        return dataclasses.replace(given, distributed=distributed, **where)
    refuse_placement(given)
    return CheckpointerConfig.from_dict(dict(given, **where, distributed=distributed))


def given_one_way(settings: Any, keywords: dict) -> "CheckpointerConfig | dict":
    """What a front end (Checkpointer, FastCheckpointIO, FastStager, FastStorageWriter) was given,
    one way: one CheckpointerConfig or a mapping of settings (`settings=`), or keywords; a
    TypeError of one line otherwise (a setting passed by position lands in `settings`). Returns
    the config, or a dict of the settings for the caller to make one from."""
    if settings is not None and not isinstance(settings, (CheckpointerConfig, Mapping)):
        raise TypeError(f"settings= takes a CheckpointerConfig, got {settings!r}; pass each setting by "
                        "keyword (strategy='c', concurrency=4, ...)")
    if settings is not None and keywords:
        raise TypeError("pass the settings either as one CheckpointerConfig or as keywords, not both")
    if isinstance(settings, CheckpointerConfig):
        return settings
    return dict(settings if settings is not None else keywords)


def with_root(given: "CheckpointerConfig | dict", root: Any) -> "CheckpointerConfig":
    """The settings a Checkpointer(root, ...) runs with: given_one_way's, their root replaced by
    `root` where one is given (None: the settings' own)."""
    if not isinstance(given, CheckpointerConfig):
        return CheckpointerConfig.from_dict(dict(given, root=root if root is not None else given.get("root")))
    if root is not None and root != given.root:
        return dataclasses.replace(given, root=os.fspath(root))
    return given


GROUP_KEYS = {"strategy": ("concurrency", "writers", "chunk_mb"),
              "store": ("direct_io", "model", "pool_mb", "persist", "endpoint")}
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

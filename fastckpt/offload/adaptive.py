"""TensorIO: Fastensor's unified save/load with an adaptive per-size choice of tool (§4, Alg. 1–2).

Modes:
  "tool"   SpecificTool: one tool for every size.
  "dict"   SpecificDic: the user's dictionary file, {"<size in MB>": tool}; the nearest size wins.
  "aware"  AwareDic: dictionaries learned from measured times during the first uses —
           WDic (write times), RDic (read times), WRDic (write + read) — keyed by the tensor's
           size in MB (two decimals, as in the paper); aware="w" | "r" | "wr" picks which one
           decides. The default is "w": the write is what holds training up (a save waits for
           it; activation offload bounds the bytes being written and prefetches the reads in
           backward), and WDic picks the per-size fastest tool in 99 % of decided transfers
           where WRDic, whose sum of two noisy medians locks onto one of two tools within 1-4 %
           of each other, scored 65 % (benchmarks/RESULTS.md, offload). While a size's entry lacks a tool, the least-tried tool is used (Alg. 1);
           a load of a file records its tool's read time (Alg. 2); WRDic[size] is formed once
           WDic[size] and RDic[size] both hold every tool. `explore` (default 2) is how many
           timed uses every tool gets before a size is decided: the paper's one use lets a
           single outlier (the first use of a size pays for page faults and cold caches)
           decide for good — measured in benchmarks/offload.py. Decisions take the median.
           refresh_every=K forgets everything every K saves, so the choice follows a changing
           machine.
The dictionaries are saved to / loaded from a small JSON file; choice(nbytes) exposes the
decision a save of that size would take now.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import threading
import time

import torch

from ..errors import ConfigError
from ..fsutil import write_atomic
from . import tensor_file as tf
from .io_tools import TOOLS, available_tools, read_tensor, write_tensor

MODES = ("tool", "dict", "aware")
AWARE_MODES = ("w", "r", "wr")
SAMPLES = 5  # times kept per (size, tool)
EXPLORE = 2  # timed uses of every tool for a size before the dictionary decides it


def size_key(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.2f}"


class TensorIO:
    def __init__(self, mode: str = "aware", aware: str = "w", tool: str | None = None,
                 dict_path: str | None = None, learned_path: str | None = None,
                 refresh_every: int | None = None, tools: tuple[str, ...] | None = None, verify: bool = True,
                 explore: int = EXPLORE):
        if mode not in MODES:
            raise ConfigError(f"unknown offload mode {mode!r}; choose one of {', '.join(MODES)}")
        if aware not in AWARE_MODES:
            raise ConfigError(f"unknown aware mode {aware!r}; choose one of {', '.join(AWARE_MODES)}")
        if mode == "tool" and tool not in TOOLS:
            raise ConfigError(f"mode='tool' needs tool= one of {', '.join(TOOLS)}, got {tool!r}")
        if tools is not None and set(tools) - set(TOOLS):
            raise ConfigError(f"unknown tool(s) {sorted(set(tools) - set(TOOLS))}; known: {', '.join(TOOLS)}")
        if refresh_every is not None and (not isinstance(refresh_every, int) or refresh_every < 1):
            raise ConfigError(f"refresh_every must be a positive integer or None, got {refresh_every!r}")
        if not isinstance(explore, int) or not 1 <= explore <= SAMPLES:
            raise ConfigError(f"explore must be an integer from 1 to {SAMPLES}, got {explore!r}")
        self.mode, self.aware, self.tool, self.verify, self.explore = mode, aware, tool, verify, explore
        self.refresh_every, self.learned_path = refresh_every, learned_path
        self.user_dict = _read_user_dict(dict_path) if mode == "dict" else {}
        self._wanted = tuple(tools) if tools is not None else TOOLS
        self._usable: dict[tuple[str, bool], tuple[str, ...]] = {}
        self.unavailable: dict[str, str] = {}
        self.wdic: dict = {}
        self.rdic: dict = {}
        self.wrdic: dict = {}
        self.uses = 0
        self._lock = threading.Lock()
        self._probing = threading.Lock()  # one probe of a folder, however many threads ask at once
        if learned_path and os.path.exists(learned_path):
            self.load_dictionaries(learned_path)

    # -- the tools usable here ------------------------------------------------
    def candidates(self, directory: str, cuda: bool = False) -> tuple[str, ...]:
        key = (os.path.abspath(directory), cuda)
        if key not in self._usable:
            with self._probing:
                if key not in self._usable:
                    found = available_tools(directory, cuda)
                    self.unavailable.update({t: why for t, why in found.items() if why and t in self._wanted})
                    usable = tuple(t for t in self._wanted if found.get(t) is None)
                    if not usable:
                        raise OSError(f"no tensor I/O tool works in {directory}: {self.unavailable}")
                    self._usable[key] = usable
        return self._usable[key]

    # -- the choice (Algorithm 1) -----------------------------------------------
    def choice(self, nbytes: int, directory: str = ".", cuda: bool = False,
               only: tuple[str, ...] | None = None) -> str:
        """The tool a save of nbytes into directory would use now (among `only`, when given)."""
        tools = self.candidates(directory, cuda)
        if only is not None:
            tools = tuple(t for t in tools if t in only)
            if not tools:
                raise OSError(f"none of the tools {', '.join(only)} is usable in {directory}")
        if self.mode == "tool":
            if self.tool not in tools:
                raise OSError(f"tool {self.tool!r} is unavailable here: "
                              f"{self.unavailable.get(self.tool, 'not for this tensor')}")
            return self.tool
        if self.mode == "dict":
            return _nearest(self.user_dict, nbytes, tools)
        key = size_key(nbytes)
        with self._lock:
            w, r, n = self.wdic.get(key, {}), self.rdic.get(key, {}), self.explore
            if self.aware == "wr" and _complete(w, tools, n) and _complete(r, tools, n):
                return _best(self.wrdic[key], tools)
            if self.aware == "r" and _complete(r, tools, n):
                return _best(r, tools)
            if _complete(w, tools, n):  # decides by write times while reads are still being learned
                return _best(w, tools)
            return min(tools, key=lambda t: len(w.get(t, ())))  # the least-tried next: round robin

    # -- saving and loading -----------------------------------------------------
    def save(self, t: torch.Tensor, path: str) -> str:
        """Writes t to path with the chosen tool; returns the tool."""
        path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(path))
        tool = self.choice(t.numel() * t.element_size(), directory, t.is_cuda)
        t0 = time.perf_counter()
        write_tensor(t, path, tool)
        self.record("w", t.numel() * t.element_size(), tool, time.perf_counter() - t0)
        with self._lock:
            self.uses += 1
            if self.refresh_every and self.uses % self.refresh_every == 0:
                self.wdic, self.rdic, self.wrdic = {}, {}, {}
        return tool

    def load(self, path: str, device=None) -> torch.Tensor:
        """Reads a tensor file whichever tool wrote it (the header says); records the read time."""
        path = os.fspath(path)
        h = tf.read(path)
        t0 = time.perf_counter()
        t = read_tensor(path, device, self.verify, header=h)
        self.record("r", h["nbytes"], h["tool"], time.perf_counter() - t0)
        return t

    def record(self, kind: str, nbytes: int, tool: str, seconds: float) -> None:
        """A measured write ("w") or read ("r") time; completes WRDic when it can (Algorithm 2)."""
        key = size_key(nbytes)
        with self._lock:
            dic = self.wdic if kind == "w" else self.rdic
            times = dic.setdefault(key, {}).setdefault(tool, [])
            times.append(seconds)
            del times[:-SAMPLES]
            w, r = self.wdic.get(key, {}), self.rdic.get(key, {})
            both = set(w) & set(r)  # WRDic decides once it holds every usable tool (see choice)
            if both:
                self.wrdic[key] = {t: [statistics.median(w[t]) + statistics.median(r[t])] for t in both}

    # -- persistence ------------------------------------------------------------
    def dictionaries(self) -> dict:
        with self._lock:
            return {"version": 1, "wdic": self.wdic, "rdic": self.rdic, "wrdic": self.wrdic}

    def save_dictionaries(self, path: str | None = None) -> str:
        path = path or self.learned_path
        if not path:
            raise ConfigError("save_dictionaries needs a path (or learned_path= at construction)")
        write_atomic(path, json.dumps(self.dictionaries(), indent=1).encode())
        return path

    def load_dictionaries(self, path: str) -> None:
        try:
            with open(path, "rb") as f:
                d = json.loads(f.read())
            if d.get("version") != 1:
                raise ValueError(f"version {d.get('version')!r}")
            dics = [{str(k): {str(t): [float(x) for x in v] for t, v in e.items()} for k, e in d[n].items()}
                    for n in ("wdic", "rdic", "wrdic")]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"{path} is not a fastckpt offload dictionary file ({e})") from None
        with self._lock:
            self.wdic, self.rdic, self.wrdic = dics


def _complete(entry: dict, tools: tuple[str, ...], n: int) -> bool:
    return all(len(entry.get(t, ())) >= n for t in tools)


def _best(entry: dict, tools: tuple[str, ...]) -> str | None:
    timed = [(statistics.median(v), t) for t, v in entry.items() if t in tools and v]
    return min(timed)[1] if timed else None


def _nearest(user: dict[float, str], nbytes: int, tools: tuple[str, ...]) -> str:
    usable = {mb: t for mb, t in user.items() if t in tools}
    if not usable:
        raise OSError(f"no tool of the user's dictionary is usable here (usable: {', '.join(tools)})")
    mb = max(nbytes / (1 << 20), 1e-6)
    return usable[min(usable, key=lambda k: abs(math.log(max(k, 1e-6) / mb)))]


def _read_user_dict(path: str | None) -> dict[float, str]:
    if not path:
        raise ConfigError("mode='dict' needs dict_path= (a JSON object: size in MB -> tool)")
    try:
        with open(path, "rb") as f:
            raw = json.loads(f.read())
        out = {float(k): str(v) for k, v in raw.items()}
    except (OSError, ValueError, AttributeError) as e:
        raise ConfigError(f"cannot read the offload dictionary {path!r}: {e}") from None
    bad = sorted({v for v in out.values() if v not in TOOLS})
    if bad or not out:
        raise ConfigError(f"offload dictionary {path!r}: unknown tool(s) {bad}; known: {', '.join(TOOLS)}"
                          if bad else f"offload dictionary {path!r} is empty")
    return out

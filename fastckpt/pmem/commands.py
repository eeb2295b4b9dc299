"""The pool's face in the `fastckpt` command: ls, verify, export and repack of a pool."""
from __future__ import annotations

import os
import time

from ..errors import CorruptCheckpointError, NoCheckpointError
from . import layout as L
from .image import image_bytes, read_version
from .pool import Pool


def is_pool(path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(8) == L.MAGIC
    except OSError:
        return False


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return str(n)


def ls_pool(path: str) -> int:
    pool = Pool(path, create=False)
    try:
        info = pool.describe()
        print(f"pool {path}: {_size(pool.size)}, {_size(pool.free_bytes())} free, persistence {info['persist']}")
        models = pool.models()
        if not models:
            print("no models")
            return 1
        for name in sorted(models):
            vs = pool.versions(name)
            print(f"model {name}: {len(vs)} version(s)")
            for v in vs:
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v.desc.time))
                print(f"  {'*' if v.active else ' '} step {v.step:>10} counter {v.counter:>8} {_size(v.nbytes):>12} "
                      f"{when}  slot {v.slot}{'  (current)' if v.active else ''}")
        return 0
    finally:
        pool.close()


def verify_pool(path: str) -> int:
    """Reads every version of every model back with all CRCs checked."""
    pool = Pool(path, create=False)
    bad = 0
    try:
        for name in sorted(pool.models()):
            for v in pool.versions(name):
                try:
                    read_version(pool, v, verify=True)
                    print(f"ok       {name} step {v.step} counter {v.counter}{' (current)' if v.active else ''}")
                except CorruptCheckpointError as e:
                    bad += 1
                    print(f"CORRUPT  {name} step {v.step} counter {v.counter}: {e}")
    finally:
        pool.close()
    print("OK" if not bad else "CORRUPTION FOUND")
    return 1 if bad else 0


def pick(pool: Pool, model: str | None, step: int | None):
    models = pool.models()
    if model is None:
        if len(models) != 1:
            raise NoCheckpointError(f"pool {pool.path} holds {len(models)} models ({', '.join(sorted(models))}); "
                                    "name one with --model")
        model = next(iter(models))
    if model not in models:
        raise NoCheckpointError(f"pool {pool.path} has no model {model!r} (it has: {', '.join(sorted(models))})")
    for v in pool.loadable(model):
        if step is None or v.step == step:
            return v
    raise NoCheckpointError(f"model {model!r} in {pool.path} has no committed version"
                            + (f" of step {step}" if step is not None else ""))


def verify_pointer(path: str) -> str:
    """The pool version a pointer file (left where a pool-backed engine's file would be) stands
    for, read back with every CRC checked; CorruptCheckpointError if it is damaged or gone."""
    import json

    from ..fsutil import read_regular
    body = json.loads(read_regular(path, 4096))
    pool_path, model = str(body["fastckpt_pool"]), str(body["model"])
    try:
        pool = Pool(pool_path, create=False)
    except (OSError, CorruptCheckpointError) as e:
        raise CorruptCheckpointError(f"{path}: points into pool {pool_path}, which cannot be opened ({e})") from None
    try:
        v = pick(pool, model, None)
        read_version(pool, v, verify=True)
        return f"{path}: step {v.step} of model {model!r} in pool {pool_path}, {_size(v.nbytes)}"
    except NoCheckpointError as e:
        raise CorruptCheckpointError(f"{path}: {e}") from None
    finally:
        pool.close()


def export_pool(path: str, model: str | None, out: str, to: str, step: int | None):
    """safetensors: writes the version's bytes (the same file format='safetensors' writes)
    and returns None; torch: returns the state for the caller's torch writer."""
    pool = Pool(path, create=False)
    try:
        v = pick(pool, model, step)
        if to == "torch":
            return read_version(pool, v, verify=True)
        read_version(pool, v, verify=True)  # the bytes are checked before they are handed out
        head, data = image_bytes(pool, v)
        tmp = f"{out}.fastckpt-export.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(head)
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        finally:
            data.release()
        os.replace(tmp, out)
        return None
    finally:
        pool.close()


def repack_pool(path: str, drop: tuple[str, ...], drop_under: tuple[str, ...] = ()) -> int:
    pool = Pool(path, create=False)
    try:
        dirs = [os.path.join(os.path.abspath(d), "") for d in drop_under]
        under = tuple(m for m in pool.models() if any(m.startswith(d) for d in dirs))
        r = pool.repack(drop + under)
    finally:
        pool.close()
    print(f"repacked {path}: dropped {len(r['dropped'])} model(s), released {r['released']} stale version(s) "
          f"and {r['torn']} torn one(s) (claimed, their writer gone), moved {r['moved']}; free {_size(r['free_before'])} -> {_size(r['free_after'])}")
    return 0

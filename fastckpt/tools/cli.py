"""The `fastckpt` command: ls | verify | export | repack | info | tune | goodput (a checkpoint root, file, or pool)."""
from __future__ import annotations

import argparse
import os
import sys
import time

from ..errors import ConfigError
from ..store.s3.place import is_s3


NOTHING = 2  # exit status when there is nothing to list or verify (1 is kept for corruption)


def _nothing(cmd: str, found) -> int:
    print(f"fastckpt {cmd}: {found.note or f'no checkpoints in {found.path}'}", file=sys.stderr)
    if found.temporaries:
        print(f"only files of saves in flight or cut short: {', '.join(e.name for e in found.temporaries)}",
              file=sys.stderr)
    if found.hints:
        print("checkpoints are in: " + ", ".join(found.hints), file=sys.stderr)
    return NOTHING


def _ls(args) -> int:
    from .folder_kinds import described
    from .folders import survey
    from ..pmem.commands import ls_pool
    found = survey(args.root)
    if found.kind == "pool":
        return ls_pool(found.path)
    if not found.entries:
        return _nothing("ls", found)
    print(f"{found.path}: {KINDS.get(found.kind) or described(found.kind) or found.kind}")
    print(f"  {'name':<32} {'step':>8} {'size':>11} {'written':>19}  status")
    for e in found.entries:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.time)) if e.time else "-"
        step = "-" if e.step is None else str(e.step)
        size = "-" if e.bytes is None else _size(e.bytes)
        detail = f" ({e.detail})" if e.detail else ""
        print(f"{'*' if e.latest else ' '} {e.name:<32} {step:>8} {size:>11} {when:>19}  {e.status}{detail}")
    if any(e.latest for e in found.entries):
        print("* the latest, as the folder's own `latest` names it" if found.latest_by == "pointer" else
              "* the newest: the highest training step that can be loaded (then the newest file); what "
              "`fastckpt export` takes")
    if found.temporaries:
        print("not checkpoints: files of saves in flight, or of saves a kill cut short (the next save into this "
              "folder removes them):")
        for e in found.temporaries:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.time)) if e.time else "-"
            size = "-" if e.bytes is None else _size(e.bytes)
            print(f"  {e.name:<32} {'':>8} {size:>11} {when:>19}")
    print("committed/complete: records and sizes checked; `fastckpt verify` reads every byte")
    return 0


KINDS = {"root": "a fastckpt checkpoint root", "s3": "a fastckpt checkpoint root in an object store", "checkpoint": "one checkpoint",
         "files": "a folder of checkpoint files", "file": "one checkpoint file"}  # a plugin's own: folder_kinds


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return str(n)


def _verify(args) -> int:
    from .folders import survey
    from ..pmem.commands import verify_pool
    from ..verify import verify_survey
    found = survey(args.path)
    if found.kind == "pool":
        return verify_pool(found.path)
    if not found.entries:
        return _nothing("verify", found)
    report = verify_survey(found)
    for line in report.lines:
        print(line)
    print("OK: every byte checks" if report.ok else "CORRUPTION FOUND")
    return 0 if report.ok else 1


def _export(args) -> int:
    from .. import progress
    from ..tune.profile import state_bytes
    from ..format import load_file
    from ..save_load import save
    from ..pmem.commands import export_pool, is_pool
    from .folder_kinds import kind_named
    from .folders import survey
    what = ""
    if is_s3(args.src):
        state, what = _export_root(args)
    elif is_pool(args.src):
        state = export_pool(args.src, args.model, args.out, args.to, args.step)
        if state is None:  # safetensors: the version's bytes, copied
            print(f"wrote {args.out} ({_size(os.path.getsize(args.out))}, format {args.to}, byte-identical)")
            return 0
    elif os.path.isfile(args.src):
        state = load_file(args.src, weights_only=not args.trust_pickle)
        what = _step_said(state, os.path.basename(args.src))
    elif not os.path.isdir(args.src):
        raise FileNotFoundError(f"{args.src} does not exist")
    elif kind_named((found := survey(args.src)).kind) is not None:  # a plugin's kind (a DCP checkpoint) reads itself
        state, which = kind_named(found.kind).full_state(args.src, args.step)
        what = f"{which}, all ranks' shards"
    elif found.kind == "files":  # Lightning's folder: the newest that loads, as `ls` marks it
        state, what = _newest_file(found, args)
    else:
        state, what = _export_root(args)
    with progress.shown(state_bytes(state), f"export: writing {args.to}") as bar:
        def moved(done: int, total: int) -> None:
            if bar is not None:
                bar.total, bar.n = total, done  # the file's bytes: the tensors' and the format's own
                bar.refresh()

        size = save(state, args.out, format=args.to, progress=moved, plain=True)
    print(f"wrote {args.out} ({_size(size)}, format {args.to}){': ' + what if what else ''}")
    return 0


def _export_root(args):
    """(the state, which it is) of a Checkpointer's place (a root, an s3:// prefix): the newest
    that loads, or --step's."""
    from .. import progress
    from ..checkpointer import Checkpointer
    ck = Checkpointer(args.src)
    try:
        newest = ck.latest() if args.step is None else None
        with progress.shown(newest.bytes if newest is not None else 0, f"export: reading step {newest.step}"
                            if newest is not None else "export: reading"):
            loaded = ck.load_with_record(step=args.step, rank=args.rank, weights_only=not args.trust_pickle)
    finally:
        ck.close()
    return loaded.state, f"step {loaded.info.step}" + (f"; passed over: {'; '.join(loaded.skipped)}"
                                                       if loaded.skipped else "")


def _step_said(state, name: str) -> str:
    """Which checkpoint an export holds, as its state says (Lightning's records its step)."""
    step = state.get("global_step") if isinstance(state, dict) else None
    return f"step {step} ({name})" if isinstance(step, int) else name


def _newest_file(found, args):
    """(the state, which it is) of the newest checkpoint in a folder of checkpoint files that
    loads, every byte checked (`ls`'s order: the highest step first); --step picks a step."""
    from ..errors import CorruptCheckpointError, NoCheckpointError
    from ..store.path_store import read_path
    passed = []
    for e in found.entries:
        if e.status not in ("complete", "committed") or (args.step is not None and e.step != args.step):
            continue
        try:
            state = read_path(e.path, args.rank, verify=True, weights_only=not args.trust_pickle)
        except CorruptCheckpointError as err:
            passed.append(f"{e.name}: {err}")
            continue
        return state, _step_said(state, e.name) + (f"; passed over: {'; '.join(passed)}" if passed else "")
    which = f"of step {args.step} " if args.step is not None else ""
    raise NoCheckpointError(f"no loadable checkpoint {which}in {found.path}" +
                            (f" (passed over: {'; '.join(passed)})" if passed else "") +
                            "; `fastckpt ls` lists what is there")


def _repack(args) -> int:
    from ..pmem.commands import repack_pool
    return repack_pool(args.pool, tuple(args.drop), tuple(args.drop_under))


def _info(args) -> int:
    import torch

    from .. import _native
    from ..write.gds import kvikio_mode
    feats = dict(_native.features())
    feats["torch"] = torch.__version__
    feats["cuda"] = torch.cuda.is_available()
    feats["kvikio"] = kvikio_mode() or "unavailable"
    for k, v in feats.items():
        print(f"{k:>18}: {v}")
    if args.pool:
        from .folders import survey
        from ..pmem.pool import Pool
        found = survey(args.pool)
        if found.kind != "pool":
            raise ConfigError(f"{found.path} is not a pool ({found.note or KINDS.get(found.kind) or found.kind}); a pool is a file, "
                              "/dev/daxN.M, or a folder holding fastckpt.pool")
        pool = Pool(found.path, create=False)
        for k, v in pool.describe().items():
            print(f"{'pool ' + k:>18}: {v}")
        pool.close()
    return 0


def _tune(args) -> int:
    import json
    import shutil

    import torch

    from ..machine import available_memory
    from ..tune.profile import choose, profile, state_bytes
    if args.like:
        from ..save_load import load
        if not os.path.isfile(args.like):
            raise ConfigError(f"--like takes one checkpoint file; {args.like} "
                              f"{'is a folder (pass one of its files)' if os.path.isdir(args.like) else 'does not exist'}")
        state = load(args.like)
    else:
        state = {"w": torch.randn(int(args.state_gb * (1 << 30)) // 4)}
    m = state_bytes(state)
    where = args.dir if os.path.isdir(args.dir) else os.path.dirname(os.path.abspath(args.dir))
    storage = int(args.storage_gb * (1 << 30)) if args.storage_gb else shutil.disk_usage(where).free
    host = int(args.host_gb * (1 << 30)) if args.host_gb else available_memory() // 2
    from tqdm import tqdm
    with tqdm(total=len(args.ns) * len(args.ps) * args.repeats, desc=f"tune: trial checkpoints of "
              f"{_size(m)}", unit="trial", disable=None, leave=False) as bar:
        staging = {"staging_mb": max(1, host >> 20)} if args.host_gb else {}  # T_w measured as the plan will run
        ms = profile(state, args.dir, ns=args.ns, ps=args.ps, repeats=args.repeats,
                     progress=lambda done, total: bar.update(done - bar.n), **staging)
    for x in ms:
        print(f"N={x.concurrency} p={x.writers}: T_w {x.write_s:.3f} s, {x.per_checkpoint_s:.3f} s per checkpoint")
    plan = choose(ms, m, args.step_s, args.overhead, host_bytes=host, storage_bytes=storage, keep=args.keep)
    for n, why in plan.excluded.items():
        print(f"N={n} not allowed: {why}")
    chunked = f" staging_mb={plan.staging_mb} (less than N checkpoints: chunked)" if plan.staging_mb else ""
    print(f"chosen: concurrency={plan.concurrency} writers={plan.writers} interval={plan.interval} steps{chunked} "
          f"(T_w {plan.write_s:.3f} s, state {m / 2**30:.2f} GiB, step {args.step_s} s, overhead {args.overhead:.0%})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(plan.to_dict(), f, indent=1)
    return 0


def _goodput(args) -> int:
    import json

    from . import goodput as gp
    systems = gp.systems_from(args.systems)
    if args.make_trace:
        if not (args.mtbf and args.duration):
            raise ConfigError("--make-trace needs --mtbf and --duration")
        times = gp.synthetic_trace(args.mtbf, args.duration, args.seed)
        gp.write_trace(args.make_trace, times, f"synthetic: Poisson failures, MTBF {args.mtbf:g} s, "
                                               f"{args.duration:g} s, seed {args.seed}")
        args.trace = args.make_trace
    if args.trace:
        failures = gp.read_trace(args.trace)
        duration = args.duration or (failures[-1] if failures else 0)
    elif args.mtbf and args.duration:
        failures, duration = gp.synthetic_trace(args.mtbf, args.duration, args.seed), args.duration
    else:
        raise ConfigError("give --trace CSV, or --mtbf and --duration")
    if duration <= 0:
        raise ConfigError("the replay needs a positive --duration")
    rows = gp.sweep(systems, args.intervals, failures, duration)
    print(f"{len(failures)} failures in {duration / 3600:.2f} h")
    for r in rows:
        print(f"{r['system']:<28} every {r['interval']:>5}: goodput {r['goodput']:8.3f} it/s "
              f"({r['goodput'] / r['ideal']:6.1%} of ideal), {r['lost_iterations']} iterations redone")
    for name, r in gp.peaks(rows).items():
        print(f"peak {name}: {r['goodput']:.3f} it/s at interval {r['interval']}")
    if args.png:
        gp.plot(rows, args.png, f"goodput vs interval, {len(failures)} failures in {duration / 3600:.1f} h")
        print(f"wrote the plot to {os.path.abspath(args.png)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"failures": len(failures), "duration_s": duration, "rows": rows}, f, indent=1)
        print(f"wrote the figures to {os.path.abspath(args.json)}")
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("fastckpt")
    except PackageNotFoundError:
        return "(not installed)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fastckpt", description="Inspect and convert fastckpt checkpoints.")
    p.add_argument("--version", action="version", version=f"fastckpt {_version()}")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("ls", help="list the checkpoints in a folder any plugin wrote (a Checkpointer root, "
                                  "Lightning's checkpoint folder, a DeepSpeed save folder or tag), a file, or a pool")
    s.add_argument("root")
    s.set_defaults(fn=_ls)
    s = sub.add_parser("verify", help="read every byte of what `ls` lists and check its CRC-32s "
                                      "(exit 0: all good, 1: corruption found, 2: nothing to verify)")
    s.add_argument("path")
    s.set_defaults(fn=_verify)
    s = sub.add_parser("export", help="convert a checkpoint (or a model's version in a pool) to a file")
    s.add_argument("src", help="checkpoint root, file, pool, or a PyTorch DCP checkpoint (or a folder of them)")
    s.add_argument("--model", default=None, help="pools: which model (default: the only one)")
    s.add_argument("out")
    s.add_argument("--step", type=int, default=None, help="default: the newest valid")
    s.add_argument("--rank", type=int, default=0)
    s.add_argument("--to", choices=("torch", "safetensors"), required=True)
    s.add_argument("--trust-pickle", action="store_true",
                   help="a file that pickles more than tensors and plain data: load it anyway, which runs "
                        "code from it (only for files you trust)")
    s.set_defaults(fn=_export)
    s = sub.add_parser("repack", help="reclaim a pool's space: stale versions, dropped models, gaps")
    s.add_argument("pool")
    s.add_argument("--drop", nargs="*", default=[], metavar="MODEL", help="models to remove first")
    s.add_argument("--drop-under", nargs="*", default=[], metavar="DIR",
                   help="remove the models saved by path under DIR (e.g. a deleted DeepSpeed tag)")
    s.set_defaults(fn=_repack)
    s = sub.add_parser("info", help="native features compiled in, CUDA/kvikio availability; a pool's persistence")
    s.add_argument("pool", nargs="?", default=None, help="a pool: report how its stores are made persistent")
    s.set_defaults(fn=_info)
    s = sub.add_parser("tune", help="measure N concurrent checkpoints x p writers here; print N*, p*, interval")
    s.add_argument("dir", help="where the trial checkpoints are written (the training's checkpoint disk)")
    s.add_argument("--step-s", type=float, required=True, help="measured training step time t (s)")
    s.add_argument("--overhead", type=float, default=0.05, help="budget q, a fraction of the step time")
    s.add_argument("--state-gb", type=float, default=1.0, help="size of a synthetic state to profile with")
    s.add_argument("--like", default=None, help="profile with this checkpoint file's state instead")
    s.add_argument("--host-gb", type=float, default=None, help="host memory limit M (default: half of free RAM)")
    s.add_argument("--storage-gb", type=float, default=None, help="storage limit S (default: free space of dir)")
    s.add_argument("--keep", type=int, default=2, help="committed checkpoints the store keeps (Checkpointer keep=)")
    s.add_argument("--ns", type=int, nargs="+", default=[1, 2, 4])
    s.add_argument("--ps", type=int, nargs="+", default=[1, 2, 4])
    s.add_argument("--repeats", type=int, default=3, help="trials per (N, p); the median counts")
    s.add_argument("--out", default=None, help="write the plan and measurements as JSON")
    s.set_defaults(fn=_tune)
    s = sub.add_parser("goodput", help="replay a failure trace against systems' measured costs (PCcheck §5.2.3)")
    s.add_argument("--systems", required=True, help="JSON list of {name, step_s, stall_s, write_s, concurrency, "
                                                    "load_s, restart_s}")
    s.add_argument("--trace", default=None, help="CSV of failure times (s), column time_s")
    s.add_argument("--mtbf", type=float, default=None, help="or: Poisson failures with this mean gap (s)")
    s.add_argument("--duration", type=float, default=None, help="seconds replayed (default: the trace's last)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--make-trace", default=None, metavar="CSV", help="write the synthetic trace here and use it")
    s.add_argument("--intervals", type=int, nargs="+", default=[1, 2, 5, 10, 20, 50, 100, 200, 500])
    s.add_argument("--png", default=None, help="plot goodput vs interval")
    s.add_argument("--json", default=None)
    s.set_defaults(fn=_goodput)
    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except Exception as e:  # noqa: BLE001 - a CLI prints the sentence, not a traceback
        from ..errors import FastckptError, UnsafeCheckpointError
        if isinstance(e, UnsafeCheckpointError):  # the library's advice is for Python callers
            print(f"fastckpt {args.cmd}: {str(e).split(' If you trust')[0]} If you trust this file: "
                  f"fastckpt export ... --trust-pickle", file=sys.stderr)
            return 1
        if isinstance(e, (FastckptError, OSError)):
            print(f"fastckpt {args.cmd}: {e}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())

"""The `fastckpt` command: ls | verify | export | info."""
from __future__ import annotations

import argparse
import os
import sys
import time


def _ls(args) -> int:
    from .store.file_store import FileStore
    rows = FileStore(args.root).listing()
    if not rows:
        print(f"no checkpoints under {args.root}")
        return 1
    print(f"{'step':>10} {'counter':>8} {'size':>12} {'written':>20}  status")
    for path, info, status in rows:
        if info is None:
            print(f"{'-':>10} {'-':>8} {'-':>12} {'-':>20}  {status}  {os.path.basename(path)}")
        else:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.time))
            print(f"{info.step:>10} {info.counter:>8} {_size(info.bytes):>12} {when:>20}  "
                  f"valid ({info.format}, {info.world_size} rank{'s' if info.world_size > 1 else ''})")
    return 0


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return str(n)


def _verify(args) -> int:
    from .verify import verify_path
    report = verify_path(args.path)
    for line in report.lines:
        print(line)
    print("OK" if report.ok else "CORRUPTION FOUND")
    return 0 if report.ok else 1


def _export(args) -> int:
    from tqdm import tqdm

    from .checkpointer import Checkpointer
    from .format import load_file
    from .single_file import save
    if os.path.isfile(args.src):
        state = load_file(args.src)
    else:
        state = Checkpointer(args.src).load(step=args.step, rank=args.rank)
    bars: list = []

    def progress(done: int, total: int) -> None:
        if total < (256 << 20):
            return  # small exports finish before a bar would say anything
        if not bars:
            bars.append(tqdm(total=total, unit="B", unit_scale=True, desc=f"export {args.to}"))
        bars[0].n = done
        bars[0].refresh()

    try:
        size = save(state, args.out, format=args.to, progress=progress)
    finally:
        for bar in bars:
            bar.close()
    print(f"wrote {args.out} ({_size(size)}, format {args.to})")
    return 0


def _info(args) -> int:
    import torch

    from . import _native
    from .cuda_snapshot import kvikio_mode
    feats = dict(_native.features())
    feats["torch"] = torch.__version__
    feats["cuda"] = torch.cuda.is_available()
    feats["kvikio"] = kvikio_mode() or "unavailable"
    for k, v in feats.items():
        print(f"{k:>18}: {v}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fastckpt", description="Inspect and convert fastckpt checkpoints.")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("ls", help="list checkpoints under ROOT")
    s.add_argument("root")
    s.set_defaults(fn=_ls)
    s = sub.add_parser("verify", help="check every byte of ROOT, a checkpoint directory, or FILE")
    s.add_argument("path")
    s.set_defaults(fn=_verify)
    s = sub.add_parser("export", help="convert a checkpoint to the torch or safetensors format")
    s.add_argument("src", help="checkpoint root or file")
    s.add_argument("out")
    s.add_argument("--step", type=int, default=None, help="default: the newest valid")
    s.add_argument("--rank", type=int, default=0)
    s.add_argument("--to", choices=("torch", "safetensors"), required=True)
    s.set_defaults(fn=_export)
    s = sub.add_parser("info", help="native features compiled in, CUDA/kvikio availability")
    s.set_defaults(fn=_info)
    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except Exception as e:  # noqa: BLE001 - a CLI prints the sentence, not a traceback
        from .errors import FastckptError
        if isinstance(e, (FastckptError, OSError)):
            print(f"fastckpt {args.cmd}: {e}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())

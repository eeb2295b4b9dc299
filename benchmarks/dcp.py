"""PyTorch DCP under FSDP2: fastckpt's FastStorageWriter + FastStager against DCP's own, and the bound.

    python benchmarks/dcp.py --gib 1 --runs 3            # 2 gloo ranks on CPU
    python benchmarks/dcp.py --device cuda --ranks 1     # on a lent GPU (contenders marked gpu)

A model under fully_shard on RANKS processes, its parameters and AdamW state about GIB in all,
trains one step, then each contender saves it after each of WARMUP_SAVES + SAVES further steps
(a fresh directory per save, the previous save finished first; the first WARMUP_SAVES of each
process are not counted: every contender allocates its staging and starts its threads there), on
a gloo group of its own:
  dcp.save            DCP's FileSystemWriter, synchronous (it fsyncs every file)
  dcp.async_save      DCP's FileSystemWriter with DCP's DefaultStager (asynchronous staging)
  fastckpt            FastStorageWriter with FastStager
and through torchtitan's checkpoint manager (torchtitan 0.3.0, its OptimizersContainer and LR
schedulers over the same model, a save per step as its Trainer saves, --no-titan: not):
  titan_async         torchtitan's CheckpointManager, async_mode "async"
  titan_pinned        torchtitan's CheckpointManager, async_mode "async_with_pinned_mem" (CUDA only:
                      its DefaultStager's non-blocking copies need an accelerator)
  titan_fastckpt      torchtitan_fastckpt.CheckpointManager, async_mode "async"
For these, "blocked" is the manager's save() plus its maybe_wait_for_staging() (what the Trainer
runs before the next optimizer step) and "durable" runs until its maybe_wait_for_saving().
"Blocked" is what the training loop waits for before its next optimizer step may run:
async_save's own return plus, for DCP's stager, its staging future; for FastStager, the
optimizer step's gate (stager.synchronize_staging); for dcp.save, the whole call. "Durable" runs
until the save's future is done. The bound is an O_DIRECT write of the same number of bytes
(best of 1 and 4 threads, fdatasync) on the same disk in the same run: written just before and
just after fastckpt's saves, their mean (this VM's disk drifts by 10-20 % within minutes, and a
run of every contender takes several). Loads: the last saves of
fastckpt and of dcp.save, on the same ranks (DCP's FileSystemReader vs FastStorageReader, which
checks every CRC; each twice, A B B A, their mean) and fastckpt's resharded to one process, each
from the disk (the checkpoint's pages dropped from the cache first). Medians of RUNS runs (a
warm-up run first, discarded). Rewrites its section of benchmarks/RESULTS.md (--no-results: not).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CONTENDERS = ("dcp_save", "dcp_async", "fastckpt")
TITAN = ("titan_async", "titan_pinned", "titan_fastckpt")


# -- one rank (a child process) ----------------------------------------------
def report_and_exit(rank: int, model, result: dict) -> None:
    """Rank 0 prints the contender's RESULT line (with this rank's share of the bytes: parameters and
    AdamW's two states); every rank leaves the process group and exits."""
    import torch.distributed as dist
    if rank == 0:
        result["rank_bytes"] = sum(p.to_local().numel() * 4 * 3 for p in model.parameters())
        print("RESULT " + json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # never through interpreter shutdown with gloo threads about (tests/workers/fsdp2_worker.py)


def rank_main(a) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from fastckpt.dcp import FastStager, FastStorageReader, FastStorageWriter

    torch.set_num_threads(1)
    dist.init_process_group("cpu:gloo,cuda:nccl" if a.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device(a.device, rank if a.device == "cuda" else 0) if a.device == "cuda" else torch.device("cpu")
    if a.device == "cuda":
        torch.cuda.set_device(dev)
    mesh = init_device_mesh(a.device, (world,))
    width = a.width
    layers = max(1, int(a.gib * (1 << 30) / 3 / 4 / (width * width)))  # fp32 parameters + AdamW's 2 states
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)]).to(dev)
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(4, width, device=dev)

    def step():
        model(x).square().mean().backward()
        optim.step()
        optim.zero_grad()

    out = os.path.join(a.dir, a.contender)
    if a.contender in TITAN:
        return titan_rank(a, model, x, out, rank)
    if a.contender == "torch_checkpointing":
        return torch_checkpointing_rank(a, model, optim, step, out, rank)
    group = dist.new_group(backend="gloo")
    step()
    times = {"blocked": [], "durable": []}
    writer = FastStorageWriter(out, chunk_mb=64) if a.contender == "fastckpt" else None
    stager = FastStager(concurrency=1, writer=writer) if a.contender == "fastckpt" else None
    if a.contender == "dcp_async":
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        cuda = a.device == "cuda"
        dcp_stager = DefaultStager(StagingOptions(cuda, False, True, cuda))
    last = None
    for i in range(a.saves):
        step()
        msd, osd = get_state_dict(model, optim)
        state = {"model": msd, "optim": osd}
        path = os.path.join(out, f"step-{i}")
        dist.barrier()
        t0 = time.perf_counter()
        if a.contender == "dcp_save":
            dcp.save(state, storage_writer=dcp.FileSystemWriter(path), process_group=group)
            blocked = durable = time.perf_counter() - t0
        else:
            if a.contender == "dcp_async":
                r = dcp.async_save(state, storage_writer=dcp.FileSystemWriter(path), async_stager=dcp_stager,
                                   process_group=group)
                r.staging_completion.result()
            else:
                r = dcp.async_save(state, checkpoint_id=path, storage_writer=writer, async_stager=stager,
                                   process_group=group)
                stager.synchronize_staging()  # what the next optimizer step's gate waits for
            blocked = time.perf_counter() - t0
            r.upload_completion.result()
            durable = time.perf_counter() - t0
        times["blocked"].append(blocked)
        times["durable"].append(durable)
        last = path
    if stager is not None:
        stager.close()
        writer.close()
    if a.contender == "dcp_async":
        dcp_stager.close()
    loads: dict[str, list[float]] = {}
    readers = {"load_stock": dcp.FileSystemReader, "load_fastckpt": FastStorageReader}
    # each reader twice, in the order A B B A: each load follows one of its own and one of the
    # other's (the first load after the saves, and a reader after another, read the disk
    # differently on this machine; the order evens that out)
    both = a.contender in ("fastckpt", "dcp_save")  # each reader on these saves; one reader on the others
    order = ["load_stock", "load_fastckpt", "load_fastckpt", "load_stock"] if both else ["load_stock", "load_stock"]
    for name in order:
        msd, osd = get_state_dict(model, optim)
        target = {"model": msd, "optim": osd}
        if rank == 0:
            drop_folder(last)
        dist.barrier()
        t0 = time.perf_counter()
        dcp.load(target, storage_reader=readers[name](last), process_group=group)
        dist.barrier()
        loads.setdefault(name, []).append(time.perf_counter() - t0)
    report_and_exit(rank, model, {"times": times, "loads": loads, "last": last})


def torch_checkpointing_rank(a, model, optim, step, out: str, rank: int) -> None:
    """torch_checkpointing's CheckpointManager on every rank (its DTensor path: each rank's shards, one
    checkpoint), as helpers/peers.TorchCheckpointing configures it; blocked = save() + its lock(),
    written = its write as it is (no fsync), durable = + an fsync of every file of the checkpoint;
    its load into the model's and optimizer's state (nothing checked)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict
    sys.path.insert(0, HERE)
    from helpers import peers
    probe = os.path.join(out, "probe")
    tc = peers.TorchCheckpointing.opened(probe)  # every rank alike: one distributed probe save
    dist.barrier()
    step()
    times = {"blocked": [], "written": [], "durable": []}
    last = None
    for i in range(a.saves):
        step()
        msd, osd = get_state_dict(model, optim)
        path = os.path.join(out, f"step-{i}")
        dist.barrier()
        blocked, written, durable = tc.save({"model": msd, "optim": osd}, path, clear=False)
        for k, v in (("blocked", blocked), ("written", written), ("durable", durable)):
            times[k].append(v)
        dist.barrier()
        last = path
    loads: dict[str, list[float]] = {}
    for _ in range(2):
        msd, osd = get_state_dict(model, optim)
        if rank == 0:
            for folder, _, files in os.walk(last):
                for name in files:
                    drop_folder(os.path.join(folder, name))
        dist.barrier()
        t0 = time.perf_counter()
        tc.load(last, {"model": msd, "optim": osd})
        dist.barrier()
        loads.setdefault("load_tc", []).append(time.perf_counter() - t0)
    tc.close()
    report_and_exit(rank, model, {"times": times, "loads": loads, "last": last, "note": tc.note})


def titan_rank(a, model, x, out: str, rank: int) -> None:
    """The saves of one torchtitan contender, as torchtitan's Trainer makes them."""

    import torch.distributed as dist
    from torchtitan.components.checkpointer import CheckpointManager
    from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer
    from torchtitan.components.optimizer.optimizer import OptimizersContainer, ParamGroupConfig

    from torchtitan_fastckpt import CheckpointManager as FastCheckpointManager

    optimizers = OptimizersContainer.Config(
        param_groups=[ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-4})],
        implementation="foreach").build(model_parts=[model])
    schedulers = LRSchedulersContainer.Config(warmup_steps=1).build(optimizers=optimizers, training_steps=1000)

    class TrainState:
        step = 0

        def state_dict(self):
            return {"step": self.step}

        def load_state_dict(self, sd):
            self.step = sd["step"]

    mode = "async_with_pinned_mem" if a.contender == "titan_pinned" else "async"
    cls = FastCheckpointManager if a.contender == "titan_fastckpt" else CheckpointManager
    extra = {"concurrency": 1} if cls is FastCheckpointManager else {}  # each save waited for, as the others
    checkpointer = cls.Config(enable=True, folder=out, interval=1, async_mode=mode, keep_latest_k=0,
                              last_save_model_only=False, **extra).build(
        dataloader=None, model_parts=[model], optimizers=optimizers, lr_schedulers=schedulers,
        states={"train_state": TrainState()}, sd_adapter=None, base_folder="")

    def step():
        model(x).square().mean().backward()
        checkpointer.maybe_wait_for_staging()
        optimizers.step()
        schedulers.step()
        optimizers.zero_grad()

    step()
    times = {"blocked": [], "durable": []}
    for i in range(a.saves):
        step()
        dist.barrier()
        t0 = time.perf_counter()
        checkpointer.save(i + 1)
        checkpointer.maybe_wait_for_staging()
        times["blocked"].append(time.perf_counter() - t0)
        checkpointer.maybe_wait_for_saving()
        times["durable"].append(time.perf_counter() - t0)
    checkpointer.close()
    report_and_exit(rank, model, {"times": times, "loads": {}, "last": None})


def drop_folder(path: str) -> None:
    """Every file of a checkpoint out of the page cache, so each load reads the disk: DCP's
    buffered writes would leave its files cached, fastckpt's O_DIRECT writes leave none."""
    sys.path.insert(0, HERE)
    from helpers import bounds
    bounds.drop_folder(path)


# -- the parent --------------------------------------------------------------
def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ranks(a, contender: str, dirname: str) -> dict:
    port, procs = free_port(), []
    for r in range(a.ranks):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank-of", contender, "--dir", dirname,
                                       "--gib", str(a.gib), "--saves", str(a.warmup_saves + a.saves),
                                       "--device", a.device,
                                       "--width", str(a.width)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    for p, out in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"{contender}: a rank exited with {p.returncode}:\n{out[-3000:]}")
    res = json.loads(next(line for line in outs[0].splitlines() if line.startswith("RESULT "))[7:])
    res["times"] = {k: v[a.warmup_saves:] for k, v in res["times"].items()}  # each process's first saves warm up
    return res


def resharded_load(path: str) -> float:
    """The last fastckpt save loaded cold in one process as full tensors (DCP's planner reshards)."""
    drop_folder(path)
    code = ("import sys, time, torch, warnings; warnings.simplefilter('ignore');"
            "import torch.distributed.checkpoint as dcp;"
            "from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner;"
            "from torch.distributed.checkpoint.state_dict_loader import _load_state_dict;"
            "from fastckpt.dcp import FastStorageReader; s = {}; t0 = time.perf_counter();"
            "_load_state_dict(s, storage_reader=FastStorageReader(sys.argv[1]), planner=_EmptyStateDictLoadPlanner(),"
            " no_dist=True); print(time.perf_counter() - t0)")
    r = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-3000:])
    return float(r.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--saves", type=int, default=4,
                   help="saves per run and contender after the warm-up ones, their median counts")
    p.add_argument("--warmup-saves", type=int, default=2,
                   help="each contender's first saves in each run's processes, not counted: staging allocated, "
                        "threads started (and FastStager's run earning trust: it copies its first save at once)")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--width", type=int, default=4096, help="the model's square layers (GIB decides how many)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dir", default=os.path.join(HERE, "out", "dcp_work"))
    p.add_argument("--out", default=os.path.join(HERE, "out"))
    p.add_argument("--no-results", action="store_true")
    p.add_argument("--no-titan", action="store_true", help="leave out the torchtitan contenders")
    p.add_argument("--rank-of", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.rank_of:
        a.contender = a.rank_of
        return rank_main(a)
    sys.path.insert(0, HERE)
    from helpers import bounds
    from helpers.results import keep
    rows: dict[str, list[float]] = {}
    notes: dict[str, str] = {}
    total = 0  # the checkpoint's bytes, all ranks': known once the first contender has saved (run 0)
    for run in range(a.runs + 1):  # run 0 warms everything up and is discarded
        # torchtitan's async_with_pinned_mem builds DCP's DefaultStager with non-blocking copies,
        # which needs an accelerator: on CPU it raises, so it runs only with --device cuda
        titan = () if a.no_titan else TITAN if a.device == "cuda" else tuple(c for c in TITAN if c != "titan_pinned")
        rival = ("torch_checkpointing",) if importlib.util.find_spec("torch_checkpointing") else ()
        bound_now = []  # the bound, written just before and just after fastckpt's saves (see below)
        for contender in CONTENDERS + rival + titan:
            shutil.rmtree(a.dir, ignore_errors=True)
            os.makedirs(a.dir)
            if contender == "fastckpt" and run and total:
                bound_now.append(bounds.direct_write_seconds(os.path.join(a.dir, "raw.bin"), total))
                os.unlink(os.path.join(a.dir, "raw.bin"))
            res = ranks(a, contender, a.dir)
            total = res["rank_bytes"] * a.ranks
            if contender == "fastckpt" and run:
                bound_now.append(bounds.direct_write_seconds(os.path.join(a.dir, "raw.bin"), total))
            if run:
                rows.setdefault(f"{contender}_blocked", []).append(statistics.median(res["times"]["blocked"]))
                rows.setdefault(f"{contender}_durable", []).append(statistics.median(res["times"]["durable"]))
                if "written" in res["times"]:
                    rows.setdefault(f"{contender}_written", []).append(statistics.median(res["times"]["written"]))
                if res.get("note"):
                    notes[contender] = res["note"]
                for k, v in res["loads"].items():
                    rows.setdefault(f"{contender}_{k}", []).append(statistics.mean(v))
                if contender == "fastckpt":
                    rows.setdefault("fastckpt_load_resharded_1", []).append(resharded_load(res["last"]))
        if run:
            rows.setdefault("odirect_write", []).append(statistics.mean(bound_now))
        shutil.rmtree(a.dir, ignore_errors=True)
        print(f"  run {run}/{a.runs} done{' (warm-up)' if run == 0 else ''}", flush=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    res = {"gib": a.gib, "bytes": total, "titan": not a.no_titan, "ranks": a.ranks, "device": a.device, "runs": a.runs, "saves": a.saves,
           "warmup_saves": a.warmup_saves,
           "median_s": med, "all_s": rows, "notes": notes}
    text = table(res)
    print(text)
    keep("dcp", a.out, res, text, plot, publish=not a.no_results)


def table(res: dict) -> str:
    m, gb = res["median_s"], res["bytes"] / 1e9
    gpu = " (gpu)" if res["device"] == "cuda" else ""
    lines = [f"### DCP under FSDP2{gpu}: {res['ranks']} ranks, {res['bytes'] / 2**30:.2f} GiB of parameters and AdamW "
             f"state; medians of {res['runs']} runs (each the median of {res['saves']} saves, after "
             f"{res.get('warmup_saves', 0)} warm-up saves of each process)", "",
             "| contender | blocked (s) | until durable (s) | GB/s durable | ratios |", "|---|---:|---:|---:|---|"]
    lines.append(f"| O_DIRECT write + fdatasync of the same bytes (bound) | | {m['odirect_write']:.3f} | "
                 f"{gb / m['odirect_write']:.2f} | |")
    for c, name in (("dcp_save", "DCP `dcp.save`, FileSystemWriter"),
                    ("dcp_async", "DCP `async_save`, FileSystemWriter + DefaultStager"),
                    ("fastckpt", "fastckpt (FastStorageWriter)")):
        ratio = ""
        if c == "fastckpt":
            ratio = (f"durable {m['dcp_async_durable'] / m['fastckpt_durable']:.2f}x faster than DCP async_save, "
                     f"{m['odirect_write'] / m['fastckpt_durable']:.2f}x the O_DIRECT bound; blocked "
                     f"{m['fastckpt_blocked'] / m['dcp_async_blocked']:.2f}x DCP+DefaultStager's")
        lines.append(f"| {name} | {m[f'{c}_blocked']:.3f} | {m[f'{c}_durable']:.3f} | {gb / m[f'{c}_durable']:.2f} | "
                     f"{ratio} |")
    if "torch_checkpointing_blocked" in m:
        lines.append(f"| torch_checkpointing {_version('torch_checkpointing')}: CheckpointManager async save (save + "
                     f"lock()); durable = + an fsync of its files | {m['torch_checkpointing_blocked']:.3f} | "
                     f"{m['torch_checkpointing_durable']:.3f} | {gb / m['torch_checkpointing_durable']:.2f} | "
                     f"written as it is (it never fsyncs) {m['torch_checkpointing_written']:.3f} s; fastckpt durable "
                     f"{m['torch_checkpointing_durable'] / m['fastckpt_durable']:.2f}x sooner, blocked "
                     f"{m['fastckpt_blocked'] / m['torch_checkpointing_blocked']:.2f}x its |")
    else:
        lines.append("| torch_checkpointing | | | | not installed here (`make setup` installs it) |")
    if res.get("titan"):
        lines += ["", "Through torchtitan's checkpoint manager (torchtitan 0.3.0), a save per step as its Trainer "
                  "saves; blocked = save() + maybe_wait_for_staging():", "",
                  "| torchtitan manager | blocked (s) | until durable (s) | ratios |", "|---|---:|---:|---|"]
        for c, name in (("titan_async", "torchtitan `CheckpointManager`, `async`"),
                        ("titan_pinned", "torchtitan `CheckpointManager`, `async_with_pinned_mem`"),
                        ("titan_fastckpt", "`torchtitan_fastckpt.CheckpointManager`, `async`")):
            if f"{c}_blocked" not in m:
                lines.append(f"| {name} | | | not run: needs CUDA (DCP's DefaultStager with non-blocking copies "
                             "raises without an accelerator) |")
                continue
            ratio = ""
            if c == "titan_fastckpt":
                ratio = (f"blocked {m['titan_fastckpt_blocked'] / m['titan_async_blocked']:.2f}x stock async's"
                         + (f", {m['titan_fastckpt_blocked'] / m['titan_pinned_blocked']:.2f}x stock "
                            "async_with_pinned_mem's" if "titan_pinned_blocked" in m else "")
                         + f"; durable {m['titan_async_durable'] / m['titan_fastckpt_durable']:.2f}x faster than stock async")
            lines.append(f"| {name} | {m[f'{c}_blocked']:.3f} | {m[f'{c}_durable']:.3f} | {ratio} |")
    lines += ["", "| load, from the disk (page cache dropped) | seconds |", "|---|---:|",
              f"| DCP FileSystemReader, {res['ranks']} ranks (of DCP's save) | {m['dcp_save_load_stock']:.3f} |",
              f"| DCP FileSystemReader, {res['ranks']} ranks (of fastckpt's save) | {m['fastckpt_load_stock']:.3f} |",
              f"| FastStorageReader (every CRC checked), {res['ranks']} ranks | {m['fastckpt_load_fastckpt']:.3f} |",
              *([f"| FastStorageReader, {res['ranks']} ranks (of DCP's save: the zip records' CRCs checked) | "
                 f"{m['dcp_save_load_fastckpt']:.3f} |"] if "dcp_save_load_fastckpt" in m else []),
              f"| FastStorageReader resharded to 1 process (full tensors) | {m['fastckpt_load_resharded_1']:.3f} |",
              *([f"| torch_checkpointing load into the state, {res['ranks']} ranks (nothing checked) | "
                 f"{m['torch_checkpointing_load_tc']:.3f} |"] if "torch_checkpointing_load_tc" in m else [])]
    for who, note in res.get("notes", {}).items():
        lines += ["", f"{who} ran with {note}."]
    return "\n".join(lines)


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(package)
    except PackageNotFoundError:
        return "?"


def plot(res: dict, path: str) -> None:
    """Training blocked, until durable and load for every contender and the bound (helpers/figure.py)."""
    sys.path.insert(0, HERE)
    from helpers import figure
    m = res["median_s"]
    names = [("fastckpt", "fastckpt (FastStorageWriter)"), ("torch_checkpointing", "torch_checkpointing"),
             ("dcp_async", "DCP async_save"), ("dcp_save", "DCP save"), ("titan_fastckpt", "torchtitan + fastckpt"),
             ("titan_async", "torchtitan async")]
    blocked = [(n, m.get(f"{c}_blocked")) for c, n in names]
    durable = [("O_DIRECT write (bound)", m.get("odirect_write"))] + [
        (n + (" + fsync" if c == "torch_checkpointing" else ""), m.get(f"{c}_durable")) for c, n in names]
    load = [("fastckpt, verified", m.get("fastckpt_load_fastckpt")),
            ("DCP FileSystemReader", m.get("dcp_save_load_stock")),
            ("torch_checkpointing", m.get("torch_checkpointing_load_tc"))]
    figure.panels(path, f"DCP under FSDP2, {res['ranks']} ranks, {res['bytes'] / 2**30:.2f} GiB (dcp.py)",
                  [("training blocked", blocked), ("until durable", durable), ("load, cold", load)])


if __name__ == "__main__":
    main()

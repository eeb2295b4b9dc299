"""Checkpoints to S3: fastckpt against DCP + s3torchconnector, and the bound, on one local server.

    python benchmarks/s3.py --gib 1 --runs 3        # 2 gloo ranks on CPU, SeaweedFS on loopback

The same state (GIB of float32 tensors in all, split over RANKS processes) is saved to the same
local S3 server (SeaweedFS's `weed mini`, started here as the tests start it) in RUNS rounds; in each
round every contender in turn starts its ranks, saves WARMUP times to warm up and once measured, each save
into a fresh prefix, and loads that save once (rounds, not one contender's runs in a row: the
server slows and speeds up as its volumes fill and compact, which weighs on every contender alike):
  fastckpt          fastckpt.Checkpointer("s3://...")      blocked: save() + gate(); durable: wait()
                                                             (its record object is in the bucket)
  fastckpt_tiers    fastckpt.Checkpointer(tiers=["/dev/shm/...", "s3://..."]): committed on the
                    memory tier, drained to the bucket in the background; blocked: save() + gate();
                    durable: wait() (drained: the bucket's record is there)
  fastckpt_disk     fastckpt.Checkpointer(a folder on this machine's disk), no bucket: the blocked
                    time the tiers are held to (durable: on the disk)
  fastckpt_dcp      dcp.save through FastStorageWriter("s3://...")   synchronous: blocked = durable
  dcp_s3torch       dcp.save through s3torchconnector's S3StorageWriter (AWS's DCP storage on the
                    CRT client; its client built with this server's endpoint and path-style
                    addressing, since its writer takes no endpoint)   synchronous: blocked = durable
  dcp_fsspec        dcp.save through DCP's FsspecWriter (s3fs; the endpoint from AWS_ENDPOINT_URL)
  bound             one multipart upload of each rank's bytes with fastckpt's client (obstore) at
                    full concurrency, every rank at once
Loads (the last save of each, every rank its own part; RUNS times): fastckpt's Checkpointer.load
and FastStorageReader (every CRC checked), S3StorageReader, FsspecReader. On loopback the server shares the 2
cores with the ranks: its CPU, measured from /proc over each contender's saves, is part of the
bound. Medians; prints a table, writes JSON under --out and its section of benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
CONTENDERS = ("fastckpt", "fastckpt_tiers", "fastckpt_disk", "fastckpt_dcp", "dcp_s3torch", "dcp_fsspec", "bound")
CHECKPOINTERS = ("fastckpt", "fastckpt_tiers", "fastckpt_disk")


def state_for(rank: int, gib: float, ranks: int) -> dict:
    import torch
    per = int(gib * (1 << 30) / ranks / 4)
    g = torch.Generator().manual_seed(rank)
    # keys of this rank's own: DCP takes a plain tensor saved under one name on every rank as replicated
    return {f"rank{rank}.layer{i}": torch.randn(per // 8, generator=g) for i in range(8)}


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def s3torch(cls, url: str):
    """s3torchconnector's DCP storage (S3StorageWriter / S3StorageReader) of url on this server: its
    writer and reader take no endpoint, so their filesystem is one over a client that has it."""
    from s3torchconnector import S3ClientConfig
    from s3torchconnector._s3client import S3Client
    from s3torchconnector.dcp.s3_file_system import S3FileSystem
    region, config = os.environ["AWS_REGION"], S3ClientConfig(force_path_style=True)
    storage = cls(region, url, s3client_config=config)
    storage.fs = S3FileSystem(region, s3_client=S3Client(region, endpoint=os.environ["AWS_ENDPOINT_URL"],
                                                        s3client_config=config))
    return storage


# -- one rank (a child process) ----------------------------------------------
def rank_main(a) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    state = state_for(rank, a.gib, world)
    nbytes = sum(t.nbytes for t in state.values())
    base = f"s3://ckpt/{a.rank_of}-{a.tag}"
    out = {"blocked": [], "durable": [], "load": [], "cpu": 0.0, "bytes": nbytes}
    ck = None
    if a.rank_of in CHECKPOINTERS:
        import fastckpt
        if a.rank_of == "fastckpt":
            ck = fastckpt.Checkpointer(base, keep=2)
        elif a.rank_of == "fastckpt_tiers":
            ck = fastckpt.Checkpointer(tiers=[os.path.join(a.memory, "tier"), base], tier_keep=[1, 2])
        else:
            ck = fastckpt.Checkpointer(os.path.join(a.disk, "root"), keep=2)
    elif a.rank_of == "fastckpt_dcp":
        from fastckpt.dcp import FastStorageWriter
        writer = FastStorageWriter(base)
    whole = torch.cat([t.view(torch.uint8) for t in state.values()]) if a.rank_of == "bound" else None
    for i in range(a.warmup + a.runs):  # the first ones: warm-ups, discarded
        dist.barrier()
        cpu0, t0 = own_cpu(), time.perf_counter()
        if a.rank_of in CHECKPOINTERS:
            p = ck.save(state, step=i)
            ck.gate()
            blocked = time.perf_counter() - t0
            p.wait()
            ck.wait()  # with tiers: drained to the bucket too
        elif a.rank_of == "fastckpt_dcp":
            dcp.save(state, storage_writer=writer, checkpoint_id=f"{base}/step-{i}")
            blocked = time.perf_counter() - t0
        elif a.rank_of == "dcp_s3torch":
            from s3torchconnector.dcp import S3StorageWriter
            dcp.save(state, storage_writer=s3torch(S3StorageWriter, f"{base}/step-{i}"))
            blocked = time.perf_counter() - t0
        elif a.rank_of == "dcp_fsspec":
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter  # DCP exports it only there
            dcp.save(state, storage_writer=FsspecWriter(f"{base}/step-{i}"))
            blocked = time.perf_counter() - t0
        else:  # bound: one multipart upload of this rank's bytes, full concurrency
            import obstore
            from fastckpt.store.s3.client import bucket_for
            from fastckpt.store.s3.place import S3Place
            obstore.put(bucket_for(S3Place.parse(base)).store, f"{a.rank_of}-{a.tag}/{i}/rank-{rank}",
                        memoryview(whole.numpy()), chunk_size=64 << 20, max_concurrency=8)
            blocked = time.perf_counter() - t0
        local = time.perf_counter() - t0
        times = [None] * world
        dist.all_gather_object(times, local)  # durable: once every rank's part is (the slowest rank)
        if i >= a.warmup:
            out["blocked"].append(blocked)
            out["durable"].append(max(times))
            out["cpu"] += own_cpu() - cpu0
    last = a.runs
    for _ in range(a.runs if a.rank_of != "bound" else 0):
        dist.barrier()
        t0 = time.perf_counter()
        if a.rank_of in CHECKPOINTERS:
            got = ck.load()
        else:
            got = {k: torch.empty_like(v) for k, v in state.items()}
            if a.rank_of == "dcp_s3torch":
                from s3torchconnector.dcp import S3StorageReader
                reader = s3torch(S3StorageReader, f"{base}/step-{last}")
            elif a.rank_of == "dcp_fsspec":
                from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
                reader = FsspecReader(f"{base}/step-{last}")
            else:
                from fastckpt.dcp import FastStorageReader
                reader = FastStorageReader(f"{base}/step-{last}")
            dcp.load(got, storage_reader=reader)
        local = time.perf_counter() - t0
        assert all(torch.equal(got[k], v) for k, v in state.items()), f"{a.rank_of}: loaded other bytes"
        times = [None] * world
        dist.all_gather_object(times, local)
        out["load"].append(max(times))
        del got
    if ck is not None:
        ck.close()
    elif a.rank_of == "fastckpt_dcp":
        writer.close()
    if rank == 0:
        with open(a.result, "w") as f:
            json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


def cpu_of(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def run_contender(a, server, name: str, folder: str) -> dict:
    from support.processes import free_port
    result = os.path.join(folder, f"{name}.json")
    port = free_port()
    s0 = cpu_of(server.proc.pid)
    tag = f"{os.getpid()}-{time.time_ns()}"  # this launch's prefixes, the same on every rank
    memory = tempfile.mkdtemp(prefix="s3-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    procs = []
    for rank in range(a.ranks):
        env = dict(os.environ, **server.env(), RANK=str(rank), WORLD_SIZE=str(a.ranks), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]))
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank-of", name, "--result", result,
                                       "--gib", str(a.gib), "--runs", "1", "--warmup", str(a.warmup), "--tag", tag,
                                       "--memory", memory, "--disk", folder],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    shutil.rmtree(memory, ignore_errors=True)
    if any(p.returncode for p in procs):
        tail = "\n".join(o[-1500:] for o in outs)
        raise SystemExit(f"{name} failed:\n{tail}")
    with open(result) as f:
        res = json.load(f)
    res["server_cpu"] = cpu_of(server.proc.pid) - s0
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=list(CONTENDERS))
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--no-publish", action="store_true")
    ap.add_argument("--rank-of", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--tag", default="", help=argparse.SUPPRESS)
    ap.add_argument("--warmup", type=int, default=2, help="saves before the measured one, every contender's "
                    "(staging and memory tiers are faulted in once, as in a run of many saves)")
    ap.add_argument("--memory", help=argparse.SUPPRESS)
    ap.add_argument("--disk", help=argparse.SUPPRESS)
    ap.add_argument("--table", action="store_true", help="the section rewritten from --out's s3.json, nothing run")
    a = ap.parse_args()
    if a.rank_of:
        return rank_main(a)
    if a.table:
        from helpers import results
        path = os.path.join(a.out, "s3.json")
        with open(path) as f:
            res = json.load(f)
        res.setdefault("when", time.strftime("%Y-%m-%d %H:%M", time.localtime(os.path.getmtime(path))))
        a.gib, a.ranks, a.runs, a.warmup = res["gib"], res["ranks"], res["runs"], res.get("warmup", 1)
        return results.write_section("s3", table(res, a))
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from support.s3_server import S3Server
    rows = {}
    with tempfile.TemporaryDirectory(prefix="s3-bench-") as folder:
        server = S3Server(folder).start()
        try:
            # round by round, every contender in each (one save and load each, after its own warm-up):
            # the server's state (its volumes fill, it compacts) weighs on every contender alike
            for round_ in range(a.runs):
                for name in a.only:
                    got = run_contender(a, server, name, folder)
                    r = rows.setdefault(name, {"blocked": [], "durable": [], "load": [], "cpu": 0.0, "server_cpu": 0.0})
                    for k in ("blocked", "durable", "load"):
                        r[k] += got[k]
                    r["cpu"] += got["cpu"]
                    r["server_cpu"] += got["server_cpu"]
                    r["bytes"] = got["bytes"]
                print(f"round {round_ + 1} of {a.runs} done", flush=True)
            for name, r in rows.items():
                med = {k: statistics.median(r[k]) if r[k] else None for k in ("blocked", "durable", "load")}
                r.update({f"{k}_median": v for k, v in med.items()})
                print(f"{name:<14} blocked {med['blocked']:.3f} s  durable {med['durable']:.3f} s  load "
                      + (f"{med['load']:.3f} s" if med['load'] else "-")
                      + f"  ranks' CPU {r['cpu'] / a.runs:.2f} s/save  server CPU {r['server_cpu']:.1f} s", flush=True)
        finally:
            server.stop()
    res = {"gib": a.gib, "ranks": a.ranks, "runs": a.runs, "warmup": a.warmup, "cores": os.cpu_count(), "rows": rows,
           "when": time.strftime("%Y-%m-%d %H:%M")}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "s3.json"), "w") as f:
        json.dump(res, f, indent=1)
    if not a.no_publish and set(a.only) == set(CONTENDERS):
        from helpers import results
        results.write_section("s3", table(res, a))


def table(res: dict, a) -> str:
    rows, bound = res["rows"], res["rows"]["bound"]["durable_median"]
    said = {"fastckpt": "fastckpt Checkpointer → S3", "fastckpt_tiers": "fastckpt tiers: /dev/shm → S3 (loads from /dev/shm)",
            "fastckpt_disk": "fastckpt Checkpointer → local disk (no S3: the blocked time tiers are held to)",
            "fastckpt_dcp": "DCP + fastckpt FastStorageWriter → S3",
            "dcp_s3torch": "DCP + s3torchconnector S3StorageWriter", "dcp_fsspec": "DCP + FsspecWriter (s3fs)",
            "bound": "bound: one multipart upload per rank"}
    lines = [f"## s3.py — {res['when']}, vm ({res['cores']} cores), SeaweedFS `weed mini` on "
             f"loopback, `python benchmarks/s3.py --gib {a.gib:g} --runs {a.runs}`", "",
             f"{a.gib:g} GiB of float32 in all on {a.ranks} gloo ranks, each save into a fresh prefix; medians of "
             f"{a.runs} rounds, each contender's save after {a.warmup} warm-ups. Durable: every rank's part in the bucket (for fastckpt and DCP, the "
             "commit record too). The bound: each rank's bytes as one multipart upload (obstore, 8 parts in "
             "flight), every rank at once: what the server takes from one plain upload, not a hard limit (a "
             "contender's requests may be paced better than one put's). The local disk: a root in a folder of the "
             "machine's disk, the same in every round.", "",
             "| contender | blocked (s) | until durable (s) | durable vs the bound | load (s) | ranks' CPU per save (s) "
             "| server CPU, every save and load (s) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        load = f"{r['load_median']:.3f}" if r.get("load_median") else "-"
        vs = "-" if name == "fastckpt_disk" else f"{bound / r['durable_median']:.2f}x"
        lines.append(f"| {said[name]} | {r['blocked_median']:.3f} | {r['durable_median']:.3f} | "
                     f"{vs} | {load} | {r['cpu'] / res['runs']:.2f} | {r['server_cpu']:.1f} |")
    fast, rival = rows.get("fastckpt"), rows.get("dcp_s3torch")
    if fast and rival:
        ratio = rival["durable_median"] / fast["durable_median"]
        durable = (f"fastckpt is durable {ratio:.2f}x sooner than DCP + S3StorageWriter" if ratio >= 1 else
                   f"DCP + S3StorageWriter is durable {1 / ratio:.2f}x sooner than fastckpt")
        lines += ["", f"{durable}; fastckpt blocks training {rival['blocked_median'] / fast['blocked_median']:.1f}x "
                  f"less and loads {rival['load_median'] / fast['load_median']:.1f}x faster (every CRC checked), and "
                  f"is durable at {bound / fast['durable_median']:.2f}x the bound. Every contender is within "
                  f"{max(r['durable_median'] for r in rows.values()) / bound:.2f}x of the bound: the server "
                  "(SeaweedFS on the same 2 cores) is what limits them all, and its CPU is most of what the cores spend."]
    tiers, disk, fsspec = rows.get("fastckpt_tiers"), rows.get("fastckpt_disk"), rows.get("dcp_fsspec")
    if tiers and disk:
        lines += ["", f"With tiers (/dev/shm → S3) training is blocked {tiers['blocked_median']:.3f} s against "
                  f"{disk['blocked_median']:.3f} s for a save to the local disk alone "
                  f"({tiers['blocked_median'] / disk['blocked_median']:.2f}x), and the save is in the bucket "
                  f"{tiers['durable_median']:.3f} s after it began."]
    if fast and fsspec:
        lines += ["", f"Against DCP + FsspecWriter (s3fs): fastckpt is durable "
                  f"{fsspec['durable_median'] / fast['durable_median']:.2f}x sooner and loads "
                  f"{fsspec['load_median'] / fast['load_median']:.1f}x faster."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()

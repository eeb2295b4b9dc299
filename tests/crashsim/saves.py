"""The programs the power-loss simulator records, one per kind of save, and the states they save.

    python tests/crashsim/saves.py root ROOT   # a Checkpointer, store="root": 4 saves, 2 in flight at once
    python tests/crashsim/saves.py path ROOT   # a Checkpointer, store="path": last.ckpt saved over 3 times
    python tests/crashsim/saves.py dcp ROOT    # torch.distributed.checkpoint.save through FastStorageWriter
    python tests/crashsim/saves.py file_set ROOT  # fastckpt.commit.file_sets: 3 sets of 2 files, 2 in flight
    python tests/crashsim/saves.py pool ROOT   # a Checkpointer, store="pmem": a pool file ROOT/ckpt.pool
    python tests/crashsim/saves.py tiers ROOT  # a Checkpointer with tiers: a memory tier ROOT.memory in
                                               # front of ROOT, 4 saves persisted behind it
    python tests/crashsim/saves.py deepspeed ROOT  # a DeepSpeed engine with a "fastckpt" entry: 3 tags,
                                                   # each copied to ROOT.expected once committed
    python tests/crashsim/saves.py tiers_buffered ROOT  # tiers, each copy to ROOT through the page cache
    python tests/crashsim/saves.py path_tiers ROOT      # path's saves through a memory tier ROOT.memory
    python tests/crashsim/saves.py path_tiers_buffered ROOT  # the same, copies through the page cache
    python tests/crashsim/saves.py replicas ROOT   # 2 gloo ranks: a node-local disk tier ROOT/local in
                                                   # front of ROOT/shared, each part also kept by the partner

Each marks what it was told (mark(): opening ROOT/.sim-mark-TEXT, which the recording shim logs
and nothing creates, and a line `sim-mark TEXT` on stdout for a run without the shim):
"committed:K" once the save of step K (and every one before it) is reported committed (wait()
returned), so a check knows what the disk owes it. state_of(step) is the state a save of that
step holds, the same in the recorded process and in the check.

Two settings of the environment, for the commit conformance suite (tests/fastckpt/commit/
test_commit_protocol.py):
  FASTCKPT_TEST_CRASH_BEFORE=CALL:N:KIND  the N-th unit of commit of class KIND issued (1: the
      first; from `record` on, the N-th whose in_order went through: crash_before) kills the
      process (os._exit, nothing cleaned up, as kill -9) just before its numbered call CALL
      (fastckpt.commit.protocol.CALLS); a set's files are saves whose own units are
      CheckpointCommits, so KIND says which are counted;
  FASTCKPT_TEST_PLANT=nondurable_metadata  DCP's .metadata, the coordinator's part of a gathered
      commit, is written without its fsync: a commit whose record lands before its data is
      durable, which the suite must fail;
  FASTCKPT_TEST_PLANT=nondurable_tier_copy  a memory tier's copy to the root is written without
      its fdatasync: the root's record can land before the copy is durable (the suite must fail).
"""
from __future__ import annotations

import os
import sys

import torch


def say(line: str) -> None:
    """One line to stdout in one write(2): a commit thread's crash message can never run into a
    mark the main thread writes at the same moment (the suite parses both)."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (line + "\n").encode())


def mark(root: str, text: str) -> None:
    """Tells the recording something (the shim logs it; nothing is created), and stdout."""
    say(f"sim-mark {text}")
    try:
        open(os.path.join(root, f".sim-mark-{text}"), "rb").close()
    except FileNotFoundError:
        pass


def state_of(step: int) -> dict:
    """About 2.2 MB: three 1 MiB staging chunks, so a file has several writes in flight."""
    g = torch.Generator().manual_seed(1000 + step)
    return {"model": {"w": torch.randn(512, 1024, generator=g), "b": torch.randn(1024, generator=g)},
            "opt": {"exp_avg": torch.randn(64, 1024, generator=g)}, "step": step}


def root_store(root: str) -> None:
    import fastckpt
    with fastckpt.Checkpointer(root, concurrency=2, keep=2, chunk_mb=1, writers=2) as ck:
        four_saves(ck, root)


def four_saves(ck, root: str) -> None:
    """Steps 1 to 4, 2 and 3 in flight together; "committed:K" once wait() returned."""
    ck.save(state_of(1), step=1)
    ck.wait()
    mark(root, "committed:1")
    ck.save(state_of(2), step=2)
    ck.save(state_of(3), step=3)  # in flight beside step 2
    ck.wait()
    mark(root, "committed:3")
    ck.save(state_of(4), step=4)  # retention removes step 2 once it lands
    ck.wait()
    mark(root, "committed:4")


def tiers(root: str) -> None:
    """root_store's saves through a memory tier beside the root (what a power loss takes with it):
    each committed there, then persisted to the root; "committed:K" once wait() says every save
    up to K is durable on the root."""
    import fastckpt
    with fastckpt.Checkpointer(tiers=[root + ".memory", root], concurrency=2, keep=2, chunk_mb=1,
                               writers=2) as ck:
        four_saves(ck, root)


def tiers_buffered(root: str) -> None:
    """tiers' saves with direct_io=False: each copy to the root goes through the page cache (as on
    a filesystem refusing O_DIRECT), made durable by its own fdatasync."""
    import fastckpt
    with fastckpt.Checkpointer(tiers=[root + ".memory", root], concurrency=2, keep=2, chunk_mb=1, writers=2,
                               direct_io=False) as ck:
        four_saves(ck, root)


REPLICA_TIERS = ("local", "shared")  # replicas' tiers: ROOT/local (a node-local disk), ROOT/shared


def replicas(root: str) -> None:
    """Two gloo ranks on two nodes (FASTCKPT_NODE), each this program's `replicas_rank`: a
    node-local disk tier ROOT/local in front of the shared ROOT/shared, each rank's part also kept
    by its partner beside its own (replicas=1: received into a buffer, written through the page
    cache, fdatasync'ed before the record), 3 saves, the local tier keeping one (a part written into
    a removed one's file); "committed:K" (rank 0) once wait() says every save up to K is durable on
    the shared tier."""
    import socket
    import subprocess
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "replicas_rank", root],
                              env=dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=str(port), FASTCKPT_NODE=f"node-{r}")) for r in (0, 1)]
    codes = [p.wait(timeout=300) for p in procs]
    if codes != [0, 0]:
        raise SystemExit(f"the ranks exited {codes}")


def replicas_rank(root: str) -> None:
    import torch.distributed as dist

    import fastckpt
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    local, shared = (os.path.join(root, t) for t in REPLICA_TIERS)
    with fastckpt.Checkpointer(tiers=[local, shared], replicas=1, tier_keep=[1, 2], concurrency=1, chunk_mb=1,
                               writers=2, commit_timeout_s=120) as ck:
        for step in (1, 2, 3):  # step 3's part written into step 1's file (recycled: tier_keep 1)
            ck.save(state_of(step + 100 * rank), step=step)
            ck.wait()
            if rank == 0:
                mark(root, f"committed:{step}")
    dist.destroy_process_group()


PATH_SAVES = (("last.ckpt", 1), ("epoch=0.ckpt", 2), ("last.ckpt", 3), ("last.ckpt", 4))


def path_store(root: str) -> None:
    """ModelCheckpoint's pattern: a named file saved over again (last.ckpt), another beside it."""
    import fastckpt
    with fastckpt.Checkpointer(root, store="path", concurrency=2, chunk_mb=1, writers=2) as ck:
        for i, (name, step) in enumerate(PATH_SAVES):
            ck.save(state_of(step), step=step, path=os.path.join(root, name))
            ck.wait()
            mark(root, f"committed:{i}")


def path_tiers(root: str, direct_io: bool = True) -> None:
    """path_store's saves through a memory tier beside the root (tiers=[ROOT.memory]): each save of
    a path committed there, then persisted to its path (a hidden sibling, renamed over the path
    once durable); "committed:I" once wait() says save I reached its path."""
    import fastckpt
    with fastckpt.Checkpointer(store="path", tiers=[root + ".memory"], concurrency=2, chunk_mb=1, writers=2,
                               direct_io=direct_io) as ck:
        for i, (name, step) in enumerate(PATH_SAVES):
            ck.save(state_of(step), step=step, path=os.path.join(root, name))
            ck.wait()
            mark(root, f"committed:{i}")


def dcp(root: str) -> None:
    """Two checkpoints, each into a folder of its own, with DCP's own save (no process group)."""
    import torch.distributed.checkpoint as dcp_api

    from fastckpt.dcp import FastStorageWriter
    for step in (1, 2):
        writer = FastStorageWriter(os.path.join(root, f"step-{step}"), step=step)
        dcp_api.save(state_of(step), storage_writer=writer)
        mark(root, f"committed:{step}")
        writer.close()


SET_FILES = ("model.pt", "opt.pt")  # a set's files: state_of(step)'s two parts


def file_set(root: str) -> None:
    """Sets of files (a DeepSpeed tag's shape, without DeepSpeed): each a folder set-K holding two
    fastckpt saves, committed by one record; set 2 in flight beside set 3."""
    from fastckpt.commit.agreement import Agreement
    from fastckpt.commit.file_sets import FileSets
    from fastckpt.named import NamedCheckpoints
    from fastckpt.write.deadline import Deadline
    named = NamedCheckpoints.by_path({"concurrency": 4, "chunk_mb": 1, "writers": 2})
    sets = FileSets(Agreement(), Deadline(60.0), 0.0)
    for step in (1, 2, 3):
        folder = os.path.join(root, f"set-{step}")
        os.makedirs(folder)
        state = state_of(step)
        parts = dict(zip(SET_FILES, ({"model": state["model"]}, {"opt": state["opt"], "step": step})))
        sets.submit(folder, [(os.path.join(folder, n), named.save(parts[n], os.path.join(folder, n), step))
                             for n in SET_FILES], step=step)
        if step == 2:
            continue  # in flight beside set 3
        sets.wait()
        mark(root, f"committed:{step}")
    sets.close()
    named.close()


def crash_before(call: str, nth: int, kind: str) -> None:
    """The nth unit of commit of class `kind` dies just before its call `call` (see the module's
    doc). Before `finish` and `in_order`: the nth issued. From `record` on: the nth whose
    in_order went through, the nth that records (a persist unit that gives way to a newer
    checkpoint, Superseded in its in_order, never records: the next that goes is counted)."""
    import threading

    from fastckpt.commit.ordered import OrderedCommits
    from fastckpt.commit.protocol import CALLS, CommitUnit
    assert call in CALLS, call
    issue, issued, went, lock = OrderedCommits.issue, [0], [0], threading.Lock()
    early = CALLS.index(call) <= CALLS.index("in_order")

    class Crashing(CommitUnit):
        def __init__(self, unit: CommitUnit, issued_as: int):
            self.unit, self.label = unit, unit.label
            self.doomed = early and issued_as == nth

        def _call(self, name: str, *args):
            if self.doomed and name == call:
                say(f"crash before {call} of unit {nth} ({type(self.unit).__name__}: {self.label})")
                os._exit(137)
            return getattr(self.unit, name)(*args)

        def finish(self):
            return self._call("finish")

        def in_order(self, finished):
            out = self._call("in_order", finished)
            if not early and type(self.unit).__name__ == kind:
                with lock:
                    went[0] += 1
                    self.doomed = went[0] == nth
            return out

        def record(self, parts, rank):
            return self._call("record", parts, rank)

        def landed(self, info, error):
            return self._call("landed", info, error)

        def afterwards(self):
            return self._call("afterwards")

        def timed(self, phase, seconds):
            return self.unit.timed(phase, seconds)

    def issuing(self, unit, *args, **kwargs):
        with lock:
            if type(unit).__name__ == kind:
                issued[0] += 1
            issued_as = issued[0] if type(unit).__name__ == kind else 0
        return issue(self, Crashing(unit, issued_as), *args, **kwargs)

    OrderedCommits.issue = issuing


def plant(bug: str) -> None:
    """A deliberately broken commit (see the module's doc)."""
    assert bug in ("nondurable_metadata", "nondurable_tier_copy"), bug
    if bug == "nondurable_tier_copy":
        import fastckpt.store.tier_copy as tier_copy
        from fastckpt import _native

        def copy_part(src, dst, entry, direct_io=True):  # written through the cache, never fdatasync'ed
            with open(src, "rb") as f:
                data = f.read()
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            _native.write_buffered(dst, 0, buf.data_ptr(), len(data), False)
        tier_copy.copy_part = copy_part
        import fastckpt.store.root_store as root_store  # where a tier behind copies a part (put_copy)
        root_store.copy_part = copy_part
        return
    import fastckpt.dcp.metadata as md_file

    encode = md_file.encode

    def write(path: str, metadata):
        raw = encode(metadata)
        with open(path, "wb") as f:  # no fsync, no rename: the record may land before these bytes
            f.write(raw)
        return raw

    md_file.write = write


POOL, MODEL = "ckpt.pool", "run"


def pool(root: str) -> None:
    """The persistent-memory pool on an ordinary file (msync: stores reach the disk whenever the
    kernel writes their pages back, and surely at the msync): 3 saves into its version slots."""
    import fastckpt
    with fastckpt.Checkpointer(os.path.join(root, POOL), store="pmem", model=MODEL, concurrency=1) as ck:
        for step in (1, 2, 3):
            ck.save(state_of(step), step=step)
            ck.wait()
            mark(root, f"committed:{step}")


def deepspeed(root: str) -> None:
    """One rank (gloo, DeepSpeed's CPU accelerator), ZeRO-1: a tag a step, two of them in flight
    at once; each tag's files copied beside the root once it is committed (what a load must give)."""
    import shutil
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                 ("MASTER_PORT", str(port)), ("DS_ACCELERATOR", "cpu")):
        os.environ.setdefault(k, v)
    import deepspeed as ds

    import deepspeed_fastckpt  # noqa: F401  (registers the engine)
    sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "workers"))
    from small_buckets import SMALL_BUCKETS
    ds.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    cfg = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4,
           "zero_optimization": {"stage": 1, **SMALL_BUCKETS},
           "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
           "fastckpt": {"concurrency": 2, "chunk_mb": 1}}
    eng, *_ = ds.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    g = torch.Generator().manual_seed(7)
    for step in (1, 2, 3):
        eng.backward((eng(torch.randn(4, 32, generator=g)) ** 2).mean())
        eng.step()
        eng.save_checkpoint(root, tag=f"global_step{step}")
        if step == 2:
            continue  # in flight beside step 3
        eng.checkpoint_engine.wait()
        for done in range(1, step + 1):
            tag = f"global_step{done}"
            if not os.path.exists(os.path.join(root + ".expected", tag)):
                shutil.copytree(os.path.join(root, tag), os.path.join(root + ".expected", tag))
        mark(root, f"committed:{step}")
    eng.destroy()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    kind, where = sys.argv[1], sys.argv[2]
    if os.environ.get("FASTCKPT_TEST_CRASH_BEFORE"):
        at, n, unit = os.environ["FASTCKPT_TEST_CRASH_BEFORE"].split(":")
        crash_before(at, int(n), unit)
    if os.environ.get("FASTCKPT_TEST_PLANT"):
        plant(os.environ["FASTCKPT_TEST_PLANT"])
    {"root": root_store, "path": path_store, "dcp": dcp, "pool": pool, "deepspeed": deepspeed,
     "file_set": file_set, "tiers": tiers, "tiers_buffered": tiers_buffered, "path_tiers": path_tiers,
     "path_tiers_buffered": lambda r: path_tiers(r, direct_io=False), "replicas": replicas,
     "replicas_rank": replicas_rank}[kind](where)

"""The contenders of gpu_overhead.py, each one training run in this process.

Every run trains the same transformer LM (bf16 autocast and fp32 AdamW on CUDA, fp32 on CPU)
through the same schedule: `warmup` steps (allocator, kernels), `quiet` steps without
checkpoints (the run's own baseline), then `measured` steps with a checkpoint after the
first of every `k`. Each step is timed from its start to the end of its GPU work (a device
synchronize ends it), so a save's cost lands in the steps it slows: the save call itself, a
gate before the next optimizer step, and the background write's share of the host.
After the last step, the drain is the wait until every checkpoint is durable.

Families:
- plain loop: none, torch.save + fsync, DCP `async_save` (default staging, and a
  `DefaultStager` with pinned, asynchronous staging), fastckpt strategies c, g and d;
- Lightning (`Trainer`, the same model): TorchCheckpointIO, AsyncCheckpointIO,
  FastCheckpointIO and FastCheckpointIO with LayerwiseCheckpointing;
- DeepSpeed (ZeRO-2, one rank): the default checkpoint engine and the "fastckpt" entry.

A run returns a dict (JSON): step times after the warm-up, the save call times, the drain,
the checkpoint's bytes and what the run checked of its checkpoints.
"""
from __future__ import annotations

import glob
import os
import shutil
import time
from contextlib import nullcontext

import torch

from fastckpt.demo.train import TinyLM
from fastckpt.tune.profile import state_bytes

PLAIN = ("none", "torch_save", "dcp", "dcp_stager", "fast_c", "fast_g", "fast_d")
LIGHTNING = ("l_torch", "l_async", "l_fast", "l_layerwise")
DEEPSPEED = ("ds_default", "ds_fast")
ALL = PLAIN + LIGHTNING + DEEPSPEED
PEERS = ("torch_save", "dcp", "dcp_stager", "l_torch", "l_async", "ds_default")


class BenchLM(TinyLM):
    """The demo's LM with its causal mask made on the tokens' device."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = torch.nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        return self.head(self.encoder(self.embed(tokens), mask=mask, is_causal=True))


def device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def autocast(dev: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else nullcontext()


def make_model(a, layers: int | None = None) -> BenchLM:
    torch.manual_seed(0)
    return BenchLM(a.vocab, a.d_model, layers or a.layers, heads=a.heads)


def tokens(a, step: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    seq = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g).to(dev, non_blocking=True)
    return seq[:, :-1], seq[:, 1:]


def is_save_step(a, i: int, k: int) -> bool:
    j = i - a.warmup - a.quiet
    return j >= 0 and j % k == 0


def total_steps(a, k: int) -> int:
    return a.warmup + a.quiet + a.intervals * k


# -- the plain loop -----------------------------------------------------------

class TorchSave:
    """torch.save of the whole state, then fsync: on the training thread."""

    def __init__(self, ckdir: str):
        self.ckdir, self.paths = ckdir, []

    def save(self, state, step: int) -> None:
        path = os.path.join(self.ckdir, f"step{step}.pt")
        torch.save(state, path)
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        self.paths.append(path)
        while len(self.paths) > 2:
            os.unlink(self.paths.pop(0))

    def before_update(self) -> None:
        pass

    def drain(self) -> None:
        pass

    def close(self) -> None:
        pass

    def check(self) -> bool:
        return bool(self.paths) and torch.load(self.paths[-1], weights_only=True)["step"] >= 0


class DcpAsync:
    """DCP async_save, one in flight (the previous upload is awaited before the next save).

    stager=False: async_save's own default staging (a synchronous copy to host memory inside
    the call). stager=True: a DefaultStager with pinned memory and asynchronous staging on a
    side stream; the optimizer update waits for its staging to complete (before_update).

    A DefaultStager serves one save: it clears its copy table after every stage, so a reused
    one fails its next stage with KeyError: <class 'type'> — inside the staging future, where
    no later save recovers (seen with torch 2.11 on an H200, 2026-11-26; torch 2.13's
    StateDictStager fails the same way driven directly on CPU; a known upstream bug). So each save gets a fresh stager (its pinned memory allocated again), the
    one way its users can keep saving; the table says so (`stager_fresh`)."""

    FRESH = "torch's DefaultStager clears its copy table after each stage (KeyError: <class 'type'> on reuse)"

    def __init__(self, ckdir: str, stager: bool, dev: torch.device):
        self.ckdir, self.use_stager, self.dev = ckdir, stager, dev
        self.stager = None
        self.reuse_error = self.FRESH if stager else None
        self.response = None
        self.dirs: list[str] = []

    def _new_stager(self):
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        cuda = self.dev.type == "cuda"
        return DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                            use_async_staging=True, use_non_blocking_copy=cuda))

    def save(self, state, step: int) -> None:
        import torch.distributed.checkpoint as dcp
        self.drain()
        path = os.path.join(self.ckdir, f"step{step}")
        if not self.use_stager:
            self.response = dcp.async_save(state, checkpoint_id=path)
        else:
            if self.stager is not None:  # its staging and upload are done (drain above)
                self.stager.close()
            self.stager = self._new_stager()
            self.response = dcp.async_save(state, checkpoint_id=path, async_stager=self.stager)
        self.dirs.append(path)
        while len(self.dirs) > 2:
            shutil.rmtree(self.dirs.pop(0), ignore_errors=True)

    def before_update(self) -> None:
        staging = getattr(self.response, "staging_completion", None)
        if staging is not None:
            staging.result()

    def drain(self) -> None:
        if self.response is not None:
            upload = getattr(self.response, "upload_completion", self.response)
            upload.result()

    def close(self) -> None:
        if self.stager is not None:
            self.stager.close()

    def check(self) -> bool:
        return bool(self.dirs) and os.path.exists(os.path.join(self.dirs[-1], ".metadata"))


class Fastckpt:
    """fastckpt's Checkpointer as the README shows it: save, and gate() before the update."""

    def __init__(self, ckdir: str, strategy: str, concurrency: int):
        import fastckpt
        self.ck = fastckpt.Checkpointer(ckdir, strategy=strategy, concurrency=concurrency, keep=2)

    def save(self, state, step: int) -> None:
        self.ck.save(state, step=step)

    def before_update(self) -> None:
        self.ck.gate()

    def drain(self) -> None:
        self.ck.wait()

    def close(self) -> None:
        self.ck.close()

    def check(self) -> bool:
        info = self.ck.latest(verified=True)
        return info is not None

    def phases(self) -> dict:
        return phases_of([self.ck.stats])


def phases_of(stats_list: list[dict]) -> dict:
    """Where fastckpt's saves spent their time (fastckpt.timings): the mean per save after the
    first, and the first save's own figures."""
    from fastckpt.timings import steady
    first = next((s["timings_first"] for s in stats_list if s.get("timings_first")), None)
    return {"steady": steady(stats_list), "first": first or {}}


def plain_saver(name: str, a, ckdir: str, dev: torch.device):
    if name == "none":
        return None
    if name == "torch_save":
        return TorchSave(ckdir)
    if name in ("dcp", "dcp_stager"):
        return DcpAsync(ckdir, name == "dcp_stager", dev)
    return Fastckpt(ckdir, name[-1], a.concurrency)


def plain_run(a, name: str, k: int, ckdir: str) -> dict:
    dev = device()
    model = make_model(a).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    saver = plain_saver(name, a, ckdir, dev)
    times, calls, nbytes = [], [], 0
    for i in range(total_steps(a, k)):
        t0 = time.perf_counter()
        x, y = tokens(a, i, dev)
        with autocast(dev):
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        if saver is not None:
            saver.before_update()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if saver is not None and is_save_step(a, i, k):
            state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": i}
            nbytes = nbytes or state_bytes(state)
            s0 = time.perf_counter()
            saver.save(state, i)
            calls.append(time.perf_counter() - s0)
        sync(dev)
        times.append(time.perf_counter() - t0)
    d0 = time.perf_counter()
    if saver is not None:
        saver.drain()
    drain = time.perf_counter() - d0
    out = {"times": times[a.warmup:], "calls": calls, "drain": drain, "bytes": nbytes,
           "checked": saver.check() if saver is not None else True}
    if isinstance(saver, Fastckpt):
        out["phases"] = saver.phases()
    if isinstance(saver, DcpAsync) and saver.use_stager:
        out["stager_fresh"] = saver.reuse_error
    if saver is not None:
        saver.close()
    return out


# -- Lightning ----------------------------------------------------------------

def lightning_run(a, name: str, k: int, ckdir: str) -> dict:
    import lightning as L
    from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO
    from lightning_fastckpt import FastCheckpointIO, LayerwiseCheckpointing
    dev = device()

    class LM(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = make_model(a)

        def training_step(self, batch, i):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x).flatten(0, 1).float(), y.flatten())

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    class Schedule(L.Callback):
        """Times every step (synchronized) and saves on the benchmark's schedule, keeping two."""

        def __init__(self):
            self.starts, self.calls, self.paths, self.end = [], [], [], None

        def on_train_batch_start(self, trainer, *_):
            sync(dev)
            self.starts.append(time.perf_counter())

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, i):
            if is_save_step(a, i, k):
                path = os.path.join(ckdir, f"step{i}.ckpt")
                s0 = time.perf_counter()
                trainer.save_checkpoint(path)
                self.calls.append(time.perf_counter() - s0)
                self.paths.append(path)
                if len(self.paths) > 2:
                    trainer.strategy.remove_checkpoint(self.paths.pop(0))

        def on_train_end(self, *_):
            sync(dev)
            self.end = time.perf_counter()

    io = {"l_torch": lambda: TorchCheckpointIO(), "l_async": lambda: AsyncCheckpointIO(TorchCheckpointIO()),
          "l_fast": lambda: FastCheckpointIO(strategy="c", concurrency=a.concurrency),
          "l_layerwise": lambda: FastCheckpointIO(strategy="c", concurrency=a.concurrency)}[name]()
    sched = Schedule()
    callbacks = [sched] + ([LayerwiseCheckpointing()] if name == "l_layerwise" else [])
    steps = total_steps(a, k)
    data = [tokens(a, i, torch.device("cpu")) for i in range(steps)]
    trainer = L.Trainer(max_steps=steps, accelerator="gpu" if dev.type == "cuda" else "cpu", devices=1,
                        precision="bf16-mixed" if dev.type == "cuda" else "32-true", logger=False,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                        callbacks=callbacks, plugins=[io], num_sanity_val_steps=0)
    model = LM()
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=None))  # teardown drains every save
    done = time.perf_counter()
    starts = sched.starts + [sched.end]
    times = [b - a_ for a_, b in zip(starts[:-1], starts[1:])]
    nbytes = os.path.getsize(sched.paths[-1]) if os.path.isfile(sched.paths[-1]) else \
        sum(os.path.getsize(p) for p in glob.glob(os.path.join(sched.paths[-1], "*")))
    checked = "state_dict" in trainer.strategy.checkpoint_io.load_checkpoint(sched.paths[-1])
    out = {"times": times[a.warmup:], "calls": sched.calls, "drain": done - sched.end, "bytes": nbytes,
           "checked": checked}
    if isinstance(io, FastCheckpointIO):
        out["phases"] = phases_of(io.named.timing_stats())
    return out


# -- DeepSpeed ----------------------------------------------------------------

def deepspeed_run(a, name: str, k: int, ckdir: str) -> dict:
    dev = device()
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    if dev.type != "cuda":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import deepspeed_fastckpt  # noqa: F401  (registers the engine)
    deepspeed.init_distributed(dist_backend="nccl" if dev.type == "cuda" else "gloo")
    model = make_model(a, a.ds_layers)
    cfg = {"train_micro_batch_size_per_gpu": a.batch, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
           "zero_optimization": {"stage": 2}, "bf16": {"enabled": dev.type == "cuda"},
           "steps_per_print": 10**9, "wall_clock_breakdown": False}
    if name == "ds_fast":
        cfg["fastckpt"] = {"strategy": "c", "concurrency": a.concurrency}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    times, calls, tags = [], [], []
    for i in range(total_steps(a, k)):
        t0 = time.perf_counter()
        x, y = tokens(a, i, dev)
        loss = torch.nn.functional.cross_entropy(engine(x).flatten(0, 1).float(), y.flatten())
        engine.backward(loss)
        engine.step()
        if is_save_step(a, i, k):
            s0 = time.perf_counter()
            engine.save_checkpoint(ckdir, tag=f"step{i}")
            calls.append(time.perf_counter() - s0)
            tags.append(f"step{i}")
        sync(dev)
        times.append(time.perf_counter() - t0)
    d0 = time.perf_counter()
    wait = getattr(engine.checkpoint_engine, "wait", None)
    if wait is not None:
        wait()
    drain = time.perf_counter() - d0
    named = getattr(engine.checkpoint_engine, "named", None)
    phases = phases_of(named.timing_stats()) if named is not None else None
    tag_dir = os.path.join(ckdir, tags[-1])
    nbytes = sum(os.path.getsize(p) for p in glob.glob(os.path.join(tag_dir, "*")))
    load_path, _ = engine.load_checkpoint(ckdir, tag=tags[-1])
    engine.destroy()
    out = {"times": times[a.warmup:], "calls": calls, "drain": drain, "bytes": nbytes,
           "checked": load_path is not None}
    if phases is not None:
        out["phases"] = phases
    return out


def run(a, name: str, k: int, ckdir: str) -> dict:
    """One contender's run in this process."""
    shutil.rmtree(ckdir, ignore_errors=True)
    os.makedirs(ckdir)
    try:
        if name in PLAIN:
            return plain_run(a, name, k, ckdir)
        if name in LIGHTNING:
            return lightning_run(a, name, k, ckdir)
        if name in DEEPSPEED:
            return deepspeed_run(a, name, k, ckdir)
        raise ValueError(f"unknown contender {name!r}; choose from {', '.join(ALL)}")
    finally:
        shutil.rmtree(ckdir, ignore_errors=True)


def copy_bound(a) -> dict:
    """The device→host copy of one plain-loop state (model + AdamW moments) into pinned,
    already-touched host memory (a memcpy on CPU): what a snapshot into host memory costs at least."""
    dev = device()
    model = make_model(a).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(tokens(a, 0, dev)[0]).float().sum().backward()
    opt.step()
    flat = [t for t in list(model.state_dict().values()) +
            [v for s in opt.state.values() for v in s.values()] if isinstance(t, torch.Tensor)]
    dst = [torch.empty(t.shape, dtype=t.dtype, pin_memory=dev.type == "cuda") for t in flat]
    for d in dst:
        d.zero_()
    best = float("inf")
    for _ in range(3):
        sync(dev)
        t0 = time.perf_counter()
        for d, s in zip(dst, flat):
            d.copy_(s, non_blocking=True)
        sync(dev)
        best = min(best, time.perf_counter() - t0)
    return {"copy_s": best, "bytes": sum(t.numel() * t.element_size() for t in flat),
            "params": sum(p.numel() for p in model.parameters())}

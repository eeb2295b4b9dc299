"""One training run of the demo, in its own process: a small transformer LM on synthetic tokens.

Everything that matters for an exact resume is in the checkpoint: model,
optimizer, LR scheduler, the RNG state (dropout) and the step; the data of
step i is a pure function of (seed, i). Every process starts with
fastckpt.reproducible() (threads, deterministic kernels, the math library warmed
up). The run to be killed (d["record"]) appends the digest of each state it saves to
d["saved"] before issuing the save (fastckpt.demo.digest); a resumed run reports the
digest of what load() returned beside the one recorded for that step. Reports progress through a queue.
"""
from __future__ import annotations

import os
import time

import torch
from torch import nn

from fastckpt.demo.digest import record_saved, saved_digests, state_digest
from fastckpt.reproducibility import reproducible


class TinyLM(nn.Module):
    def __init__(self, vocab: int, d_model: int, layers: int, heads: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
        return self.head(self.encoder(self.embed(tokens), mask=mask, is_causal=True))


def batch(step: int, d: dict) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(d["seed"] * 1_000_003 + step)
    start = torch.randint(0, d["vocab"], (d["batch"], 1), generator=g)
    stride = torch.randint(1, 7, (d["batch"], 1), generator=g)
    seq = (start + stride * torch.arange(d["seq"] + 1)) % d["vocab"]
    return seq[:, :-1], seq[:, 1:]


def run(d: dict, ckpt: dict | None, mode: str, queue) -> None:
    """mode: 'fastckpt' (resumes from ckpt root if there is a checkpoint) or 'torch.save' (reference)."""
    # the same threads, deterministic kernels and the math library warmed up in every run: the
    # resumed run's first step (at the resume step) then computes as the uninterrupted run's did
    reproducible(d["threads"], seed=d["seed"])
    model = TinyLM(d["vocab"], d["d_model"], d["layers"], d["heads"])
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=d["steps"])
    ck, start, offload, tuner = None, 1, None, None
    if mode == "fastckpt":
        from fastckpt.config.hydra import instantiate, offload_of, tuner_of
        ck = instantiate(ckpt)
        offload = offload_of(ckpt)
        tuner = tuner_of(ckpt)
        if ck.latest() is not None:
            state = ck.load()
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            sched.load_state_dict(state["scheduler"])
            torch.set_rng_state(state["rng"])
            start = state["step"] + 1
            # what load() returned against what the killed run's save() was given, bit for bit
            queue.put(("resumed", state["step"], state_digest(state), saved_digests(d["saved"]).get(state["step"])))
    else:
        os.makedirs(d["torch_dir"], exist_ok=True)
    params = sum(p.numel() for p in model.parameters())
    queue.put(("start", start, params))
    stalls, t_begin, pending_stall, saved_at, t_step = [], time.perf_counter(), 0.0, None, None
    step_times, t_prev = [], time.perf_counter()  # (step, seconds): figures over the same steps in every run
    for step in range(start, d["steps"] + 1):
        if tuner is not None:  # tune=auto: the interval (and N, writers) by measurement
            now = time.perf_counter()
            if t_step is not None:
                tuner.step_time(now - t_step, checkpointing=saved_at == step - 1 or bool(ck and ck.in_flight()))
            t_step = now
        x, y = batch(step, d)
        if offload is None:
            loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
        else:  # activations saved in forward went to files and came back for backward
            with offload:
                loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
                loss.backward()
        if ck is not None:
            t0 = time.perf_counter()
            ck.gate()  # the snapshot must be copied before the optimizer overwrites the weights
            pending_stall += time.perf_counter() - t0
            if pending_stall:
                stalls.append((step - 1, pending_stall)) if step > start and saved_at == step - 1 else None
            pending_stall = 0.0
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if tuner is not None and tuner.needs_tuning:
            ck = retuned(ck, ckpt, tuner, model, opt)
            t_step = None  # the profiling pause is not a training step
        if (tuner.due(step) if tuner is not None else step % d["every"] == 0):
            saved_at = step
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(),
                     "scheduler": sched.state_dict(), "rng": torch.get_rng_state(), "step": step}
            if d.get("record"):  # the run to be killed: its figures are not reported
                record_saved(d["saved"], step, state)  # the state this save is given, before it is issued
            t0 = time.perf_counter()
            if ck is not None:
                ck.save(state, step=step)
                pending_stall = time.perf_counter() - t0
            else:
                path = os.path.join(d["torch_dir"], f"step-{step}.pt")
                torch.save(state, path)
                with open(path, "rb+") as f:
                    os.fsync(f.fileno())
                prune(d["torch_dir"], d["keep"])  # as many files as fastckpt keeps
                stalls.append((step, time.perf_counter() - t0))
        now = time.perf_counter()
        step_times.append((step, now - t_prev))
        t_prev = now
        queue.put(("step", step, loss.item()))
    if ck is not None:
        ck.wait()
        ck.close()
    elapsed = time.perf_counter() - t_begin
    queue.put(("done", {"steps": d["steps"] - start + 1, "seconds": elapsed, "stalls": stalls,
                        "step_times": step_times,
                        "digest": state_digest(model.state_dict()), "loss": loss.item(),
                        "tuned": tuner.history if tuner is not None else None,
                        "offload": offload_report(offload)}))


def prune(directory: str, keep: int) -> None:
    """The reference's own retention: the newest `keep` torch.save files stay."""
    files = sorted((f for f in os.listdir(directory) if f.startswith("step-")),
                   key=lambda f: int(f[5:].split(".")[0]))
    for f in files[:-keep] if keep > 0 else files:
        os.remove(os.path.join(directory, f))


def retuned(ck, ckpt: dict, tuner, model, opt):
    """Profiles N x writers beside the checkpoints with the real state; a Checkpointer with N*, p*."""
    from fastckpt.config.hydra import instantiate
    plan = tuner.tune({"model": model.state_dict(), "optimizer": opt.state_dict()},
                      os.path.join(ckpt["root"], ".fastckpt-tune"))
    ck.close()
    return instantiate(dict(ckpt, concurrency=plan.concurrency, writers=plan.writers))


def offload_report(offload) -> dict | None:
    if offload is None:
        return None
    return dict(offload.stats, tools=sorted({t for e in offload.io.wdic.values() for t in e}))

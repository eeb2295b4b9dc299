"""One DeepSpeed process (CPU accelerator, gloo) for tests/deepspeed_fastckpt/test_deepspeed_export.py:
what a DeepSpeed call writes outside a tag, a tag's failure on one rank, a process that leaves
through os._exit.

    python ds_export_worker.py export SAVE_DIR OUT --stage S
        DeepSpeed's TestZeROSaveLoadEdgeCase::test_save_before_accum_grad_is_done: gradient
        accumulation 2, one micro-step, save_16bit_model(SAVE_DIR, "model.pt") (ZeRO-3: gathered),
        then save_checkpoint(SAVE_DIR); OUT: what SAVE_DIR held right after the export, the
        exported tensors, the model's own at the export, and any error
    python ds_export_worker.py held-error SAVE_DIR OUT
        tags global_step1..3 with a step between them; the test makes rank 0's writes of
        global_step2 fail (the fault shim) and holds rank HOLD_RANK's commit thread for HOLD_S
        seconds as the failed tag lands there; OUT: which save raised on this rank, its error, how
        long that call took, and any error of destroy()
    python ds_export_worker.py exit-in-flight SAVE_DIR OUT
        global_step1 saved and committed (wait()), one step, global_step2 saved, then os._exit(0)
    python ds_export_worker.py resume SAVE_DIR OUT
        a new engine's load_checkpoint(SAVE_DIR): the tag it loaded and the warnings
Every rank runs the same command (RANK/WORLD_SIZE from the environment) and writes OUT.RANK.
TIERS=DIR: the entry's memory tier (every file committed there, then persisted to its path).
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
import warnings

os.environ.setdefault("DS_ACCELERATOR", "cpu")
for k, v in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
    os.environ.setdefault(k, v)

import torch  # noqa: E402

import fastckpt  # noqa: E402

fastckpt.reproducible(threads=1)
import deepspeed  # noqa: E402

import deepspeed_fastckpt  # noqa: E402,F401  (registers the engine)
from one_line import raised  # noqa: E402
from small_buckets import SMALL_BUCKETS  # noqa: E402

RANK = int(os.environ["RANK"])


def make_engine(stage: int, accumulation: int = 1):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    world = int(os.environ["WORLD_SIZE"])
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": accumulation,
           "train_batch_size": 4 * accumulation * world,
           "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
           "zero_optimization": {"stage": stage, "stage3_gather_16bit_weights_on_model_save": True, **SMALL_BUCKETS},
           "fastckpt": {"concurrency": 2, "chunk_mb": 1, "commit_timeout_s": 60, "stall_timeout_s": 60,
                        **({"tiers": [os.environ["TIERS"]]} if os.environ.get("TIERS") else {})}}
    eng, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return eng


def step(eng, i: int) -> None:
    g = torch.Generator().manual_seed(100 + i * 7 + RANK)
    x, y = torch.randn(4, 32, generator=g), torch.randn(4, 8, generator=g)
    eng.backward((eng(x) - y).pow(2).mean())
    eng.step()


def model_state(eng) -> dict:
    named = list(eng.module.named_parameters())
    if eng.zero_optimization_partition_weights():
        with deepspeed.zero.GatheredParameters([p for _, p in named]):
            return {n: p.detach().clone() for n, p in named}
    return {n: p.detach().clone() for n, p in named}


def export(a, out: dict) -> None:
    eng = make_engine(a.stage, accumulation=2)
    step(eng, 0)  # one micro-step of two: the accumulation is not done
    eng.empty_partition_cache()
    out["model"] = model_state(eng)
    try:
        out["saved"] = eng.save_16bit_model(a.save_dir, "model.pt")
        out["after_export"] = sorted(os.listdir(a.save_dir))
        out["exported"] = torch.load(os.path.join(a.save_dir, "model.pt"), weights_only=True)
        eng.save_checkpoint(a.save_dir)
        eng.checkpoint_engine.wait()
        out["after_save"] = sorted(os.listdir(a.save_dir))
    except Exception as e:  # noqa: BLE001 - the test reads it
        out["error"] = f"{type(e).__name__}: {e}"
    eng.destroy()


def held_error(a, out: dict) -> None:
    if RANK == int(os.environ.get("HOLD_RANK", "-1")):  # this rank's commit thread lands each tag late
        from fastckpt.commit.file_sets import FileSets
        landed = FileSets.landed

        def held(self, directory, error, seq=0):
            if error is not None:  # the outcome agreed on every rank; this rank's thread records it late
                time.sleep(float(os.environ["HOLD_S"]))
            landed(self, directory, error, seq)
        FileSets.landed = held
    eng = make_engine(1)
    out["raised_at"] = None
    held = RANK == int(os.environ.get("HOLD_RANK", "-1"))
    for i in (1, 2, 3):
        step(eng, i)
        if not held:  # the tag before landed here (its failure recorded); on the held rank it lands late
            eng.checkpoint_engine.committer.wait_for(a.save_dir)
        if raised(out, i, lambda: eng.save_checkpoint(a.save_dir, tag=f"global_step{i}")):
            break
    try:
        eng.destroy()
    except Exception as e:  # noqa: BLE001
        out["destroy_error"] = f"{type(e).__name__}: {e}"


def exit_in_flight(a, out: dict) -> None:
    eng = make_engine(1)
    step(eng, 1)
    eng.save_checkpoint(a.save_dir, tag="global_step1")
    eng.checkpoint_engine.wait()
    step(eng, 2)
    eng.save_checkpoint(a.save_dir, tag="global_step2")
    print("exiting", flush=True)
    os._exit(0)  # as DeepSpeed's own test harness leaves its workers: no atexit, no destroy()


def resume(a, out: dict) -> None:
    eng = make_engine(1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        path, _ = eng.load_checkpoint(a.save_dir)
    out.update(path=path, warnings=[str(w.message) for w in seen if "fastckpt" in str(w.message)])
    eng.destroy()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode")
    ap.add_argument("save_dir")
    ap.add_argument("out")
    ap.add_argument("--stage", type=int, default=2)
    a = ap.parse_args()
    deepspeed.init_distributed(dist_backend="gloo", timeout=datetime.timedelta(seconds=120))
    out: dict = {}
    {"export": export, "held-error": held_error, "exit-in-flight": exit_in_flight, "resume": resume}[a.mode](a, out)
    torch.save(out, f"{a.out}.{RANK}")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.exit(0)

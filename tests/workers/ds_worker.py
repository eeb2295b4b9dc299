"""One DeepSpeed process for tests/deepspeed_fastckpt/test_deepspeed.py (CPU accelerator, gloo).

    python ds_worker.py train  SAVE_DIR OUT --stage S [--dtype bf16] [--engine torch]
        3 steps, save_checkpoint, 2 more steps; writes the losses and final parameters
    python ds_worker.py resume SAVE_DIR OUT --stage S [--latest missing|torn|uncommitted]
        a fresh engine loads the newest committed tag and trains the same 2 steps
    python ds_worker.py reference SAVE_DIR OUT --stage S --steps M
        M steps without saving; writes every loss and the full parameters after every step
        (and the activation-offload counts when FASTCKPT_ENTRY has "offload" or OFFLOAD_HELPER=DIR;
        with WATCH_LAYOUT=1 also what offload handed back to autograd, layout_watch.LayoutWatch)
    python ds_worker.py loop SAVE_DIR OUT --stage S --steps M [--save-before-update]
        M steps, save_checkpoint after every one (the test kill -9s it somewhere in between),
        or between backward and the update, so the update meets the snapshot still copying
    python ds_worker.py auto-interval SAVE_DIR OUT --steps M
        M steps, save_checkpoint whenever deepspeed_fastckpt.checkpoint_due (interval "auto")
    python ds_worker.py consolidate SAVE_DIR OUT --tag T
        DeepSpeed's own zero_to_fp32 on what fastckpt wrote
    python ds_worker.py immediate SAVE_DIR OUT --stage S
        one step, save_checkpoint, and at once load_checkpoint on the same engine (DeepSpeed's
        TestZeROSaveLoadEdgeCase::test_immediate_save_load); every rank's loaded path in OUT
    python ds_worker.py two-engines SAVE_DIR OUT --stage S
        engine A saves after 3 steps; engine B, made next in the same process, loads at once
        (with FASTCKPT_FAULT_HOLD, A's writes are held until rank 0's load waits for them; so
        in `universal` until ds_to_universal does)
    python ds_worker.py resume-nothing SAVE_DIR OUT
        load_checkpoint of a directory holding no checkpoint; the path and warnings in OUT
    python ds_worker.py universal SAVE_DIR OUT --stage S
        3 steps, save_checkpoint(tag="t"), at once DeepSpeed's ds_to_universal makes "t_universal"
        on rank 0 (it copies fastckpt's model-state files), a second engine loads it (load_universal)
    python ds_worker.py config-error SAVE_DIR OUT
    python ds_worker.py threads SAVE_DIR OUT --stage S
        a save before any step, then 3 steps each followed by a save; after destroy() (as in
        every mode) OUT names the threads left that were not there before the engine was made
Every rank runs the same command (RANK/WORLD_SIZE from the environment); rank 0 writes OUT.
MODEL=block trains layout_watch.BlockNet (a transformer block) instead of the small MLP.
DS_ACCELERATOR=cuda: the model on this rank's GPU and NCCL instead of gloo.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import warnings

os.environ.setdefault("DS_ACCELERATOR", "cpu")
for k, v in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
    os.environ.setdefault(k, v)

import torch  # noqa: E402

import fastckpt  # noqa: E402

# one thread, deterministic kernels, the math library warmed up: runs compared bit for bit across
# processes compute alike (a process's first vector-math call is not reproducible otherwise)
fastckpt.reproducible(threads=1)
import deepspeed  # noqa: E402

import deepspeed_fastckpt  # noqa: E402,F401  (registers the engine)
from layout_watch import BlockNet, LayoutWatch  # noqa: E402
from small_buckets import SMALL_BUCKETS  # noqa: E402
from threads_left import threads_left, threads_now  # noqa: E402

WATCHES: list[LayoutWatch] = []


def make_engine(stage: int, dtype: str, engine: str, fastckpt_entry=None, load_universal=False):
    torch.manual_seed(0)
    width = int(os.environ.get("WIDTH", "64"))
    hidden = [torch.nn.Linear(width, width), torch.nn.ReLU()] if os.environ.get("HIDDEN") else []
    model = (BlockNet(width) if os.environ.get("MODEL") == "block" else
             torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.ReLU(), torch.nn.LayerNorm(width), *hidden,
                                 torch.nn.Linear(width, 8)))
    # two parameter groups, as most recipes have: DeepSpeed steps (and fastckpt gates) them one by one
    groups = [{"params": [p for p in model.parameters() if p.dim() > 1], "weight_decay": 0.01},
              {"params": [p for p in model.parameters() if p.dim() <= 1], "weight_decay": 0.0}]
    cfg = {"train_batch_size": 4 * int(os.environ["WORLD_SIZE"]), "train_micro_batch_size_per_gpu": 4,
           "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10, "warmup_max_lr": 1e-2}},
           "zero_optimization": {"stage": stage, **SMALL_BUCKETS},
           "checkpoint": {"tag_validation": "FAIL", **({"load_universal": True} if load_universal else {})}}
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    if engine == "fastckpt":
        default = json.loads(os.environ.get("FASTCKPT_ENTRY", '{"concurrency": 2, "chunk_mb": 1}'))
        cfg["fastckpt"] = fastckpt_entry if fastckpt_entry is not None else default
    eng, *_ = deepspeed.initialize(model=model, model_parameters=groups, config=cfg)
    if os.environ.get("OFFLOAD_HELPER"):  # activation offload without the config entry
        deepspeed_fastckpt.offload_activations(eng, directory=os.environ["OFFLOAD_HELPER"], threshold_mb=0.001,
                                               mode="tool", tool="direct")
    off = deepspeed_fastckpt.offload.offload_of(eng)
    if off is not None and os.environ.get("WATCH_LAYOUT"):
        WATCHES.append(LayoutWatch(off))
    return eng


def batch(i: int):
    g = torch.Generator().manual_seed(100 + i * 7 + int(os.environ["RANK"]))
    return torch.randn(4, 32, generator=g), torch.randn(4, 8, generator=g)


def step(eng, i: int, before_update=None) -> float:
    x, y = batch(i)
    p = next(eng.module.parameters())
    x, y = x.to(device=p.device, dtype=p.dtype), y.to(p.device)
    loss = (eng(x).float() - y).pow(2).mean()
    eng.backward(loss)
    if before_update is not None:
        before_update()
    eng.step()
    return loss.item()


def release_held_writes_once_waited_for() -> None:
    """Where the test's write shim holds this job's writes (FASTCKPT_FAULT_HOLD, see
    tests/campaign/eio_shim.c), rank 0 lets them go once its main thread waits for the save they
    belong to (deepspeed_fastckpt.open_engines.wait_for_saves_into): that save is surely still in
    flight when the load or the conversion starts, on a fast machine or a loaded one."""
    hold = os.environ.get("FASTCKPT_FAULT_HOLD")
    if not hold or os.environ["RANK"] != "0":
        return
    main_thread = threading.main_thread().ident

    def watch() -> None:
        while not os.path.exists(hold):
            frame = sys._current_frames().get(main_thread)
            while frame is not None and frame.f_code.co_name != "wait_for_saves_into":
                frame = frame.f_back
            if frame is not None:
                open(hold, "w").close()
            time.sleep(0.002)
    threading.Thread(target=watch, name="release-held-writes", daemon=True).start()


def full_params(eng) -> dict[str, torch.Tensor]:
    named = list(eng.module.named_parameters())
    if eng.zero_optimization_partition_weights():
        with deepspeed.zero.GatheredParameters([p for _, p in named]):
            return {n: p.detach().float().clone() for n, p in named}
    return {n: p.detach().float().clone() for n, p in named}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode")
    ap.add_argument("save_dir")
    ap.add_argument("out")
    ap.add_argument("--stage", type=int, default=1)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--engine", default="fastckpt")
    ap.add_argument("--latest", default="ok")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--tag", default=None)
    ap.add_argument("--save-before-update", action="store_true")
    a = ap.parse_args()
    if a.mode == "consolidate":
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        torch.save(get_fp32_state_dict_from_zero_checkpoint(a.save_dir, tag=a.tag), a.out)
        return
    deepspeed.init_distributed(dist_backend="nccl" if os.environ["DS_ACCELERATOR"] == "cuda" else "gloo")
    if a.mode == "config-error":
        try:
            make_engine(1, "fp32", "fastckpt", {"concurrency": 2, "bogus_key": 1})
        except Exception as e:  # noqa: BLE001 - the test reads the message
            torch.save({"error": f"{type(e).__name__}: {e}"}, a.out)
        return
    if a.mode == "url-save-dir":  # save_dir an s3:// URL: refused in one line, no local folder `s3:` made
        eng = make_engine(1, "fp32", "fastckpt")
        step(eng, 0)
        os.chdir(a.save_dir)
        try:
            eng.save_checkpoint("s3://ckpt/run7")
            got = {"error": "none"}
        except Exception as e:  # noqa: BLE001 - the test reads the message
            got = {"error": f"{type(e).__name__}: {e}"}
        errors = [None] * torch.distributed.get_world_size()  # every rank refused (none left in a barrier)
        torch.distributed.all_gather_object(errors, got["error"])
        if torch.distributed.get_rank() == 0:
            torch.save(dict(got, made=os.listdir("."), every_rank=errors), a.out)
        eng.checkpoint_engine.close() if hasattr(eng.checkpoint_engine, "close") else None
        return
    before = threads_now()
    eng = make_engine(a.stage, a.dtype, a.engine)
    out = {"engine": type(eng.checkpoint_engine).__name__}
    if a.mode == "train":
        for i in range(3):
            step(eng, i)
        eng.save_checkpoint(a.save_dir, client_state={"data_pos": 3, "note": "three steps"})
        out["params_at_save"] = full_params(eng)
        out["losses"] = [step(eng, i) for i in (3, 4)]
    elif a.mode == "reference":
        out["losses"], out["params_after"] = [], []
        for i in range(a.steps):
            out["losses"].append(step(eng, i))
            out["params_after"].append(full_params(eng))
        off = deepspeed_fastckpt.offload.offload_of(eng)
        out["offload"] = dict(off.stats) if off is not None else None
        out["layout"] = WATCHES[0].summary() if WATCHES else None
    elif a.mode == "auto-interval":  # checkpoint when deepspeed_fastckpt.checkpoint_due says so
        import time
        out["saved_at"] = []
        for i in range(a.steps):
            step(eng, i)
            time.sleep(0.03)
            if deepspeed_fastckpt.checkpoint_due(eng, a.save_dir):
                eng.save_checkpoint(a.save_dir, client_state={"data_pos": i + 1, "note": "auto"})
                out["saved_at"].append(eng.global_steps)
        iv = deepspeed_fastckpt.engine_hooks.peek(eng).interval
        out["interval"], out["plan"] = iv.every, iv.auto.plan.to_dict()
        out["concurrency"] = eng.checkpoint_engine.named.checkpointer.concurrency
        eng.destroy()
    elif a.mode == "resume-nothing":  # a directory with no checkpoint in it
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            path, _ = eng.load_checkpoint(a.save_dir)
        out.update(path=path, warnings=[str(w.message) for w in seen if "fastckpt" in str(w.message)])
    elif a.mode == "immediate":
        step(eng, 0)
        eng.save_checkpoint(a.save_dir, client_state={"data_pos": 1, "note": "immediate"})
        path, _ = eng.load_checkpoint(a.save_dir, load_optimizer_states=False, load_lr_scheduler_states=False)
        out["loaded_by_rank"] = [None] * int(os.environ["WORLD_SIZE"])
        torch.distributed.all_gather_object(out["loaded_by_rank"], path)
    elif a.mode == "universal":
        from types import SimpleNamespace

        from deepspeed.checkpoint.ds_to_universal import main as ds_to_universal
        for i in range(3):
            step(eng, i)
        from deepspeed.checkpoint.constants import UNIVERSAL_CHECKPOINT_INFO
        release_held_writes_once_waited_for()
        eng.save_checkpoint(a.save_dir, tag="t", client_state={"data_pos": 3, "note": "universal",
                                                               UNIVERSAL_CHECKPOINT_INFO: {}})
        out["params_at_save"] = full_params(eng)
        if int(os.environ["RANK"]) == 0:
            ds_to_universal(SimpleNamespace(input_folder=os.path.join(a.save_dir, "t"),
                                            output_folder=os.path.join(a.save_dir, "t_universal"),
                                            num_extract_workers=1, num_merge_workers=1, keep_temp_folder=False,
                                            strict=True, inject_missing_state=False))
        torch.distributed.barrier()
        other = make_engine(a.stage, a.dtype, a.engine, load_universal=True)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            path, client = other.load_checkpoint(a.save_dir, tag="t_universal")
        out.update(path=path, client=client and {k: client[k] for k in ("data_pos", "note")},
                   params_loaded=full_params(other),
                   warnings=[str(w.message) for w in seen if "fastckpt" in str(w.message)])
        other.destroy()
    elif a.mode == "two-engines":
        for i in range(3):
            step(eng, i)
        release_held_writes_once_waited_for()
        eng.save_checkpoint(a.save_dir, client_state={"data_pos": 3, "note": "engine A"})
        out["params_at_save"] = full_params(eng)
        other = make_engine(a.stage, a.dtype, a.engine)  # a second engine in the same process
        path, client = other.load_checkpoint(a.save_dir)
        out.update(path=path, client=client and {k: client[k] for k in ("data_pos", "note")},
                   params_loaded=full_params(other))
        other.destroy()
    elif a.mode == "threads":  # saves outside a run and in it
        eng.save_checkpoint(a.save_dir, tag="before", client_state={"data_pos": 0, "note": "threads"})
        for i in range(3):
            step(eng, i)
            eng.save_checkpoint(a.save_dir, client_state={"data_pos": i + 1, "note": "threads"})
    elif a.mode == "loop" and a.save_before_update:  # the update starts while the snapshot copies
        for i in range(a.steps):
            step(eng, i, lambda: eng.save_checkpoint(a.save_dir, client_state={"data_pos": i, "note": "loop"}))
    elif a.mode == "loop":
        for i in range(a.steps):
            step(eng, i)
            eng.save_checkpoint(a.save_dir, client_state={"data_pos": i + 1, "note": "loop"})
    else:
        rank0 = int(os.environ["RANK"]) == 0
        if rank0 and a.latest == "missing":
            os.unlink(os.path.join(a.save_dir, "latest"))
        elif rank0 and a.latest == "torn":
            with open(os.path.join(a.save_dir, "latest"), "w") as f:
                f.write("global_st")
        elif rank0 and a.latest == "uncommitted":  # a newer tag whose fastckpt writer died half-way
            os.makedirs(os.path.join(a.save_dir, "global_step9"), exist_ok=True)  # what it leaves: its hidden file
            with open(os.path.join(a.save_dir, "global_step9", ".mp_rank_00_model_states.pt.fastckpt-99999-1.tmp"),
                      "wb") as f:
                f.write(b"PK\x03\x04 torn")
            with open(os.path.join(a.save_dir, "latest"), "w") as f:
                f.write("global_step9")
        torch.distributed.barrier()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            path, client = eng.load_checkpoint(a.save_dir, tag=a.tag)
        out["warnings"] = [str(w.message) for w in seen if "fastckpt" in str(w.message)]
        if a.engine == "fastckpt":  # where each file came from, with a memory tier in front (else nothing)
            out["read_from"] = sorted({r.tier for r in eng.checkpoint_engine.named.reads})
        done = eng.global_steps
        out.update(path=path, client=client and {k: client[k] for k in ("data_pos", "note")},
                   loaded_steps=done, lr=eng.get_lr(), losses=[step(eng, i) for i in (done, done + 1)])
    out["params"] = full_params(eng)
    if a.engine == "fastckpt":
        gate = eng.checkpoint_engine.group_gate
        out["gate"] = {"scoped": gate.scoped, "scoped_waits": gate.scoped_waits, "full_waits": gate.full_waits}
    out["global_steps"] = eng.global_steps
    if a.engine == "fastckpt" and a.mode == "train" and os.environ.get("EXIT_WITHOUT_DESTROY"):
        torch.save(out, a.out)
        return  # the atexit hook must still land and commit the tag
    eng.destroy()  # waits until the tag is committed on every rank
    out["threads_left"] = threads_left(before)
    if int(os.environ["RANK"]) == 0:
        torch.save(out, a.out)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()  # gloo's threads end here, not in static destruction at exit


if __name__ == "__main__":
    main()
    sys.exit(0)

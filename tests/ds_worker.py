"""One DeepSpeed process for tests/test_deepspeed.py (CPU accelerator, gloo).

    python ds_worker.py train  SAVE_DIR OUT --stage S [--dtype bf16] [--engine torch]
        3 steps, save_checkpoint, 2 more steps; writes the losses and final parameters
    python ds_worker.py resume SAVE_DIR OUT --stage S [--latest missing|torn|uncommitted]
        a fresh engine loads the newest committed tag and trains the same 2 steps
    python ds_worker.py config-error SAVE_DIR OUT
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
for k, v in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
    os.environ.setdefault(k, v)

import torch  # noqa: E402

torch.set_num_threads(1)
import deepspeed  # noqa: E402

import deepspeed_fastckpt  # noqa: E402,F401  (registers the engine)


def make_engine(stage: int, dtype: str, engine: str, fastckpt_entry=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.LayerNorm(64),
                                torch.nn.Linear(64, 8))
    cfg = {"train_batch_size": 4 * int(os.environ["WORLD_SIZE"]), "train_micro_batch_size_per_gpu": 4,
           "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10, "warmup_max_lr": 1e-2}},
           "zero_optimization": {"stage": stage}, "checkpoint": {"tag_validation": "FAIL"}}
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    if engine == "fastckpt":
        cfg["fastckpt"] = fastckpt_entry if fastckpt_entry is not None else {"concurrency": 2, "chunk_mb": 1}
    eng, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return eng


def batch(i: int):
    g = torch.Generator().manual_seed(100 + i * 7 + int(os.environ["RANK"]))
    return torch.randn(4, 32, generator=g), torch.randn(4, 8, generator=g)


def step(eng, i: int) -> float:
    x, y = batch(i)
    x = x.to(next(eng.module.parameters()).dtype)
    loss = (eng(x).float() - y).pow(2).mean()
    eng.backward(loss)
    eng.step()
    return loss.item()


def full_params(eng) -> list[torch.Tensor]:
    params = list(eng.module.parameters())
    if eng.zero_optimization_partition_weights():
        with deepspeed.zero.GatheredParameters(params):
            return [p.detach().float().clone() for p in params]
    return [p.detach().float().clone() for p in params]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode")
    ap.add_argument("save_dir")
    ap.add_argument("out")
    ap.add_argument("--stage", type=int, default=1)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--engine", default="fastckpt")
    ap.add_argument("--latest", default="ok")
    a = ap.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    if a.mode == "config-error":
        try:
            make_engine(1, "fp32", "fastckpt", {"concurrency": 2, "bogus_key": 1})
        except Exception as e:  # noqa: BLE001 - the test reads the message
            torch.save({"error": f"{type(e).__name__}: {e}"}, a.out)
        return
    eng = make_engine(a.stage, a.dtype, a.engine)
    out = {"engine": type(eng.checkpoint_engine).__name__}
    if a.mode == "train":
        for i in range(3):
            step(eng, i)
        eng.save_checkpoint(a.save_dir, client_state={"data_pos": 3, "note": "three steps"})
        out["losses"] = [step(eng, i) for i in (3, 4)]
    else:
        rank0 = int(os.environ["RANK"]) == 0
        if rank0 and a.latest == "missing":
            os.unlink(os.path.join(a.save_dir, "latest"))
        elif rank0 and a.latest == "torn":
            with open(os.path.join(a.save_dir, "latest"), "w") as f:
                f.write("global_st")
        elif rank0 and a.latest == "uncommitted":  # a newer tag whose writer died half-way
            os.makedirs(os.path.join(a.save_dir, "global_step9"), exist_ok=True)
            with open(os.path.join(a.save_dir, "global_step9", "mp_rank_00_model_states.pt"), "wb") as f:
                f.write(b"PK\x03\x04 torn")
            with open(os.path.join(a.save_dir, "latest"), "w") as f:
                f.write("global_step9")
        torch.distributed.barrier()
        path, client = eng.load_checkpoint(a.save_dir)
        out.update(path=path, client=client and {k: client[k] for k in ("data_pos", "note")},
                   lr=eng.get_lr(), losses=[step(eng, i) for i in (3, 4)])
    out["params"] = full_params(eng)
    out["global_steps"] = eng.global_steps
    if a.engine == "fastckpt" and a.mode == "train" and os.environ.get("EXIT_WITHOUT_DESTROY"):
        torch.save(out, a.out)
        return  # the atexit hook must still land and commit the tag
    eng.destroy()  # waits until the tag is committed on every rank
    if int(os.environ["RANK"]) == 0:
        torch.save(out, a.out)


if __name__ == "__main__":
    main()
    sys.exit(0)

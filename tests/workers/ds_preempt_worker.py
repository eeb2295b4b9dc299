"""One rank of the DeepSpeed preemption test (tests/deepspeed_fastckpt/test_deepspeed_preempt.py):
ds_worker.py's engine with "fastckpt": {"preempt_signal": "SIGTERM", "preempt_grace_s": 20}.

    python ds_preempt_worker.py train SAVE_DIR OUT [--stage S] [--save-every K]
        trains (ds_worker.step, batch i at step i) until a SIGTERM ends it, printing "step N"
        (global_steps) after every step, then deepspeed_fastckpt.at_step_end(engine, SAVE_DIR);
        --save-every K: engine.save_checkpoint every K steps too (WIDTH=512: ~3 MiB a rank)
    python ds_preempt_worker.py load SAVE_DIR OUT [--stage S]
        a fresh engine loads the newest committed tag; rank 0 writes OUT: its tag, global_steps
        and full parameters
"""
from __future__ import annotations

import argparse
import os
import time

from ds_worker import deepspeed, full_params, make_engine, step, torch  # noqa: F401  (sets up the process)

import deepspeed_fastckpt

ENTRY = {"concurrency": 2, "chunk_mb": 1, "preempt_signal": "SIGTERM", "preempt_grace_s": 20}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode")
    ap.add_argument("save_dir")
    ap.add_argument("out")
    ap.add_argument("--stage", type=int, default=1)
    ap.add_argument("--save-every", type=int, default=0)
    a = ap.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    eng = make_engine(a.stage, "fp32", "fastckpt", fastckpt_entry=ENTRY)
    if a.mode == "train":
        i = 0
        while True:
            step(eng, i)
            i += 1
            if a.save_every and i % a.save_every == 0:
                eng.save_checkpoint(a.save_dir)  # in flight when the signal comes
            print(f"step {eng.global_steps}", flush=True)
            time.sleep(0.03)
            deepspeed_fastckpt.at_step_end(eng, a.save_dir)
    path, _ = eng.load_checkpoint(a.save_dir)
    if int(os.environ["RANK"]) == 0:
        torch.save({"path": path, "global_steps": eng.global_steps, "params": full_params(eng)}, a.out)
    eng.destroy()


if __name__ == "__main__":
    main()

"""Child process of the pool crash test: two models saved in turn into one pool.

Usage: python pmem_crash_child.py POOL CONCURRENCY PERSIST
Prints "ready", then "committed MODEL STEP" for every version whose wait() returned.
States come from crash_child.state_for(step), so a loaded version can be checked exactly.
"""
import sys

import fastckpt
from crash_child import state_for
from one_line import say  # noqa: E402

MODELS = ("alpha", "beta")


def main() -> None:
    pool, concurrency, persist = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    cks = {m: fastckpt.Checkpointer(pool, store="pmem", model=m, pool_mb=64, persist=persist,
                                    concurrency=concurrency) for m in MODELS}
    step = {m: (ck.latest().step + 1 if ck.latest() else 1) for m, ck in cks.items()}
    say("ready")
    pending = {m: [] for m in MODELS}
    while True:
        for m, ck in cks.items():
            pending[m].append(ck.save(state_for(step[m]), step=step[m]))
            step[m] += 1
            while pending[m] and (len(pending[m]) >= concurrency or pending[m][0].done()):
                info = pending[m].pop(0).wait()
                say(f"committed {m} {info.step}")


if __name__ == "__main__":
    main()

"""What test workers tell their tests: a line of output written at once (`say`: the line and its
newline in one write(2) to stdout, which on a pipe no other thread's or process's write can split,
up to PIPE_BUF bytes — a print() from two threads at once can run "committed 2" into the other's
line), and which save raised (`raised`)."""
import os
import sys


def say(line: str) -> None:
    sys.stdout.flush()  # what print() buffered before goes first
    os.write(sys.stdout.fileno(), (line + "\n").encode())


def raised(out: dict, step: int, call) -> bool:
    """call() (a save); when it raises, out records at which step, what and how long the call took,
    and True is returned (the worker stops saving)."""
    import time
    t = time.monotonic()
    try:
        call()
    except BaseException as e:  # noqa: BLE001 - DCP's CheckpointException too; the test reads it
        out.update(raised_at=step, error=f"{type(e).__name__}: {e}", took_s=time.monotonic() - t)
        return True
    return False


def save_until_killed(ck, state_of, step: int) -> None:
    """Saves state_of(step), state_of(step + 1), ... with ck until the process is killed, two in
    flight at most; "committed N" said as each lands (the kill campaigns' loop)."""
    pending = []
    while True:
        pending.append(ck.save(state_of(step), step=step))
        step += 1
        while pending and (len(pending) >= 2 or pending[0].done()):
            say(f"committed {pending.pop(0).wait().step}")

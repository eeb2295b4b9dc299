"""A line of a test worker's output written at once: the line and its newline in one write(2) to
stdout, which on a pipe no other thread's or process's write can split (up to PIPE_BUF bytes) — a
print() from two threads at once can run "committed 2" into the other's line. Tests parse these."""
import os
import sys


def say(line: str) -> None:
    sys.stdout.flush()  # what print() buffered before goes first
    os.write(sys.stdout.fileno(), (line + "\n").encode())

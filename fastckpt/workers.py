"""Warm threads for an owner's background tasks: a task handed over is taken at once.

`threading.Thread.start()` returns only once the new thread has run. On a loaded machine (the
copy and CRC threads of a save busy on every core) that waits for a turn of the scheduler: in a
DCP save on 2 cores, a commit thread's start took 5.6 ms on average and up to 27 ms, on the
path to the save's first byte (and, for a Checkpointer's save, on the training thread). Here
a task goes to an idle thread through its queue, without waiting; a thread is started only when
every one is busy (the first saves), and it stays for the next task (for IDLE_S at most).

Each task gets a `Task` handle that joins as a thread does. A worker takes the task's name while
it runs it; an exception a task raises goes to threading.excepthook, as a thread's would. A thread
runs many tasks over time: nothing a task leaves on it (thread-local state) is meant for the next.
`retire()` ends the workers (an owner's close, once its tasks are done: no thread of it outlives
that); tasks handed over afterwards start new ones.
"""
from __future__ import annotations

import queue
import sys
import threading
from typing import Callable, Optional


class Task:
    """One task's handle: `join(timeout)` and `is_alive()`, as a thread's."""

    def __init__(self, name: str):
        self.name = name
        self._done = threading.Event()
        self._thread: Optional[threading.Thread] = None  # the worker running it, once it runs

    def join(self, timeout: Optional[float] = None) -> None:
        if self._thread is threading.current_thread() and not self._done.is_set():
            raise RuntimeError(f"{self.name} cannot join itself")  # as a thread joining itself: never done
        self._done.wait(timeout)

    def is_alive(self) -> bool:
        return not self._done.is_set()


IDLE_S = 300.0  # a worker idle this long ends (an owner never closed leaves no thread for ever)


class Workers:
    """Daemon threads named `name` while idle, each running one task at a time; one idle for
    idle_s ends."""

    def __init__(self, name: str, idle_s: float = IDLE_S):
        self._name, self._idle_s = name, idle_s
        self._lock = threading.Lock()
        self._idle: list[tuple[queue.SimpleQueue, threading.Thread]] = []  # workers waiting for a task
        self._generation = 0  # a worker of an earlier one (busy when retire() ran) ends after its task

    def run(self, fn: Callable[[], None], name: str, before: Optional[Callable[[Task], None]] = None) -> Task:
        """fn() on a worker, now; its handle. before(task): called before the task can start."""
        task = Task(name)
        if before is not None:
            before(task)
        with self._lock:
            inbox, thread = self._idle.pop() if self._idle else (queue.SimpleQueue(), None)
            inbox.put((fn, task))
            generation = self._generation
        if thread is None:
            thread = threading.Thread(target=self._serve, args=(inbox, generation), name=name, daemon=True)
            thread.start()
        return task

    def _serve(self, inbox: queue.SimpleQueue, generation: int) -> None:
        me = threading.current_thread()
        while True:
            try:
                item = inbox.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    if (inbox, me) in self._idle:  # not handed a task meanwhile: it ends
                        self._idle.remove((inbox, me))
                        return
                continue  # handed one just now: it is in the inbox
            if item is None:
                return
            fn, task = item
            me.name, task._thread = task.name, me
            goes_on = False  # not after a BaseException (SystemExit, KeyboardInterrupt): it ends with it
            try:
                fn()
                goes_on = True
            except Exception:  # noqa: BLE001 - said as a thread of its own would say it; the worker goes on
                threading.excepthook(threading.ExceptHookArgs(sys.exc_info() + (me,)))
                goes_on = True
            finally:
                me.name, done = f"{self._name}-idle", task._done
                # what the task held (a commit's unit and Pending, a save's stagers) is not kept while
                # idle: a commit's, held so, made the next save's plan 70 ms instead of 2 (save_load.py)
                del item, fn, task
                with self._lock:
                    goes_on = goes_on and generation == self._generation
                    if goes_on:
                        self._idle.append((inbox, me))
                done.set()  # after: a retire() that waited for this task finds the worker idle
            if not goes_on:
                return

    def retire(self) -> None:
        """Every idle worker ends (joined here), and a busy one once its task is done: an owner's
        close, once its tasks are done, so that no thread of it outlives that. Tasks handed over
        later start new workers."""
        with self._lock:
            self._generation += 1
            idle, self._idle = self._idle, []
        for inbox, _ in idle:
            inbox.put(None)
        for _, thread in idle:
            if thread is not threading.current_thread():
                thread.join()

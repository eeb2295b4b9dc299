"""Which front ends this process has started, for a plugin that must act on a framework object
it is not handed: Lightning calls lightning_fastckpt's `callbacks_factory` entry point with
nothing that says which Trainer it is for, so the callback goes to Trainers made once a front
end that needs it has started (the DeepSpeed plugin, whose Lightning strategy's removals the
callback defers, says so when it is imported). A plugin names no other plugin: each says its
own name here, and reads the names it serves.
"""
from __future__ import annotations

_started: set[str] = set()


def started(name: str) -> None:
    """The front end `name` ("deepspeed") is in use in this process."""
    _started.add(name)


def is_started(name: str) -> bool:
    return name in _started

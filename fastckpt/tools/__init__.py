"""The `fastckpt` command and what only it needs.

  cli.py            ls | verify | export | repack | info | tune | goodput
  folders.py        what a path holds: every folder a plugin writes, and its checkpoints
  goodput.py        goodput under failures: a preemption trace replayed against measured costs
"""

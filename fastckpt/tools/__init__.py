"""The `fastckpt` command and what only it needs.

  cli.py            ls | verify | export | repack | info | tune | goodput
  folders.py        what a path holds: every folder fastckpt writes, and its checkpoints
  folder_kinds.py   the kinds of folder a plugin writes by its framework's conventions, declared by the plugin
  goodput.py        goodput under failures: a preemption trace replayed against measured costs
"""

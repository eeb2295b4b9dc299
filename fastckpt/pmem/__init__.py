"""The persistent-memory pool (Portus): many models' checkpoints in one mapped file or DAX device.

  layout.py    the on-media layout: superblock, model table, version slots
  pool.py      the pool: open, claim a version slot, seal, read, repack
  image.py     a version's bytes: the safetensors image of a state, split in two
  claims.py    whether a claimed, unsealed slot still has a writer
  commands.py  ls, verify, export and repack of a pool: its face in the `fastckpt` command
  pointer.py   the pointer file a pool-backed save leaves where a framework looks for its file

The pool store (fastckpt.store.pmem_store) puts checkpoints in it; `fastckpt` reads it
(fastckpt.pmem.commands).
"""

"""Reading checkpoints back into a training state (the load side of the Checkpointer).

  newest.py  which checkpoint loads: the newest committed one that loads on every rank alike
  into.py    what was loaded, copied into a state of the same structure (load(into=...))

The bytes of one file are format/'s to read (format.load_file); a store reads its own
checkpoints (store/protocol.py's load and verify).
"""

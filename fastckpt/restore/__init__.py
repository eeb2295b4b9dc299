"""Reading checkpoints back into a training state (the load side of the Checkpointer).

  newest.py  which checkpoint loads: the newest committed one that loads on every rank alike
  into.py    load(into=...): the structures compared (format.fitting) and whatever was not
             read in place copied in

The bytes of one file are format/'s to read (format.load_file); a store reads its own
checkpoints (store/protocol.py's load and verify).
"""

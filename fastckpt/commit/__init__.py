"""Committing a checkpoint: what makes it real, in which order, and how ranks agree on it.

  ordered.py    the ordered commit: each unit after the one issued before it, once every rank's part is durable
  record.py     the commit record: the one small file whose durable presence makes a checkpoint real (its one writer)
  file_sets.py  one commit for a set of files across ranks (any files per rank), durable first, then one record
  checkpoint_unit.py  one Checkpointer checkpoint as a unit of the ordered commit (its file, its COMMIT)
  in_flight.py  the checkpoints a Checkpointer has issued and not yet committed, and errors nobody saw
  agreement.py  agreement between ranks (every rank's part durable before rank 0 commits)
  protocol.py   the commit seam: CommitUnit and its numbered calls, which every unit implements
  agreed_errors.py  failed units raised at one call on every rank, or on none
  committed_under.py  the checkpoints committed under one parent folder: newest first, next counter, withdrawal
  persist_unit.py  a checkpoint committed on a memory tier, copied to the places behind it
  persisting.py  those copies issued as checkpoints land; persist_cadence.py: which (persist_every)
"""

"""Committing a checkpoint: what makes it real, and how ranks agree on it.

  record.py     the commit record: the one small file whose durable presence makes a checkpoint real
  agreement.py  agreement between ranks (every rank's part durable before rank 0 commits)
"""

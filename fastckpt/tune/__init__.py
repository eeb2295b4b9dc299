"""Choosing how many checkpoints in flight and how often to take one (PCcheck §3.4).

  profile.py        measure a state's save costs here and choose N*, p* and the interval f*
  auto_interval.py  interval="auto": that tuner driven by the training loop it serves
"""

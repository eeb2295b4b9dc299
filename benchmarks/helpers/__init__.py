"""What the benchmark scripts share (the scripts themselves are the files one folder up).

  bounds.py          the physical bounds measured in the same run (direct write/read, memcpy)
  peers.py           the peers' save and load (torch.save, DCP save/async_save, Lightning-style)
  contenders.py      one training run per contender for gpu_overhead.py
  fresh.py           a script's child in a process of its own (cold on a GPU, forked on CPU)
  results.py         keeps a benchmark's JSON, plot and its section of RESULTS.md
  offload_memory.py  the largest batch under a memory cap (memcap.py), each trial a fresh
                     offload_child.py process
"""

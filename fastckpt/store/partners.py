"""Which rank keeps which rank's replica (settings `replicas=1`): chosen from the job's topology.

Each rank names its node (its host name, or FASTCKPT_NODE where host names do not tell nodes
apart); the names are gathered once. A rank's partner is on another node when there is one — the
rank with the same index among its node's ranks on the next node, in sorted node order — so that
losing one node never loses a part and its replica together; on one node it is the next rank.
Every rank computes the same map from the same gathered names.
"""
from __future__ import annotations

import os
import socket
from typing import Optional


def node_name() -> str:
    """This process's node, as the partners map sees it."""
    return os.environ.get("FASTCKPT_NODE") or socket.gethostname()


def partners(nodes: list[str]) -> list[Optional[int]]:
    """nodes[r]: rank r's node -> partners[r]: the rank that keeps r's replica (None: alone)."""
    world = len(nodes)
    if world < 2:
        return [None] * world
    names = sorted(set(nodes))
    ranks_on = {n: [r for r in range(world) if nodes[r] == n] for n in names}
    out: list[Optional[int]] = []
    for r in range(world):
        here = ranks_on[nodes[r]]
        if len(names) == 1:
            out.append(here[(here.index(r) + 1) % len(here)])
            continue
        there = ranks_on[names[(names.index(nodes[r]) + 1) % len(names)]]
        out.append(there[here.index(r) % len(there)])
    return out


def wards(partner_of: list[Optional[int]], rank: int) -> list[int]:
    """The ranks whose replicas rank keeps."""
    return [r for r, p in enumerate(partner_of) if p == rank]

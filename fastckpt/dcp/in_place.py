"""Tensor items of a DCP load read straight into the tensors the load fills: no buffer, no copy.

When a rank loads chunks as they were saved (no resharding), an item's stored tensor is exactly
the tensor the planner hands for it: same dtype and shape, whole, contiguous, on the CPU. Then
the item's data record is read into that tensor's memory, the archive's other (small) records
beside it, every such item of a file in one parallel pass (fastckpt.format.reading.read_into),
and each archive's records are checked against their CRC-32s once read; data.pkl, already read
whole by the structure check, is not read again (its CRC-32 taken of the bytes unpickled). The archive's pickle is
parsed first by the restricted unpickler onto the meta device (torch_format.check_structure):
what it describes decides whether the item fits. Any other item (a resharded chunk, a view, a
device tensor) is read the staged way (reader.FastStorageReader). A damaged item raises, naming
it, as a load through DCP's own reader fails: tensors filled before it stay filled.

Why: the staged way holds every item of a file in memory of its own before copying it over, so a
resume needs its state's size twice and copies all of it once more. Measured with
benchmarks/dcp.py's state (0.5 GB a rank, 2 ranks, from the disk): a process's first load took
1.5-1.7 s staged and 0.9-1.2 s in place, a later one 0.7-0.8 s staged and 0.46-0.50 s in place.
"""
from __future__ import annotations

import torch

from ..errors import CorruptCheckpointError
from ..format.reading import read_into
from ..format.torch_format import check_crcs, check_structure
from ..format.zip_reader import ZipIndex


def fits(path: str, idx: ZipIndex, offsets, lengths, target: torch.Tensor, known: dict | None = None) -> bool:
    """Whether the archive holds exactly `target`'s bytes: one storage, the whole tensor asked for.
    known: the CRC-32 of the data.pkl it parsed goes there (by file offset), for read()."""
    data = [e for name, e in idx.entries.items() if name.startswith("data/")]
    if len(data) != 1 or target.device.type != "cpu" or not target.is_contiguous():
        return False
    stored = check_structure(path, idx, known)  # restricted unpickler; raises on a hostile or broken pickle
    if not isinstance(stored, torch.Tensor) or stored.dtype != target.dtype or stored.shape != target.shape:
        return False
    if not stored.is_contiguous() or stored.storage_offset() != 0 or any(offsets):
        return False
    return list(lengths) == list(stored.shape) and data[0].size == target.nbytes == stored.untyped_storage().nbytes()


def read(path: str, placed: list[tuple[str, ZipIndex, torch.Tensor]], verify: bool, threads,
         known: dict | None = None) -> None:
    """placed: (item name, archive, target) per item, in file order. Each archive's data record
    into its target, its other records into small buffers, all in one parallel pass, then every
    CRC-32 checked. known: CRC-32s already taken of records, by file offset (the data.pkl fits()
    parsed): those records are not read again."""
    known = known if verify and known is not None else {}
    places, orders = [], []
    for _, idx, target in placed:
        order = idx.ordered()
        orders.append(order)
        for e in order:
            if e.data_off in known:
                continue
            is_data = e.name[len(idx.prefix):].startswith("data/")
            places.append((target if is_data else torch.empty(e.size, dtype=torch.uint8), e.data_off))
    taken = iter(read_into(path, places, verify, threads))
    if not verify:
        return
    for (name, idx, _), order in zip(placed, orders):
        crcs = [known[e.data_off] if e.data_off in known else next(taken) for e in order]
        try:
            check_crcs(path, idx, order, crcs)
        except CorruptCheckpointError as e:
            raise CorruptCheckpointError(f"DCP item {name!r}: {e}") from None

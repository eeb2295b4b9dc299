"""The one check that a tensor view described by a file fits the storage it names.

A view is (storage offset, sizes, strides) in elements. torch's `set_` grows a resizable
storage to fit whatever it is given, so a crafted file could make a load allocate without
bound; every view a loader builds from file metadata is checked here first.
"""
from __future__ import annotations

from ..errors import CorruptCheckpointError


def check_view(storage_bytes: int, itemsize: int, offset, size, stride, where: str) -> None:
    """Raises CorruptCheckpointError unless the view lies inside storage_bytes."""
    try:
        offset, size, stride = int(offset), [int(s) for s in size], [int(s) for s in stride]
    except (TypeError, ValueError):
        raise CorruptCheckpointError(f"{where}: a tensor view has non-integer geometry") from None
    if len(size) != len(stride) or offset < 0 or any(s < 0 for s in size) or any(s < 0 for s in stride):
        raise CorruptCheckpointError(f"{where}: a tensor view has invalid geometry "
                                     f"(offset {offset}, sizes {size}, strides {stride})")
    if 0 in size:
        return
    last = offset + sum((n - 1) * s for n, s in zip(size, stride))
    if (last + 1) * itemsize > storage_bytes:
        raise CorruptCheckpointError(
            f"{where}: a tensor view (offset {offset}, sizes {size}, strides {stride}) reaches "
            f"element {last} of a storage of {storage_bytes // max(1, itemsize)} elements")

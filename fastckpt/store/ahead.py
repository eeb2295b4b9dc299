"""Files made ahead: the file of a rank's next part, created and preallocated once a checkpoint
has landed, so that the next save's writers start writing at once.

A new checkpoint file costs its create and the preallocation of every block (ext4: 2.5-8 ms for
1 GiB on this project's VM), and the writers cannot put a byte before both are done: time the
disk is idle on every save's critical path. Made ahead on the commit thread, after retention,
the next save renames it into its folder instead (one metadata operation).

A file made ahead is new: never written, its blocks allocated and reading as zeros, as the file
the save would have created. Never an old checkpoint's file written over: a load may have mapped
that one (a private mapping shows what is later written into its file), and a fresh file is
what the O_DIRECT bound of the benchmarks writes too.

Layout:  PLACE/.ahead/rank-R.pt  (made as a unique temporary name there, renamed when whole)
Not a checkpoint: nothing lists it, and nothing is lost with it. Its names are made durable before
the record of the checkpoint that took it (`durable_moves`, from the store's finish_write, while
that checkpoint's bytes are still being written): where directories are durable one by one (POSIX
orders no two), a rename is durable once both folders are fsync'ed, and the record fsyncs only
the checkpoint's own. A crash may leave a file made ahead, or a temporary one: `clear()` removes
them when writing starts, and each rank's own when its owner closes. None is made on a memory
filesystem, where it would hold memory until the next save; where the disk has no room for it,
none is made and the next save creates its file as before.
"""
from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
import threading

from .. import _native
from ..fsutil import fsync_dir

log = logging.getLogger("fastckpt")

FOLDER = ".ahead"


def path_of(place: str, name: str) -> str:
    """Where the file made ahead for a part named `name` lies under place."""
    return os.path.join(place, FOLDER, name)


def make(place: str, name: str, nbytes: int) -> bool:
    """The file of the next part named `name` (about nbytes), made and preallocated now, unless
    one is there already. False when none was made (a memory filesystem, no room, an error: the
    next save creates its file itself). Never raises: it runs after a checkpoint landed."""
    final = path_of(place, name)
    if nbytes <= 0 or os.path.exists(final):
        return False
    tmp = f"{final}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        if _native.on_memory_filesystem(place):
            return False
        os.makedirs(os.path.dirname(final), exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            os.posix_fallocate(fd, 0, nbytes)
        finally:
            os.close(fd)
        os.rename(tmp, final)
        return True
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            log.debug("fastckpt: no file made ahead at %s: %s", final, e)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False


def take(place: str, name: str, dst: str) -> bool:
    """The file made ahead for a part named `name`, moved to dst (where the part goes); False
    when there is none, it was taken, or it is not a plain file (a link there would have the
    part written wherever it points): the sink then creates dst."""
    src = path_of(place, name)
    try:
        if not stat.S_ISREG(os.lstat(src).st_mode):
            return False
        os.rename(src, dst)
        return True
    except OSError:
        return False


def durable_moves(place: str) -> None:
    """The folder of the files made ahead fsync'ed: every file made there, and every one taken
    from it, durable by name there (before the commit record of a checkpoint that took one)."""
    fsync_dir(os.path.join(place, FOLDER))


def clear(place: str, names=None) -> None:
    """The files made ahead under place for parts of these names removed (names None: every one,
    and any a crash left half made, when writing starts)."""
    folder = os.path.join(place, FOLDER)
    if names is None:
        shutil.rmtree(folder, ignore_errors=True)
        return
    for name in names:
        try:
            os.unlink(path_of(place, name))
        except OSError:
            pass
    try:
        os.rmdir(folder)  # only once empty: another rank's may still be there
    except OSError:
        pass

"""User-facing errors: the CLI prints their message as one line and exits with code 2."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

# What to do about an operating-system fault, by errno (the rest: check the path).
OS_HINTS = {
    errno.ENOSPC: "free disk space (or point the output elsewhere) and run again; "
    "resume=<run folder> continues from its last checkpoint",
    errno.EDQUOT: "free space within your disk quota and run again",
    errno.EACCES: "make it writable (and readable) for you, or choose another location",
    errno.EPERM: "make it writable (and readable) for you, or choose another location",
    errno.EROFS: "it is on a read-only file system; choose another location",
    errno.ENOENT: "check the path",
    errno.ENOTDIR: "a part of the path is a file, not a folder; check the path",
    errno.EISDIR: "it is a folder; give a file name",
    errno.EIO: "the device reported an I/O error; check the disk",
}


class UserInputError(ValueError):
    """Bad input from the user (a value, a path, a missing optional package).

    The message names the bad value and what is allowed.
    """


def naming(error: OSError, path: object) -> OSError:
    """``error`` with ``path`` as its file name if it had none (a failed ``write`` on an open
    handle names no file): re-raise it so the one-line message says which file failed."""
    if error.filename is not None:
        return error
    return type(error)(error.errno, error.strerror or str(error), str(path))


def describe_os_error(error: OSError) -> str:
    """One line naming the file, what went wrong and what to do, e.g.
    ``/x/last.pt: No space left on device; free disk space ...``."""
    where = error.filename if error.filename is not None else "a file"
    if error.filename2 is not None:
        where = f"{where} -> {error.filename2}"
    reason = error.strerror or str(error) or type(error).__name__
    if error.errno in FULL and error.filename is not None:
        reason += space_note(Path(error.filename), getattr(error, "needed", None))
    hint = OS_HINTS.get(error.errno or -1, "check the path and the disk")
    return f"{where}: {reason}; {hint}"


FULL = (errno.ENOSPC, errno.EDQUOT)


def space_note(path: Path, needed: int | None) -> str:
    """`` (0.4 MB free there; it needs at least 1.2 MB)``: the free space on ``path``'s disk
    and the size the failed write needed (what it wrote, or the file it replaces; None:
    unknown)."""
    folder = next((p for p in (path, *path.parents) if p.is_dir()), None)
    if folder is None:
        return ""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return ""
    note = f" ({_size(free)} free there"
    return note + (f"; it needs at least {_size(needed)})" if needed else ")")


def _size(count: int) -> str:
    return f"{count / 2**20:.1f} MB" if count >= 2**20 else f"{count / 2**10:.0f} KB"

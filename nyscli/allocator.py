"""Which memory allocator a ``nys`` process runs on: tcmalloc where it is installed.

Training on the CPU allocates and frees the same large activations every step. glibc's
malloc gives every block above its mmap threshold (at most 32 MiB) a fresh mapping, and
returns freed heap tops to the kernel, so such tensors are page-faulted and zeroed again on
each step. Measured on ListOps Nyström training (docs/results/training-profile.md): with
tcmalloc preloaded the trainer ran ~1.2x the tokens/s at half the peak memory. PyTorch's own
CPU launcher (``python -m torch.backends.xeon.run_cpu``) preloads tcmalloc for the same reason.

The allocator must be in place before the interpreter allocates, so ``nys`` re-executes
itself once with ``LD_PRELOAD`` set (Linux only), before torch is imported and before its
signal handlers are installed. ``NYS_ALLOCATOR`` chooses:

- ``auto`` (default): tcmalloc if one of ``LIBRARIES`` is found in ``search_dirs()``, else the
  system's malloc;
- ``tcmalloc``: tcmalloc, or a one-line error if it is not installed;
- ``system``: never preload.

Child processes inherit the preload. ``nys bench``'s workers are the exception: their memory
rule (``nyscli.experiments.bench.memory``) is defined on glibc's malloc, so they get
``system_environ()``. Every run records the allocator it ran on in env.json (``active()``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from nyscli.errors import UserInputError

ALLOCATOR_ENV = "NYS_ALLOCATOR"
CHOICES = ("auto", "tcmalloc", "system")
# The library nys preloaded, so a child (or the re-executed process) knows it is done and
# ``system_environ`` can take exactly that one out of LD_PRELOAD again.
PRELOADED_ENV = "NYS_PRELOADED_ALLOCATOR"
# The minimal build first (no heap profiler; Debian/Ubuntu: libtcmalloc-minimal4).
LIBRARIES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
# Allocators a user may preload themselves (then nys leaves LD_PRELOAD as it is).
MALLOC_LIBRARIES = ("libtcmalloc", "libjemalloc", "libmimalloc")
# Set by the shell's tab completion (Typer): it allocates nothing worth a second start.
COMPLETION_ENV = "_NYS_COMPLETE"
# tcmalloc reports every allocation above 1 GiB on stderr; runs make such tensors on purpose.
REPORT_ENV = "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD"
NO_REPORT = str(1 << 50)


def _preloads(environ: Mapping[str, str]) -> list[str]:
    """The libraries ``environ``'s LD_PRELOAD names, in order."""
    return [p for p in environ.get("LD_PRELOAD", "").split(":") if p]


def search_dirs() -> list[Path]:
    """Where tcmalloc is looked for: this environment's lib (a conda or virtualenv install
    first), then the system's library folders."""
    prefixes = dict.fromkeys([Path(sys.prefix), Path(sys.base_prefix)])
    system = ["/usr/local/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu"]
    return [p / "lib" for p in prefixes] + [Path(d) for d in (*system, "/usr/lib64", "/usr/lib")]


def find_tcmalloc(dirs: list[Path] | None = None) -> str | None:
    """The path of the first tcmalloc library in ``dirs`` (default ``search_dirs()``), or None."""
    for library in LIBRARIES:
        for folder in search_dirs() if dirs is None else dirs:
            if (folder / library).is_file():
                return str(folder / library)
    return None


def choice(environ: Mapping[str, str]) -> str:
    """``NYS_ALLOCATOR``'s value (default auto), or a one-line error naming what is allowed."""
    value = environ.get(ALLOCATOR_ENV, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise UserInputError(
            f"{ALLOCATOR_ENV}={environ[ALLOCATOR_ENV]!r} is not allowed; choose one of: "
            f"{', '.join(CHOICES)}"
        )
    return value


def preload_environ(environ: Mapping[str, str], library: str | None) -> dict[str, str] | None:
    """The environment to re-execute with so ``library`` (tcmalloc's path, None = not found)
    is preloaded, or None when this process should go on as it is: not Linux, allocator
    ``system``, tcmalloc already preloaded by nys, tab completion, an allocator the user
    preloads, or (``auto``) none installed."""
    wanted = choice(environ)
    linux = sys.platform.startswith("linux")
    if wanted == "tcmalloc" and not linux:
        raise UserInputError(
            f"{ALLOCATOR_ENV}=tcmalloc works on Linux only (this is {sys.platform}); "
            f"set {ALLOCATOR_ENV}=auto or system"
        )
    done = PRELOADED_ENV in environ or COMPLETION_ENV in environ
    if wanted == "system" or done or not linux:
        return None
    theirs = preloaded(environ)
    if theirs != "system":  # the user preloads an allocator of their own: two would fight
        if wanted == "tcmalloc" and not Path(theirs).name.startswith("libtcmalloc"):
            raise UserInputError(
                f"{ALLOCATOR_ENV}=tcmalloc but LD_PRELOAD already names {theirs}; unset one of them"
            )
        return None
    if library is None:
        if wanted == "tcmalloc":
            raise UserInputError(
                f"{ALLOCATOR_ENV}=tcmalloc but none of {', '.join(LIBRARIES)} is installed "
                f"(Debian/Ubuntu: apt-get install libtcmalloc-minimal4); or set "
                f"{ALLOCATOR_ENV}=auto"
            )
        return None
    new = dict(environ)
    new["LD_PRELOAD"] = ":".join([library, *_preloads(environ)])
    new[PRELOADED_ENV] = library
    new.setdefault(REPORT_ENV, NO_REPORT)
    return new


def reexec_with_tcmalloc() -> None:
    """Replace this process by itself with tcmalloc preloaded, when ``preload_environ`` says
    so (``nys``'s first step; the same pid, arguments and streams). Raises UserInputError
    for a bad ``NYS_ALLOCATOR``."""
    environ = preload_environ(os.environ, find_tcmalloc())
    if environ is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, sys.orig_argv, environ)
    except OSError:
        return  # cannot re-execute (an unusual interpreter): run on the system's malloc


def system_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the tcmalloc nys preloaded (a user's own LD_PRELOAD stays)."""
    new = dict(environ)
    library = new.pop(PRELOADED_ENV, None)
    if library is not None:
        kept = [p for p in _preloads(new) if p != library]
        if kept:
            new["LD_PRELOAD"] = ":".join(kept)
        else:
            new.pop("LD_PRELOAD", None)
    new[ALLOCATOR_ENV] = "system"
    return new


def preloaded(environ: Mapping[str, str]) -> str:
    """The allocator a process started with ``environ`` runs on, as its LD_PRELOAD says: the
    first allocator library it names, else "system" (e.g. ``nys bench``'s workers, started
    with ``system_environ``: "system", unless the user preloads one of their own)."""
    mallocs = [p for p in _preloads(environ) if Path(p).name.startswith(MALLOC_LIBRARIES)]
    return mallocs[0] if mallocs else "system"


def active(maps: str | None = None) -> str:
    """The allocator this process runs on: the path of the tcmalloc (or a user's jemalloc or
    mimalloc) mapped into it, else "system" (read from /proc/self/maps; "system" where that
    does not exist). ``maps``: that file's text (default: read it)."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return "system"
    for line in maps.splitlines():
        path = line.split(maxsplit=5)[5:]
        if path and Path(path[0]).name.startswith(MALLOC_LIBRARIES):
            return path[0]
    return "system"

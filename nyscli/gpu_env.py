"""The GPU path's switches read from the environment, checked by ``nys`` before it starts.

Torch-free, so that ``nys`` can refuse a bad value in one line before importing anything heavy
(``nyscli.attention.gpu.gates`` builds the gates from the same values).

- ``NYS_GPU_CHECKED``: the GPU kernels or paths a GPU has checked against float64 in this
  machine's session (``scripts/gpu_profile.py``), turned on before their defaults are: a
  comma-separated list of CHECKABLE names.
- ``NYS_HYBRID_LAUNCH``: the hybrid kernel's launch settings, "key=value,..." over
  HYBRID_LAUNCH_DEFAULT's keys, whole numbers >= 1.
"""

from __future__ import annotations

from collections.abc import Mapping

from nyscli.errors import UserInputError

CHECKED_ENV = "NYS_GPU_CHECKED"
HYBRID_LAUNCH_ENV = "NYS_HYBRID_LAUNCH"
# "hybrid" names both widths of the hybrid's kernel.
CHECKABLE = ("hybrid", "hybrid-16-bit", "hybrid-32-bit", "inference", "graph", "graph-train")
# Landmark and heavy-key tiles padded to at least min_tile, warps, the band loops' stages:
# what passed against float64 in both widths and ran fastest on a GPU
# (docs/results/gpu-notes.md, "hybrid launch").
HYBRID_LAUNCH_DEFAULT = {"min_tile": 64, "num_warps": 8, "num_stages": 1}


def checked(text: str) -> set[str]:
    """The names in a ``NYS_GPU_CHECKED`` value."""
    names = {part.strip() for part in text.split(",")} - {""}
    if unknown := sorted(names - set(CHECKABLE)):
        raise UserInputError(
            f"{CHECKED_ENV}: {', '.join(map(repr, unknown))} is not one of {', '.join(CHECKABLE)}"
        )
    return names


def hybrid_launch(text: str) -> dict[str, int]:
    """The settings in a ``NYS_HYBRID_LAUNCH`` value ("key=value,...")."""
    settings = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = item.partition("=")
        if (
            key not in HYBRID_LAUNCH_DEFAULT
            or not (value.isascii() and value.isdigit())
            or int(value) < 1
        ):
            raise UserInputError(
                f"{HYBRID_LAUNCH_ENV}: {item!r} is not one of "
                f"{', '.join(HYBRID_LAUNCH_DEFAULT)}=<whole number >= 1>"
            )
        settings[key] = int(value)
    return settings


def check(environ: Mapping[str, str]) -> None:
    """Raise UserInputError (one line) for a bad value of either variable."""
    checked(environ.get(CHECKED_ENV, ""))
    hybrid_launch(environ.get(HYBRID_LAUNCH_ENV, ""))

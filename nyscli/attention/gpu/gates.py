"""Which code paths the attention core may take, as one immutable value.

Built once from the environment (``NYS_GPU_CHECKED``, ``NYS_HYBRID_LAUNCH``, Triton's
interpreter, whether triton is installed) and the paths a GPU has checked against float64;
changed only for the length of a ``with override(...)`` block, which is how tests and
``scripts/gpu_profile.py`` reach the paths a CPU or a default would not take.

    from nyscli.attention.gpu import gates
    with gates.override(testing=True):   # CPU tensors through the kernels (interpreter)
        ...
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from nyscli import gpu_env

# The paths on by default on CUDA: each has a passing row against float64 on a GPU in a
# committed equality CSV (docs/results/gpu/, held by tests/gpu/test_gates.py). A path added
# later starts off; NYS_GPU_CHECKED turns it on after scripts/gpu_profile.py checked it.
CHECKED_BY_DEFAULT = frozenset({"hybrid-16-bit", "hybrid-32-bit", "inference", "graph"})

# How the landmark programs multiply float32 tiles, by the width of the attention's operands,
# and their warps per kernel: measured on a GPU (docs/results/gpu-notes.md, "products").
PRODUCTS = MappingProxyType({"16-bit": "tf32", "32-bit": "tf32x3"})
WARPS = MappingProxyType(
    {
        "tf32": MappingProxyType({"forward": 4, "backward": 4, "pinv": 4}),
        "tf32x3": MappingProxyType({"forward": 4, "backward": 8, "pinv": 4}),
    }
)


def checked_paths(named: str, defaults: frozenset[str] = CHECKED_BY_DEFAULT) -> frozenset[str]:
    """The CUDA paths on: ``defaults`` and those a NYS_GPU_CHECKED value names ("hybrid"
    names both widths of the hybrid's kernel)."""
    on = set(defaults) | gpu_env.checked(named)
    if "hybrid" in on:
        on |= {"hybrid-16-bit", "hybrid-32-bit"}
    return frozenset(on - {"hybrid"})


@dataclass(frozen=True)
class Gates:
    """What may run. Fields:

    - checked: the CUDA paths on (``gpu_env.CHECKABLE`` names, "hybrid" as its two widths).
    - hybrid_launch: the hybrid kernel's launch settings (min_tile, num_warps, num_stages).
    - products, warps: the landmark programs' float32 products by operand width, and warps.
    - triton: triton is installed (False: the torch path everywhere, as without it).
    - interpreting: Triton runs its interpreter (TRITON_INTERPRET=1), not the compiler.
    - testing: tests only: CPU tensors take the kernels (under the interpreter), float64 on
      a GPU too, and unchecked CUDA paths run. Users' CPU runs keep the CPU path.
    - graphs_on_cpu: tests only: inference graphs with a stand-in for the CUDA graph.
    - fused_cpu: CPU training of unpadded segment means through ``nystrom_cpu``'s node.
    """

    checked: frozenset[str] = CHECKED_BY_DEFAULT
    hybrid_launch: Mapping[str, int] = field(
        default_factory=lambda: MappingProxyType(dict(gpu_env.HYBRID_LAUNCH_DEFAULT))
    )
    products: Mapping[str, str] = field(default_factory=lambda: PRODUCTS)
    warps: Mapping[str, Mapping[str, int]] = field(default_factory=lambda: WARPS)
    triton: bool = False
    interpreting: bool = False
    testing: bool = False
    graphs_on_cpu: bool = False
    fused_cpu: bool = True

    def allows(self, path: str, cuda: bool) -> bool:
        """Whether a checked-on-GPU ``path`` may serve a tensor (on CUDA if ``cuda``)."""
        return path in self.checked or self.testing or not cuda

    def record(self) -> dict[str, Any]:
        """The gates as env.json keeps them."""
        return {
            "checked": sorted(self.checked),
            "hybrid_launch": dict(self.hybrid_launch),
            "products": dict(self.products),
            "triton": self.triton,
            "interpreting": self.interpreting,
        }


def from_environ(environ: Mapping[str, str]) -> Gates:
    """The gates a process starts with (UserInputError, one line, for a bad switch)."""
    launch = {
        **gpu_env.HYBRID_LAUNCH_DEFAULT,
        **gpu_env.hybrid_launch(environ.get(gpu_env.HYBRID_LAUNCH_ENV, "")),
    }
    return Gates(
        checked=checked_paths(environ.get(gpu_env.CHECKED_ENV, "")),
        hybrid_launch=MappingProxyType(launch),
        # found, not imported: importing triton takes about a second that CPU runs need not pay
        triton=importlib.util.find_spec("triton") is not None,
        interpreting=environ.get("TRITON_INTERPRET", "0") == "1",
    )


_current: Gates | None = None


def current() -> Gates:
    """The gates in force (built from ``os.environ`` on first use)."""
    global _current
    if _current is None:
        _current = from_environ(os.environ)
    return _current


@contextmanager
def override(**changes: Any) -> Iterator[Gates]:
    """The current gates with ``changes`` (Gates' fields; mappings are frozen) until the block
    ends, whatever way it ends."""
    global _current
    before = current()
    frozen = {
        k: MappingProxyType(dict(v)) if isinstance(v, Mapping) else v for k, v in changes.items()
    }
    if "checked" in frozen:
        frozen["checked"] = frozenset(frozen["checked"])
    _current = replace(before, **frozen)
    try:
        yield _current
    finally:
        _current = before

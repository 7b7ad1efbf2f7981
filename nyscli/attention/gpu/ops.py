"""What every GPU op shares: a launch stated once, the rule for where the kernels can run,
custom-op registration, and the list of ops that ``scripts/compile_check.py`` compiles.

An op module builds each of its kernel launches as a ``Launch`` (kernel, grid, arguments by
name): the op runs it, and compile_check reads the same value to compile the kernel with the
argument types the op passes, so no argument list is written twice. An op registers itself
with ``register(name, gate, examples)``; ``examples`` builds its launches at the core's shapes
on meta tensors (nothing runs).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch
from torch import Tensor

from nyscli import gpu_env
from nyscli.attention.gpu import gates

# The register tile a landmark program holds: m and d are padded up to powers of two of at
# least 16 (tl.dot's smallest), and beyond these the m x m iterates would spill out of registers.
MAX_LANDMARKS = 64
MAX_HEAD_DIM = 128
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# torch < 2.4 has no custom ops, so no GPU path (torch.compile would break the graph there).
HAS_CUSTOM_OPS = hasattr(torch.library, "custom_op")

# Triton's names of the tensor dtypes a kernel reads, for a signature.
POINTER_TYPES = {
    torch.float64: "*fp64",
    torch.float32: "*fp32",
    torch.bfloat16: "*bf16",
    torch.float16: "*fp16",
    torch.int8: "*i8",
    torch.int32: "*i32",
}


def kernels_serve(q: Tensor, v: Tensor, m: int) -> bool:
    """Whether the landmark programs can take m landmarks of q: (B, H, n, d), v: (B, H, n,
    d_v): where Triton runs (CUDA; CPU tensors only in tests, under the interpreter), float64
    on CUDA only in tests (a reference keeps the torch path), in a tile that fits."""
    g = gates.current()
    if q.is_cuda:
        device_ok = q.dtype != torch.float64 or g.testing
    else:
        device_ok = g.testing and g.interpreting and q.device.type == "cpu"
    return (
        device_ok
        and m <= MAX_LANDMARKS
        and q.shape[-1] <= MAX_HEAD_DIM
        and v.shape[-1] == q.shape[-1]
        and q.dtype in KERNEL_DTYPES
        and HAS_CUSTOM_OPS
        and g.triton
    )


@cache
def kernel(name: str) -> Any:
    """The Triton kernel "package.module:function" (its module, and triton, imported on first
    use: CPU runs never load them)."""
    module, function = name.split(":")
    return getattr(importlib.import_module(module), function)


@dataclass(frozen=True)
class Launch:
    """One kernel launch: ``kernel`` ("package.module:function"), its grid, every argument by name
    (tensors, numbers, None, constexpr values) and the launch options (num_warps, ...)."""

    kernel: str
    grid: tuple[int, ...]
    args: Mapping[str, Any]
    options: Mapping[str, int] = field(default_factory=dict)

    def __call__(self) -> None:
        kernel(self.kernel)[self.grid](**self.args, **self.options)

    def signature(self) -> tuple[dict[str, str], dict[str, Any]]:
        """(argument types, constexpr values) as ``triton.compile`` takes them."""
        params = inspect.signature(kernel(self.kernel).fn).parameters
        types: dict[str, str] = {}
        constants: dict[str, Any] = {}
        for name, param in params.items():
            value = self.args[name]
            if "constexpr" in str(param.annotation) or value is None:
                constants[name] = value
            elif isinstance(value, Tensor):
                types[name] = POINTER_TYPES[value.dtype]
            elif isinstance(value, bool):
                types[name] = "i1"
            else:
                types[name] = "i32" if isinstance(value, int) else "fp32"
        return types, constants


def custom_op(name: str, schema: str, fn: Callable[..., Any], fake: Callable[..., Any]) -> Any:
    """``fn`` as the custom op nys::<name> (torch.compile keeps it whole and takes its output
    shapes from ``fake``), or ``fn`` itself where torch has no custom ops."""
    if not HAS_CUSTOM_OPS:
        return fn
    op = torch.library.custom_op(f"nys::{name}", mutates_args=(), schema=schema)(fn)
    op.register_fake(fake)
    return op


@dataclass(frozen=True)
class Op:
    """A GPU op: its name, the gate that turns it on for CUDA (a ``gpu_env.CHECKABLE`` name;
    None: on wherever its kernels serve) and its launches at the core's shapes, by row name."""

    name: str
    gate: str | None
    examples: Callable[[], Iterable[tuple[str, Launch]]]


OPS: dict[str, Op] = {}


def register(
    name: str, gate: str | None, examples: Callable[[], Iterable[tuple[str, Launch]]]
) -> Op:
    """Add an op to ``OPS`` (what compile_check compiles); its gate must be a known switch."""
    if gate is not None and gate not in gpu_env.CHECKABLE:
        raise ValueError(f"op {name}: gate {gate!r} is not in gpu_env.CHECKABLE")
    OPS[name] = Op(name, gate, examples)
    return OPS[name]


def load_all() -> dict[str, Op]:
    """``OPS`` once every op module of this package is imported (kernel and helper modules
    are not: they import triton)."""
    package = importlib.import_module("nyscli.attention.gpu")
    for found in pkgutil.iter_modules(package.__path__):
        if not found.name.endswith(("_kernels", "helpers")):
            importlib.import_module(f"{package.__name__}.{found.name}")
    return OPS


def meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """An example tensor of the core's shapes that holds no memory."""
    return torch.empty(shape, dtype=dtype, device="meta")

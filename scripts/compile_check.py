#!/usr/bin/env python3
"""Compile every Triton kernel of the attention core for a GPU, without one: errors, registers,
stack (spills) and shared memory per kernel, from Triton's own compiler and ptxas.

    scripts/compile_check.py [--arch 90] [--quick] [--ptx DIR]

Triton's interpreter (what the tests run on a CPU) executes a kernel's Python; it does not
compile it, so a kernel can pass every interpreter test and still fail to compile or spill
kilobytes per thread on the GPU (docs/results/gpu-notes.md). This compiles each kernel at the
shapes the core launches (each op's examples in ``nyscli/attention/gpu/``: m = 64, d = 64,
bf16 tiles; the hybrid at budget 128) for sm_<arch> with its launch options and prints one
row per kernel. Exit 1 when any kernel fails to compile. ``--quick``: not the landmark
backward (about a minute of ptxas). ``--ptx DIR``: each kernel's PTX, debug information left
out, as DIR/<row>.ptx, to compare two commits (``diff -r``): a refactor that leaves every
file the same changed nothing the GPU runs. Needs triton (``scripts/setup --dev``); run it
without ``TRITON_INTERPRET`` (the tests start it in a process of its own).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's nyscli, installed or not


# ptxas takes about a minute over the landmark backward alone.
SLOW = {"landmark backward"}


def kernels(quick: bool) -> list[tuple[str, object, dict, dict, dict]]:
    """(name, kernel, argument types, constexprs, options) of every launch the GPU ops list
    (``nyscli.attention.gpu.ops.OPS``), as each op builds it at the core's shapes."""
    from nyscli.attention.gpu import ops

    rows = []
    for op in ops.load_all().values():
        for name, launch in op.examples():
            if quick and name in SLOW:
                continue
            types, constants = launch.signature()
            options = {"num_warps": 4, **launch.options}
            rows.append((name, ops.kernel(launch.kernel), types, constants, options))
    return rows


def usage(cubin: bytes) -> dict[str, int]:
    """Registers, stack and spills of a cubin, read by the cuobjdump that Triton carries."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        text = subprocess.run(
            [str(tool), "-res-usage", handle.name], capture_output=True, text=True, check=True
        ).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", text)
    return {"registers": int(found[1]), "stack": int(found[2])} if found else {}


def write_ptx(folder: Path, name: str, ptx: str) -> None:
    """The kernel's PTX without its debug sections and comments (file paths, line numbers)."""
    code = ptx.split(".section\t.debug")[0].split(".section .debug")[0]
    debug = ("//", ".loc", ".file", "$L__tmp", "$L__func_")
    lines = [
        line for line in code.splitlines() if line.strip() and not line.lstrip().startswith(debug)
    ]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / (re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-") + ".ptx")).write_text(
        "\n".join(lines) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100)")
    parser.add_argument("--quick", action="store_true", help="not the landmark backward")
    parser.add_argument("--ptx", type=Path, help="write each kernel's PTX into this folder")
    opts = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("compile_check: TRITON_INTERPRET=1 runs kernels, it does not compile them: unset it")
        sys.exit(2)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", opts.arch, 32)
    print(f"triton {triton.__version__}, sm_{opts.arch}")
    print(f"{'kernel':<36} {'warps':>5} {'registers':>9} {'stack B':>8} {'shared B':>8} {'s':>4}")
    failed = 0
    for name, kernel, types, constants, options in kernels(opts.quick):
        warps = options["num_warps"]
        start = time.monotonic()
        signature = {**types, **dict.fromkeys(constants, "constexpr")}
        try:
            source = ASTSource(kernel, signature, constexprs=constants)
            compiled = triton.compile(source, target=target, options=options)
        except Exception as error:  # the row, then the next kernel
            failed += 1
            first = str(error).strip().splitlines()[-1] if str(error).strip() else ""
            print(f"{name:<36} {warps:>5} FAILED: {type(error).__name__}: {first[:200]}")
            continue
        if opts.ptx:
            write_ptx(opts.ptx, name, compiled.asm["ptx"])
        found = usage(compiled.asm["cubin"])
        print(
            f"{name:<36} {warps:>5} {found.get('registers', '?'):>9} "
            f"{found.get('stack', '?'):>8} {compiled.metadata.shared:>8} "
            f"{time.monotonic() - start:>4.0f}",
            flush=True,
        )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

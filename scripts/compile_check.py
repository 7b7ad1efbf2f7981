#!/usr/bin/env python3
"""Compile every Triton kernel of the attention core for a GPU, without one: errors, registers,
stack (spills) and shared memory per kernel, from Triton's own compiler and ptxas.

    scripts/compile_check.py [--arch 90] [--quick]

Triton's interpreter (what the tests run on a CPU) executes a kernel's Python; it does not
compile it, so a kernel can pass every interpreter test and still fail to compile or spill
kilobytes per thread on the GPU (docs/results/gpu-notes.md). This compiles each kernel at the
shapes the core launches (m = 64, d = 64, bf16 tiles; the hybrid at budget 128) for sm_<arch>
and prints one row per kernel. Exit 1 when any kernel fails to compile. ``--quick``: not the
landmark backward (about a minute of ptxas). Needs triton (``scripts/setup --dev``); run it
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


def kernels(quick: bool) -> list[tuple[str, object, dict, dict, int]]:
    """(name, kernel, argument types, constexprs, warps) as the core launches each."""
    import torch
    import triton.language as tl

    from nyscli.attention.gpu import hybrid_kernels as local
    from nyscli.attention.gpu import landmark as nystrom_gpu
    from nyscli.attention.gpu import landmark_kernels as landmark

    prec = nystrom_gpu.PRODUCTS["16-bit"]  # the bf16 tiles below
    warps = nystrom_gpu.WARPS[prec]
    f32, i32 = "*fp32", "i32"
    shape = {"heads": i32, "scale": "fp32", "tiny": "fp32", "M": i32, "D": i32}
    tile = {"BM": 64, "BD": 64, "ITERS": 6, "HAS_E": True, "DT": tl.float32, "PREC": prec}
    bf16 = dict.fromkeys(("ql_ptr", "kl_ptr", "bv_ptr"), "*bf16")
    f_w_types = {
        **dict.fromkeys(("q_ptr", "kl_ptr", "out_ptr"), "*bf16"),
        **{"w_ptr": f32, "e_ptr": "*i8", "heads": i32, "n": i32, "scale": "fp32"},
        **{"M": i32, "D": i32},
    }
    rounding = nystrom_gpu.rounding(torch.bfloat16)  # what the inference op passes for bf16 work
    f_w_tile = {"BQ": 64, "BM": 64, "BD": 64, "HAS_E": True, "PREC": prec, "HALF_DOT": True,
                "OP": rounding}  # fmt: skip
    rows = [
        (
            "landmark forward",
            landmark.forward,
            {**bf16, "e_ptr": "*i8", "w_ptr": "*bf16", **shape},
            tile,
            warps["forward"],
        ),
        (
            "pinv (hybrid, m = 16)",
            landmark.pinv,
            {"a_ptr": f32, "z_ptr": f32, "tiny": "fp32", "M": i32},
            {"BM": 16, "ITERS": 6, "DT": tl.float32, "PREC": prec},
            warps["pinv"],
        ),
        (
            "Bk V split (inference, float32 q~)",  # padded segment means beside bf16 k, v
            landmark.landmark_attention_split,
            {
                "ql_ptr": f32,
                "k_ptr": "*bf16",
                "v_ptr": "*bf16",
                "keep_ptr": "*i8",
                **dict.fromkeys(("acc_ptr", "top_ptr", "total_ptr"), f32),
                **{"heads": i32, "n": i32, "chunk": i32, "scale": "fp32", "M": i32, "D": i32},
            },
            {
                "BM": 64,
                "BK": 64,
                "BD": 64,
                "HAS_KEEP": True,
                "DT": tl.float32,
                "PREC": prec,
                "HALF_DOT": True,
                "OP": rounding,
            },  # fmt: skip
            4,
        ),
        (
            "Bk V combine (inference)",
            landmark.landmark_attention_combine,
            {
                **dict.fromkeys(("acc_ptr", "top_ptr", "total_ptr"), f32),
                "e_ptr": "*i8",
                "bv_ptr": f32,
                **{"heads": i32, "splits": i32, "M": i32, "D": i32},
            },
            {"BM": 64, "BD": 64, "HAS_E": True},
            4,
        ),
        ("F W (inference)", landmark.landmark_output, f_w_types, f_w_tile, 4),
        (  # bf16 q beside float32 k~ (padded segment means: the LRA Text step, lease 7)
            "F W (inference, float32 k~)",
            landmark.landmark_output,
            {**f_w_types, "kl_ptr": f32},
            f_w_tile,
            4,
        ),
        (
            "F W (inference, autocast)",  # float32 q and k~ read and rounded to bf16 in the kernel
            landmark.landmark_output,
            {**f_w_types, "q_ptr": f32, "kl_ptr": f32},
            f_w_tile,
            4,
        ),
        (
            "hybrid forward (budget 128)",
            local.hybrid_forward,
            {
                **dict.fromkeys(("q_ptr", "k_ptr", "v_ptr", "out_ptr"), "*bf16"),
                "keys_ptr": f32,
                **dict.fromkeys(
                    ("b_ptr", "z_ptr", "sk_ptr", "sv_ptr", "hb_ptr", "hr_ptr", "mass_ptr"), f32
                ),
                **dict.fromkeys(("n", "R", "M", "G", "D"), i32),
                "scale": "fp32",
                "tiny": "fp32",
            },
            {
                "BQ": 64,
                "BK": 64,
                "BM": 16,
                "BG": 32,
                "BD": 64,
                "OP": tl.bfloat16,
                "DT": tl.float32,
                "NATIVE": True,
            },  # fmt: skip
            8,
        ),
    ]
    if not quick:
        grads = dict.fromkeys(("gql_ptr", "gkl_ptr", "gbv_ptr", "scratch_ptr"), f32)
        rows.insert(
            1,
            (
                "landmark backward",
                landmark.backward,
                {**bf16, "e_ptr": "*i8", "gw_ptr": "*bf16", **grads, **shape},
                tile,
                warps["backward"],
            ),
        )
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100)")
    parser.add_argument("--quick", action="store_true", help="not the landmark backward")
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
    for name, kernel, types, constants, warps in kernels(opts.quick):
        start = time.monotonic()
        signature = {**types, **dict.fromkeys(constants, "constexpr")}
        try:
            source = ASTSource(kernel, signature, constexprs=constants)
            compiled = triton.compile(source, target=target, options={"num_warps": warps})
        except Exception as error:  # the row, then the next kernel
            failed += 1
            first = str(error).strip().splitlines()[-1] if str(error).strip() else ""
            print(f"{name:<36} {warps:>5} FAILED: {type(error).__name__}: {first[:200]}")
            continue
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

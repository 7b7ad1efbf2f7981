"""The GPU scripts at toy size on a CPU: gpu_profile.py (kernels in the interpreter) and
compile_check.py (every op's kernels compiled for sm_90, no GPU needed)."""

from __future__ import annotations

import pytest
import torch


def test_the_gpu_profile_script_at_toy_size(tmp_path) -> None:
    # scripts/gpu_profile.py's whole path on the CPU (kernels in the interpreter): every row
    # timed, both paths near the float64 formula, the profiles written.
    import csv
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "gpu_profile.py"
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "--toy"],
        capture_output=True,
        text=True,
        timeout=900,  # a hang guard: ~2 minutes alone, over 5 beside a full suite on 2 cores
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with open(tmp_path / "gpu_profile.csv", newline="") as handle:
        timed = {(r["mode"], r["row"]) for r in csv.DictReader(handle) if r["call_ms"]}
    rows = ("sdpa", "nystrom-torch", "nystrom-triton")
    expected = {(mode, row) for mode in ("forward", "train") for row in rows}
    inference_only = {("forward", r) for r in ("nystrom-fused", "hybrid-torch", "hybrid-triton")}
    assert timed == expected | inference_only
    with open(tmp_path / "equality.csv", newline="") as handle:
        errors = {
            (r["dtype"], r["path"], r["tensor"]): float(r["relative_error_vs_float64"])
            for r in csv.DictReader(handle)
        }
    assert len(errors) == 16 + 2 + 4  # Nyström: output, 3 gradients; fused, hybrid: output
    for (dtype, path, tensor), error in errors.items():
        if path.startswith("nystrom"):
            assert error < (2e-5 if dtype == "float32" else 3e-2), (dtype, path, error)
        else:  # the hybrid in bf16 is ~8% off float64 on both paths (its band's cancellation)
            torch_path = errors[(dtype, "hybrid-torch", tensor)]
            assert error < (2e-5 if dtype == "float32" else 1.25 * torch_path), (dtype, path)
    with open(tmp_path / "variants.csv", newline="") as handle:
        variants = list(csv.DictReader(handle))
    assert {r["kernel"] for r in variants} == {"forward", "backward"} and len(variants) == 6
    for r in variants:  # the interpreter multiplies in float32 whatever the setting
        assert float(r["relative_error_vs_float64"]) < 1e-5 and float(r["gpu_us"]) > 0
    profiled = [(f"nystrom-{p}", m) for p in ("torch", "triton") for m in ("forward", "train")]
    for row, mode in [*profiled, ("nystrom-fused", "forward"), ("hybrid-triton", "forward")]:
        name = row.removeprefix("nystrom-")
        assert (tmp_path / f"profile-{name}-{mode}.txt").read_text().startswith(f"{row} {mode}")
    autocast = (tmp_path / "profile-fused-forward-autocast.txt").read_text()
    assert autocast.startswith("nystrom-fused forward, n = 128, torch.float32:")  # CPU: none


def test_the_gpu_profile_hybrid_matrix_at_toy_size(monkeypatch) -> None:
    # Each launch setting in a process of its own: one that runs (tiles padded to 64, within
    # the torch path's error of float64 in both dtypes), one whose process ends (here a setting
    # out of range; on a GPU, a fault) and is reported, not raised.
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "scripts"))
    import gpu_profile

    monkeypatch.setattr(gpu_profile, "HYBRID_MATRIX", ["min_tile=64,num_stages=1", "min_tile=0"])
    rows = gpu_profile.hybrid_matrix(toy=True)
    ran = [r for r in rows if r["setting"] == "min_tile=64,num_stages=1"]
    assert [(r["status"], r["dtype"], r["min_tile"]) for r in ran] == [
        ("ok", "bfloat16", 64),
        ("ok", "float32", 64),
    ]
    for r in ran:
        assert r["error"] <= 1.25 * r["torch_error"] + 1e-6 and r["within"]
    ended = [r for r in rows if r["setting"] == "min_tile=0"]
    assert [(r["dtype"], r["status"]) for r in ended] == [
        ("bfloat16", "exit 1"),
        ("float32", "exit 1"),
    ]
    assert all("NYS_HYBRID_LAUNCH" in r["why"] for r in ended)
    assert gpu_profile.chosen_setting(rows) == ("min_tile=64,num_stages=1", ["16-bit", "32-bit"])


def test_the_hybrid_setting_chosen_has_the_most_widths_then_the_least_time(monkeypatch) -> None:
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "scripts"))
    import gpu_profile

    monkeypatch.setattr(gpu_profile, "HYBRID_MATRIX", ["a", "b", "c"])
    rows = [
        {"setting": "a", "dtype": "bfloat16", "status": "ok"},
        {"setting": "a", "dtype": "float32", "status": "exit -6"},  # faulted after bf16
        {"setting": "b", "dtype": "bfloat16", "status": "off float64"},
        {"setting": "b", "dtype": "float32", "status": "ok"},
        {"setting": "c", "dtype": "bfloat16", "status": "ok"},
        {"setting": "c", "dtype": "float32", "status": "ok"},
    ]
    assert gpu_profile.chosen_setting(rows) == ("c", ["16-bit", "32-bit"])
    assert gpu_profile.chosen_setting(rows[:4]) == ("a", ["16-bit"])
    timed = [{**r, "gpu_us": 100.0} for r in rows[:4]]
    timed[3]["gpu_us"] = 50.0  # b's float32 beats a's bf16: as many widths, less time
    assert gpu_profile.chosen_setting(timed) == ("b", ["32-bit"])
    assert gpu_profile.chosen_setting([{**r, "status": "exit -6"} for r in rows]) == ("", [])
    monkeypatch.setattr(gpu_profile, "HYBRID_WIDTHS", ["16-bit"])
    assert gpu_profile.kernel_serves("hybrid-triton", torch.bfloat16)
    assert not gpu_profile.kernel_serves("hybrid-triton", torch.float32)
    assert gpu_profile.kernel_serves("hybrid-torch", torch.float32)


def test_every_kernel_compiles_for_sm90_without_spilling_much(tmp_path) -> None:
    # The interpreter runs a kernel's Python but never compiles it: the compiler refused a
    # global the interpreter had read, and float32 FMA products spilled 13 KB per thread.
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton")  # the --dev setup installs it; CI has it
    script = Path(__file__).resolve().parents[2] / "scripts" / "compile_check.py"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(script), "--quick", "--ptx", str(tmp_path)], capture_output=True,
        text=True, env=env,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[2:]]
    assert len(rows) == 8, done.stdout  # F W thrice: bf16, bf16 beside float32 k~, float32
    for row in rows:  # ... registers, stack, shared, seconds
        # At most 1 KB of stack; the hybrid at its default launch (tiles padded to 64, 8
        # warps, 1 stage: the H200's fastest setting, lease 7) keeps 1.3 KB (Triton 3.9).
        stack = 2048 if row[0] == "hybrid" else 1024
        assert int(row[-4]) <= 255 and int(row[-3]) <= stack, row
    # each kernel's PTX, to compare commits by: code only, no file paths or line numbers
    ptx = sorted(tmp_path.glob("*.ptx"))
    assert len(ptx) == 8 and (tmp_path / "landmark-forward.ptx").exists()
    for path in ptx:
        text = path.read_text()
        assert ".entry" in text and ".loc" not in text and str(script.parent) not in text

"""Shared fixtures: float64 inputs with structure along the sequence, and CLI helpers."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

# Without a GPU, Triton's kernels are tested in its interpreter, which must be chosen before
# triton is first imported (its own library functions are decorated then); nys itself never
# runs them on CPU tensors unless a test asks (nyscli.attention.gpu.landmark.TESTING).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tests.helpers import nys_subprocess  # noqa: E402  (after the interpreter's switch)

REPO = Path(__file__).resolve().parents[1]

# Under pytest-xdist, workers share the cores: one worker's torch ops should not take them all.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


@pytest.fixture
def run_nys(tmp_path):
    """Run the real ``nys`` console entry point in a subprocess inside tmp_path."""

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return nys_subprocess(tmp_path, *args, timeout=timeout)

    return run


@pytest.fixture
def nys_here(tmp_path, monkeypatch, capsys):
    """``run_nys`` in this process, for calls answered before any run starts (bad input,
    ``--cfg``): a subprocess spends ~3 s importing torch before it can refuse anything."""
    from nyscli.cli import _main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")

    def run(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        code = _main(list(args))
        out = capsys.readouterr()
        return subprocess.CompletedProcess(["nys", *args], code, out.out, out.err)

    return run

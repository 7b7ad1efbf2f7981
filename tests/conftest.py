"""Shared fixtures: float64 inputs with structure along the sequence, and CLI helpers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

# Under pytest-xdist, workers share the cores: one worker's torch ops should not take them all.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


@pytest.fixture
def run_nys(tmp_path):
    """Run the real ``nys`` console entry point in a subprocess inside tmp_path."""

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
        return subprocess.run(
            [sys.executable, "-m", "nyscli.cli", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )

    return run

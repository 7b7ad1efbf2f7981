"""The package as users install it: a wheel built from this tree, installed (not editable)
into a fresh virtual environment, runs from an unrelated directory with the configs it carries,
plus a user's own config folder (``--config-dir``)."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pandas as pd

from .conftest import REPO

# A user's own attention preset, kept outside the package.
USER_ATTENTION = "name: nystrom\nnum_landmarks: 8\npinv_iterations: 6\n"


def _run(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    # No PYTHONPATH: the installed wheel, not this checkout, must answer.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(COLUMNS="200", NO_COLOR="1")
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, f"{args}\n{done.stdout}\n{done.stderr}"
    return done


def build_wheel(tmp_path: Path) -> Path:
    """``pip wheel`` of a copy of the tree (the build leaves build/ and egg-info behind)."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "nyscli", source / "nyscli", ignore=skip)
    dist = tmp_path / "dist"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index"]
    _run([*pip_wheel, "--no-build-isolation", "-w", str(dist), str(source)], tmp_path)
    [wheel] = dist.glob("nyscli-*.whl")
    return wheel


def fresh_venv(tmp_path: Path) -> Path:
    """A new virtual environment that sees this interpreter's packages (torch, hydra, pip, ...)
    through a .pth file, so installing the wheel with --no-deps downloads nothing. Only the
    site-packages folders are added: the checkout's editable .pth there is never read."""
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                   tmp_path).stdout.strip()  # fmt: skip
    parents = [*site.getsitepackages(), sysconfig.get_path("purelib")]
    (Path(purelib) / "parent_env.pth").write_text("\n".join(dict.fromkeys(parents)) + "\n")
    return venv


def test_a_wheel_installed_in_a_fresh_venv_runs_from_any_directory(tmp_path):
    wheel = build_wheel(tmp_path)
    venv = fresh_venv(tmp_path)
    python, nys = venv / "bin" / "python", venv / "bin" / "nys"
    _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
         tmp_path)  # fmt: skip
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = _run([str(python), "-c", "import nyscli; print(nyscli.__file__)"], work).stdout
    assert Path(where.strip()).is_relative_to(venv), where

    shown = _run([str(nys), "bench", "--cfg", "job"], work).stdout
    assert "command: bench" in shown and "num_landmarks: 64" in shown
    assert not (work / "outputs").exists()  # --cfg only prints

    user = work / "my_conf"
    (user / "attention").mkdir(parents=True)
    (user / "attention" / "my_nystrom.yaml").write_text(USER_ATTENTION)
    tiny = ["attention_set=none", "attention=my_nystrom", "-n", "64", "--repeats", "1"]
    tiny += ["min_repeats=1", "warmup=0", "threads=1", "device=cpu", "--config-dir", str(user)]
    done = _run([str(nys), "bench", *tiny], work)
    [run_dir] = (work / "outputs" / "bench").iterdir()  # outputs/ of the current directory
    results = pd.read_csv(run_dir / "results.csv")
    assert list(results.attention) == ["nystrom-8"] and list(results.seq_len) == [64]
    assert results.status.tolist() == ["ok"] and results.time_ms.iloc[0] > 0
    assert "nystrom-8" in done.stdout


def test_an_editable_install_is_quiet_and_imports_the_checkout(tmp_path):
    """``scripts/setup`` installs nys editable. With the flat layout undeclared, setuptools
    chose its import-hook strategy and printed a "BuildBackendWarning: Editable installation"
    banner into every setup; with the root declared as the package folder it writes a plain
    .pth file and says nothing, and the checkout (its configs, hydra_plugins) is what runs."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    skip = shutil.ignore_patterns("__pycache__")
    for package in ("nyscli", "hydra_plugins"):
        shutil.copytree(REPO / package, source / package, ignore=skip)
    python = fresh_venv(tmp_path) / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    done = _run([*pip, "--no-build-isolation", "-e", str(source)], tmp_path)
    # pip's own notes about this machine's package indexes are not the build's output.
    said = [line for line in (done.stdout + done.stderr).splitlines()
            if line.strip() and not line.startswith("WARNING: Location")]  # fmt: skip
    assert said == [], "\n".join(said)
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = _run([str(python), "-c", "import nyscli, hydra_plugins.nys_optuna_sweeper as s; "
                  "print(nyscli.__file__); print(s.__file__)"], work).stdout.split()  # fmt: skip
    assert [Path(w).is_relative_to(source) for w in where] == [True, True], where

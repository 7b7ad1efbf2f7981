"""Start-up: ``nys --help`` and tab completion must not import torch, Hydra or the experiments."""

from __future__ import annotations

import os
import subprocess
import sys

HEAVY = {"torch", "hydra", "omegaconf", "nyscli.launch.run", "nyscli.experiments"}


def _run_cli(arguments: str, env: dict[str, str] | None = None) -> tuple[str, set[str]]:
    """Run the Typer app in a fresh interpreter: its output and the modules it loaded."""
    code = (
        "import sys\nfrom nyscli.cli import app\n"
        f"try:\n    app({arguments}, prog_name='nys')\nexcept SystemExit:\n    pass\n"
        "print('MODULES', *sorted(sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    output, _, modules = done.stdout.partition("MODULES")
    return output, set(modules.split())


def _heavy(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] in HEAVY or m in HEAVY}


def test_help_imports_no_heavy_module():
    output, modules = _run_cli("['--help']")
    assert "bench" in output and "lra" in output
    assert _heavy(modules) == set()


def test_completion_answers_without_heavy_modules():
    env = {
        **os.environ,
        "_NYS_COMPLETE": "complete_bash",
        "COMP_WORDS": "nys bench attention=nys",
        "COMP_CWORD": "2",
    }
    output, modules = _run_cli("None", env)
    assert output.split() == [
        "attention=nystrom",
        "attention=nystrom_local",
        "attention=nystrom_local_routed",
    ]
    assert _heavy(modules) == set()

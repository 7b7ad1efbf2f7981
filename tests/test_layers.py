"""The import order docs/design.md draws, checked from the source's AST (no code is run).

A module may import from its own layer or the layers below it, never above: the attention
core sits on the ground floor alone, commands compose the packages below them, and only the
command line and its launcher know every command. Commands do not import each other, except
``report``, which reads every command's results and figures. Inside the launcher each idea
has a floor of its own (the sweepers share one), so they cannot import each other in a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "nyscli"

# Bottom to top; a module belongs to the layer of its longest matching prefix.
LAYERS: list[tuple[str, ...]] = [
    # The ground floor (and the package of configs, which holds no code).
    (
        "nyscli.errors",
        "nyscli.rules",
        "nyscli.files",
        "nyscli.stops",
        "nyscli.console",
        "nyscli.paths",
        "nyscli.overrides",
        "nyscli.allocator",
        "nyscli.gpu_env",
        "nyscli.conf",
    ),
    ("nyscli.attention",),
    ("nyscli.models",),
    ("nyscli.output", "nyscli.tokenizers", "nyscli.tracking"),
    ("nyscli.data",),
    ("nyscli.train",),
    ("nyscli.checkpoints",),
    ("nyscli.experiments.schema", "nyscli.experiments.training", "nyscli.experiments"),
    tuple(
        f"nyscli.experiments.{c}" for c in ("bench", "approx_error", "lra", "pretrain", "finetune")
    ),
    ("nyscli.experiments.report",),
    ("nyscli.ranks",),
    # The launcher, one idea per module, bottom to top (no module imports one above it, so
    # the package has no import circle).
    ("nyscli.launch.progress",),
    ("nyscli.launch.sweepers",),
    ("nyscli.launch.faults",),
    ("nyscli.launch.compose",),
    ("nyscli.launch.plan",),
    ("nyscli.launch.folders",),
    ("nyscli.launch.task",),
    ("nyscli.launch.run", "nyscli.launch"),
    ("nyscli.cli",),
]
COMMANDS = LAYERS[8]


def layer_of(module: str) -> tuple[int, str]:
    """(layer index, the prefix that placed it); the package root itself is the top."""
    best = (-1, "")
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best[1]):
                best = (index, prefix)
    if best[0] < 0:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS (and docs/design.md)")
    return best


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every nyscli import, also inside functions; ``from a import b``
    counts as ``a.b`` (b may be a module)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("nyscli")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nyscli"):
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def violations(package: Path = PACKAGE) -> list[str]:
    problems = []
    for path in sorted(package.rglob("*.py")):
        source = module_name(path, package)
        if source == "nyscli":
            continue
        here, here_prefix = layer_of(source)
        for line, target in imported(ast.parse(path.read_text(encoding="utf-8"))):
            there, there_prefix = layer_of(target)
            where = f"{path.relative_to(package.parent)}:{line} imports {target}"
            if there > here:
                problems.append(f"{where}: {there_prefix} is above {here_prefix}")
            elif there == here and here_prefix in COMMANDS and there_prefix != here_prefix:
                problems.append(f"{where}: commands do not import each other")
    return problems


def test_no_module_imports_from_a_layer_above_it():
    assert violations() == []


def test_every_module_is_in_a_layer():
    for path in PACKAGE.rglob("*.py"):
        if module_name(path) != "nyscli":
            layer_of(module_name(path))


@pytest.mark.parametrize(
    "module, line, problem",
    [
        ("attention/extra.py", "from nyscli.train import Trainer", "above nyscli.attention"),
        ("models/extra.py", "import nyscli.experiments.lra.command", "above nyscli.models"),
        ("experiments/lra/extra.py", "from nyscli.experiments.bench import rounds", "each other"),
        ("data/extra.py", "def f():\n    from nyscli.launch import run", "above nyscli.data"),
        ("launch/faults.py", "from nyscli.launch.plan import Plan", "above nyscli.launch.faults"),
    ],
)
def test_an_upward_import_is_caught(tmp_path, module, line, problem):
    """The check itself: a copy of the package with one upward import added fails it."""
    copy = tmp_path / "nyscli"
    for path in PACKAGE.rglob("*.py"):
        target = copy / path.relative_to(PACKAGE)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    (copy / module).write_text(line + "\n", encoding="utf-8")
    [found] = violations(copy)
    assert module in found and problem in found

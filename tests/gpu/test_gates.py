"""The gates (``nyscli.attention.gpu.gates``): built from the environment, changed only by
``override``, recorded; the defaults backed by committed GPU checks; the op registry."""

from __future__ import annotations

import pytest

from nyscli.attention.gpu import gates
from nyscli.errors import UserInputError


def test_kernels_checked_on_the_h200_are_on_and_the_switch_names_others() -> None:
    on = {"hybrid-16-bit", "hybrid-32-bit", "inference", "graph"}
    assert gates.checked_paths("") == gates.CHECKED_BY_DEFAULT == on
    assert gates.checked_paths("", frozenset()) == frozenset()
    assert gates.checked_paths("hybrid, graph", frozenset()) == {
        "hybrid-16-bit", "hybrid-32-bit", "graph"
    }  # fmt: skip
    with pytest.raises(UserInputError, match="NYS_GPU_CHECKED: 'grpah' is not one of"):
        gates.checked_paths("grpah", frozenset())


def test_gpu_switches_read_known_names_and_whole_numbers() -> None:
    from nyscli import gpu_env

    read = gpu_env.hybrid_launch
    assert read("") == {} and read(" min_tile=64, num_stages=1 ") == {
        "min_tile": 64,
        "num_stages": 1,
    }
    # "²" and "٣" are digits to str.isdigit, not to int(): a traceback at start-up before
    bad_values = ("min_tile=0", "num_stages=two", "stages=1", "num_warps", "min_tile=-4")
    for bad in (*bad_values, "min_tile=²", "num_warps=٣"):
        with pytest.raises(UserInputError, match="NYS_HYBRID_LAUNCH: '.*' is not one of"):
            read(bad)
    assert gpu_env.checked(" graph,hybrid-16-bit,") == {"graph", "hybrid-16-bit"}
    with pytest.raises(UserInputError, match="NYS_GPU_CHECKED: 'hybird' is not one of"):
        gpu_env.checked("graph,hybird")


@pytest.mark.parametrize(
    "variable, value",
    [
        ("NYS_HYBRID_LAUNCH", "min_tile=zero"),
        ("NYS_HYBRID_LAUNCH", "min_tile=²"),
        ("NYS_GPU_CHECKED", "grpah"),
    ],
)
def test_nys_refuses_a_bad_gpu_switch_in_one_line(tmp_path, variable, value) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, variable: value}
    done = subprocess.run(
        [sys.executable, "-m", "nyscli.cli", "bench", "--seq-len", "64"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 2, output
    assert len(output.splitlines()) == 1 and variable in output and value in output, output
    assert not (tmp_path / "outputs").exists()


def test_gates_are_immutable_and_an_override_ends_with_its_block() -> None:
    import dataclasses

    before = gates.current()
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.testing = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        before.hybrid_launch["min_tile"] = 16  # type: ignore[index]
    with pytest.raises(RuntimeError), gates.override(testing=True, checked={"graph"}) as inside:
        assert gates.current() is inside and inside.testing and inside.checked == {"graph"}
        assert isinstance(inside.checked, frozenset)
        raise RuntimeError("the block ends by an error")
    assert gates.current() is before and not before.testing


def test_gates_are_built_from_the_environment() -> None:
    built = gates.from_environ(
        {"NYS_GPU_CHECKED": "hybrid", "NYS_HYBRID_LAUNCH": "num_stages=3", "TRITON_INTERPRET": "1"}
    )
    assert built.checked == gates.CHECKED_BY_DEFAULT  # "hybrid": its two widths, on already
    assert dict(built.hybrid_launch) == {"min_tile": 64, "num_warps": 8, "num_stages": 3}
    assert built.interpreting and not built.testing and built.fused_cpu
    plain = gates.from_environ({})
    assert not plain.interpreting and plain.record() == {
        "checked": ["graph", "hybrid-16-bit", "hybrid-32-bit", "inference"],
        "hybrid_launch": {"min_tile": 64, "num_warps": 8, "num_stages": 1},
        "products": {"16-bit": "tf32", "32-bit": "tf32x3"},
        "triton": plain.triton,
        "interpreting": False,
    }
    with pytest.raises(UserInputError, match="NYS_HYBRID_LAUNCH: 'min_tile=0'"):
        gates.from_environ({"NYS_HYBRID_LAUNCH": "min_tile=0"})


# Each path on by default on CUDA, and the equality.csv rows (path, dtype) that show it equal
# to float64 on a GPU as the torch path is.
EVIDENCE = {
    "inference": [("nystrom-fused", "float32"), ("nystrom-fused", "bfloat16")],
    "graph": [("nystrom-graphed", "float32"), ("nystrom-graphed", "bfloat16")],
    "hybrid-16-bit": [("hybrid-triton", "bfloat16")],
    "hybrid-32-bit": [("hybrid-triton", "float32")],
}


def passes(row: dict, torch_error: float) -> bool:
    """A kernel's output row within float32's error, or within 1.25x its torch path's."""
    error = float(row["relative_error_vs_float64"])
    return error < 2e-5 or error <= 1.25 * torch_error


def test_every_path_on_by_default_has_a_passing_gpu_check_committed() -> None:
    import csv
    from pathlib import Path

    found = sorted((Path(__file__).resolve().parents[2] / "docs/results/gpu").glob("*equality.csv"))
    assert found, "no committed equality CSV under docs/results/gpu/"
    passing = set()
    for path in found:
        with open(path, newline="") as handle:
            rows = [r for r in csv.DictReader(handle) if r["tensor"] == "out"]
        torch_error = {
            (r["path"].split("-")[0], r["dtype"]): float(r["relative_error_vs_float64"])
            for r in rows
            if r["path"].endswith("-torch")
        }
        for r in rows:
            family = r["path"].split("-")[0]
            if (family, r["dtype"]) in torch_error and passes(r, torch_error[family, r["dtype"]]):
                passing.add((r["path"], r["dtype"]))
    assert set(EVIDENCE) == gates.CHECKED_BY_DEFAULT  # a new default path needs its evidence
    for gate, needed in EVIDENCE.items():
        missing = [row for row in needed if row not in passing]
        assert not missing, f"{gate} is on by default but no committed GPU check passed {missing}"
    assert not passes({"relative_error_vs_float64": "nan"}, 1.0)


def test_every_op_is_registered_under_a_known_gate() -> None:
    from nyscli import gpu_env
    from nyscli.attention.gpu import ops

    assert {"landmark weights", "inference", "hybrid"} <= set(ops.OPS)
    for op in ops.OPS.values():
        assert op.gate is None or op.gate in gpu_env.CHECKABLE
    with pytest.raises(ValueError, match="gate 'fast' is not in gpu_env.CHECKABLE"):
        ops.register("toy", "fast", lambda: [])
    assert "toy" not in ops.OPS


def test_a_toy_op_registered_as_docs_say_is_in_compile_checks_list(monkeypatch) -> None:
    # docs/design.md, "Adding a GPU kernel": the kernel file, the op module that builds its
    # launches and registers them, its test. compile_check finds it with no edit of its own.
    import sys
    from pathlib import Path

    import torch

    pytest.importorskip("triton")
    from nyscli.attention.gpu import ops

    monkeypatch.setattr(ops, "OPS", dict(ops.OPS))
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "scripts"))
    import compile_check

    def examples():
        x = ops.meta(4096, dtype=torch.float32)
        args = {"x_ptr": x, "out_ptr": torch.empty_like(x), "n": 4096, "factor": 0.5}
        yield "toy scale", ops.Launch("tests.gpu.toy_kernels:scale", (4,), {**args, "BLOCK": 1024})

    ops.register("toy", None, examples)
    rows = {row[0]: row for row in compile_check.kernels(quick=True)}
    name, kernel, types, constants, options = rows["toy scale"]
    assert kernel is sys.modules["tests.gpu.toy_kernels"].scale
    assert types == {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "factor": "fp32"}
    assert constants == {"BLOCK": 1024} and options == {"num_warps": 4}
    assert "landmark forward" in rows and "landmark backward" not in rows  # --quick


def test_no_test_or_script_assigns_a_gate_switch() -> None:
    # Gates change only through gates.override: the old module switches are gone, and nothing
    # under scripts/ or tests/ assigns or patches one.
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    switches = {
        "TESTING", "HAS_TRITON", "CHECKED_ON_GPU", "HYBRID_LAUNCH", "GRAPHS_ON_CPU",
        "PRODUCTS", "WARPS", "fused_cpu_backward",
    }  # fmt: skip
    found = []
    files = [*root.glob("scripts/*.py"), *root.glob("tests/**/*.py"), *root.glob("nyscli/**/*.py")]
    for path in files:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.attr for t in targets if isinstance(t, ast.Attribute)]
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") in (
                "setattr", "setitem"
            ):  # fmt: skip
                names += [a.value for a in node.args[1:2] if isinstance(a, ast.Constant)]
                names += [a.attr for a in node.args[:1] if isinstance(a, ast.Attribute)]
            found += [f"{path.relative_to(root)}:{node.lineno}" for n in names if n in switches]
    assert found == []
    from nyscli.attention import nystrom
    from nyscli.attention.gpu import graphs, hybrid, inference, landmark

    for module in (nystrom.NystromAttention, graphs, hybrid, inference, landmark):
        assert not switches & set(vars(module)), module

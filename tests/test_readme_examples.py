"""Every ``nys`` example of the README runs, at toy size, on a fresh clone (CI runs this).

The examples are read from README.md itself (its bash blocks and every inline command with
arguments), so an example added there without a way to run it here fails
:func:`test_every_readme_example_is_covered`. Toy size = the example's own arguments plus the
overrides of :data:`TOY` for its command (a tiny model, a few steps, short sequences) and the
placeholders filled with small data in the real formats. Two examples cannot run on a CI
machine and are checked as far as it can: ``cluster=slurm`` composes every job of its sweep
(``--cfg job``), ``--nproc-per-node N`` runs with N = 2 CPU ranks.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.helpers import LRA_TINY, pretrain_tiny, write_corpus, write_fashion_mnist

README = Path(__file__).resolve().parents[1] / "README.md"
# Wrappers around an example that are not part of it (setup, a venv path, a directory).
WRAPPERS = re.compile(r"^(?:scripts/setup(?: --dev)? && )?(?:cd \S+ && )?(?:\.venv/bin/)?")
SYNOPSES = {"nys <command> --help", "nys report PATH..."}  # forms, not commands


def readme_examples() -> list[str]:
    """The ``nys`` commands of the README with arguments (a bare ``nys bench`` is a name)."""
    text = README.read_text(encoding="utf-8")
    found = [m.group(1) for m in re.finditer(r"`([^`\n]*\bnys [^`\n]*)`", text)]
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        found += [line.split("#")[0].strip() for line in block.splitlines()]
    examples = []
    for line in found:
        command = WRAPPERS.sub("", line.strip())
        runnable = command.startswith("nys ") and len(command.split()) > 2
        if (runnable or command == "nys --help") and command not in {*SYNOPSES, *examples}:
            examples.append(command)
    return examples


LRA = [a for a in LRA_TINY if not a.startswith(("--steps", "4", "--batch-size", "8"))]
LRA_IMAGE = ["model.dim=16", "model.ffn_dim=16", "attention.num_landmarks=4", "threads=1"]
TOY: dict[str, list[str]] = {
    # Rows: the baseline and one Nyström (not Table 1's 6): each row x length is a worker
    # process, and the main job's three lengths made this the suite's slowest test.
    "bench": ["attention_set=none", "attention_rows=[{name:softmax_naive},{name:nystrom}]",
              "hidden=32", "num_heads=2", "repeats=1",
              "min_repeats=1", "warmup=0", "time_budget_s=1", "threads=1"],
    "approx-error": ["seq_len=256", "heads=1", "head_dim=16", "threads=1"],
    "lra": [*LRA, "--steps", "2", "--batch-size", "4"],
    "pretrain": ["--steps", "2", "--batch-size", "4"],
    "finetune": ["--steps", "2", "--batch-size", "4", "task.max_len=32", "threads=1"],
    "report": [],
}  # fmt: skip


def toy_command(example: str, data: dict[str, Path]) -> list[str]:
    """``example`` as arguments of ``python -m nyscli.cli``, at toy size."""
    words = shlex.split(
        example.replace("<glue>", str(data["glue"]))
        .replace("outputs/lra/multirun/<sweep>", str(data["sweep"]))
        .replace("--nproc-per-node N", "--nproc-per-node 2")
    )[1:]
    command = words[0] if words[0] in TOY else None
    if command is None:
        return words  # nys --help
    toy = list(TOY[command])
    if command == "bench" and "--seq-len" not in words:
        toy += ["--seq-len", "64"]
    if command == "lra" and "task=image" in words:
        toy = [*LRA_IMAGE, "--steps", "2", "--batch-size", "4"]
    if "attention=softmax" in words:  # a single softmax run has no landmarks to shrink
        toy = [a for a in toy if not a.startswith("attention.num_landmarks")]
    if command == "pretrain":
        toy += pretrain_tiny(data["corpus"], data["cache"])
    if "cluster=slurm" in words:  # no SLURM here: every job of the sweep composes
        return [*words, "--cfg", "job"]
    return [*words, *toy]


@pytest.fixture
def toy_data(tmp_path: Path, run_nys, monkeypatch) -> dict[str, Path]:
    glue = tmp_path / "glue" / "SST-2"
    glue.mkdir(parents=True)
    words = ["good", "bad", "fine", "film", "plot", "great", "dull", "story"]
    for split, n in (("train", 24), ("dev", 8)):
        rows = ["sentence\tlabel"]
        rows += [f"{words[i % 8]} {words[(3 * i) % 8]} film\t{i % 2}" for i in range(n)]
        (glue / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    write_fashion_mnist(tmp_path / "fashion", 40, 20)
    monkeypatch.setenv("NYSCLI_FASHION_MNIST", str(tmp_path / "fashion"))
    write_corpus(tmp_path / "corpus")
    return {"glue": tmp_path / "glue", "corpus": tmp_path / "corpus", "cache": tmp_path / "c",
            "sweep": tmp_path / "sweep"}  # fmt: skip


def test_every_readme_example_is_covered():
    examples = readme_examples()
    assert "nys bench --seq-len 512 --seq-len 1024 --seq-len 2048" in examples  # the main job
    assert len(examples) >= 10
    for example in examples:
        command = example.split()[1]
        assert command in TOY or command == "--help", f"no toy size for: {example}"


@pytest.mark.parametrize("example", readme_examples())
def test_readme_example_runs_at_toy_size(example, toy_data, run_nys, tmp_path):
    if "<sweep>" in example:  # a sweep of the README's kind to report on
        sweep = [f"hydra.sweep.dir={toy_data['sweep']}", f"data_cache={tmp_path / 'c'}"]
        made = run_nys("lra", "-m", "attention=softmax,nystrom", *TOY["lra"], *sweep)
        assert made.returncode == 0, made.stdout + made.stderr
    args = toy_command(example, toy_data)
    if args[0] == "lra" and "task=image" not in args:
        args.append(f"data_cache={tmp_path / 'c'}")
    done = run_nys(*args, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{example} -> {args}\n{output}"
    assert "Traceback" not in output
    if "--help" in args or "--cfg" in args:
        return
    results = list((tmp_path / "outputs").rglob("results.csv"))
    if args[0] == "report":
        assert "runs" in output.lower()
    else:
        assert results, f"{example}: no results.csv under outputs/"

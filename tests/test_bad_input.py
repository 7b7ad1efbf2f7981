"""Bad input and faults: one line naming the value or file, exit code 2, no traceback, and no
run folder left behind (or, once a run has produced something, one marked failed).

Validation happens before any torch work, so most cases run in this process through the
launcher's ``launch()``; a few go through the real ``python -m nyscli.cli`` entry point.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import os
from pathlib import Path

import pytest

from nyscli.errors import UserInputError
from nyscli.experiments import experiment_module
from nyscli.launch.run import launch
from nyscli.output.runs import ERROR_FILE, find_run_folders, load_run

# (command, overrides, fragment the one line must contain)
BAD_VALUES = [
    ("bench", ["timeout_s=-1"], "timeout_s=-1"),
    ("bench", ["memory_limit_mb=-5"], "memory_limit_mb=-5"),
    ("bench", ["warmup=-1"], "warmup=-1"),
    ("bench", ["threads=0"], "threads=0"),
    ("bench", ["baseline=nope"], "baseline=nope"),
    ("bench", ["attention_set=none"], "attention_set=none"),
    ("bench", ["seq_lens=[0]"], "seq_lens=[0]"),
    ("bench", ["seq_lens=[]"], "seq_lens=[]"),
    ("bench", ["seed=abc"], "seed=abc"),
    ("bench", ["dtype=fp8"], "dtype=fp8"),
    ("bench", ["batch_size=1.5"], "batch_size=1.5"),
    ("bench", ["attention=softmax", "attention.causal=maybe"], "attention.causal=maybe"),
    ("bench", ["repeats=2", "min_repeats=5"], "min_repeats=5"),
    ("bench", ["time_budget_s=0"], "time_budget_s=0"),
    ("approx_error", ["seq_len=0"], "seq_len=0"),
    ("approx_error", ["scale=-1"], "scale=-1"),
    ("approx_error", ["budgets=[0]"], "budgets=[0]"),
    ("approx_error", ["threads=0"], "threads=0"),
    ("approx_error", ["seed=1.5"], "seed=1.5"),
    ("approx_error", ["plots=maybe"], "plots=maybe"),
    ("approx_error", ["source=nope"], "source=nope"),
    ("approx_error", ["attention.pinv_iterations=0"], "attention.pinv_iterations=0"),
    ("lra", ["seed=abc"], "seed=abc"),
    ("lra", ["model.dim=-64"], "model.dim=-64"),
    ("lra", ["model.dropout=1.5"], "model.dropout=1.5"),
    ("lra", ["trainer.lr=abc"], "trainer.lr=abc"),
    ("lra", ["threads=0"], "threads=0"),
    ("lra", ["trainer.warmup_steps=-1"], "trainer.warmup_steps=-1"),
    ("lra", ["trainer.beta2=1"], "trainer.beta2=1"),
    ("lra", ["attention=softmax", "attention.causal=maybe"], "attention.causal=maybe"),
    ("lra", ["data.generate.n_train=0"], "data.generate.n_train=0"),
    ("lra", ["trainer.eval_examples=0"], "trainer.eval_examples=0"),
    ("lra", ["task=text", "data.val_fraction=1.5"], "data.val_fraction=1.5"),
    ("lra", ["task=pathfinder", "data.difficulty=extreme"], "data.difficulty=extreme"),
    ("lra", ["task=nope"], "task/nope"),
    ("lra", ["trainer.progress=maybe"], "trainer.progress=maybe"),
    ("pretrain", ["tokenizer.vocab_size=0"], "tokenizer.vocab_size=0"),
    ("pretrain", ["mlm_probability=1.5"], "mlm_probability=1.5"),
    ("pretrain", ["data.val_fraction=0"], "data.val_fraction=0"),
    ("pretrain", ["model.num_heads=0"], "model.num_heads=0"),
    ("pretrain", ["trainer.clip_grad_norm=-1"], "trainer.clip_grad_norm=-1"),
    ("pretrain", ["tokenizer.min_frequency=0"], "tokenizer.min_frequency=0"),
    ("finetune", ["epochs=0"], "epochs=0"),
    ("finetune", ["warmup_ratio=1.5"], "warmup_ratio=1.5"),
    ("finetune", ["finetune_task=sst2", "task.max_len=2"], "task.max_len=2"),
    ("finetune", ["seed=-3"], "seed=-3"),
    ("finetune", ["task.test_examples=0"], "task.test_examples is not a key of nys finetune"),
    ("finetune", ["trainer.max_steps=0"], "trainer.max_steps=0"),
    ("finetune", ["trainer.lr=-1"], "trainer.lr=-1"),
    # Upper bounds: 64-bit integers, finite numbers, threads a few per core.
    ("finetune", ["seed=99999999999999999999999"], "seed=99999999999999999999999 is not allowed"),
    ("bench", ["threads=99999999999999999999"], "threads=99999999999999999999"),
    ("lra", ["threads=100000"], "threads=100000 is not allowed; it must be an integer from 1 to"),
    ("finetune", ["epochs=inf"], "epochs=inf is not allowed; it must be a finite number"),
    ("lra", ["trainer.lr=inf"], "trainer.lr=inf"),
    ("lra", ["trainer.lr=1e400"], "trainer.lr=inf"),
    ("lra", ["trainer.weight_decay=inf"], "trainer.weight_decay=inf"),
    ("bench", ["timeout_s=inf"], "timeout_s=inf"),
    ("approx_error", ["scale=-inf"], "scale=-inf"),
    ("approx_error", ["budgets=[64,99999999999999999999]"], "budgets=[64,99999999999999999999]"),
    # Sizes that become tensor dimensions are bounded by what any machine can allocate.
    ("lra", ["task.max_len=9223372036854775807"], "it must be an integer from 1 to 1048576"),
    ("lra", ["model.dim=100000"], "model.dim=100000"),
    ("lra", ["trainer.batch_size=9223372036854775807"], "from 1 to 65536"),
    ("finetune", ["task.max_len=2000000"], "task.max_len=2000000"),
    ("pretrain", ["tokenizer.vocab_size=99999999999"], "tokenizer.vocab_size=99999999999"),
    ("bench", ["hidden=9999999"], "hidden=9999999"),
]


def one_error(capsys) -> str:
    """The single output line of a refused command (it must be exactly one)."""
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0] and lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.parametrize(("command", "overrides", "fragment"), BAD_VALUES)
def test_bad_value_is_one_line_exit_2_and_no_folder(
    command, overrides, fragment, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    assert launch(command, overrides) == 2
    assert fragment in one_error(capsys)
    assert not (tmp_path / "outputs").exists()


def test_bad_value_in_one_sweep_job_refuses_the_whole_sweep(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert launch("lra", ["--multirun", "model.dropout=0.1,1.5"]) == 2
    assert "model.dropout=1.5" in one_error(capsys)
    assert not (tmp_path / "outputs").exists()


def test_a_bad_value_in_the_last_job_of_a_big_sweep_stops_it_before_the_first(
    tmp_path, monkeypatch, capsys
):
    """Every job is checked (behind a progress bar from 20 jobs) before any runs."""
    monkeypatch.chdir(tmp_path)
    assert (
        launch("approx_error", ["--multirun", "heads=1,99999999999999999999", "seed=range(0,12)"])
        == 2
    )
    assert "heads=99999999999999999999 is not allowed" in one_error(capsys)
    assert not (tmp_path / "outputs").exists()


# -------------------------------------------------------------- the real entry point


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["lra", "--steps", "abc"], "'--steps'"),
        (["bench", "--no-such-option"], "--no-such-option"),
        (["no-such-command"], "no-such-command"),
        (["bench", "--seq-len", "64", "seq_lens=[128]"], "seq_lens"),
        (["finetune", "--task", "sst2", "task=mrpc"], "task=mrpc"),
        (["lra", "model.dropout=1.5"], "model.dropout=1.5"),
    ],
)
def test_parse_errors_and_conflicts_are_one_line_in_a_subprocess(run_nys, tmp_path, args, fragment):
    done = run_nys(*args)
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 2, output
    assert len(output.splitlines()) == 1, output
    assert fragment in output and "Traceback" not in output and "╭" not in output
    assert not (tmp_path / "outputs").exists()


def test_report_out_a_directory_is_an_error(nys_here, tmp_path):
    (tmp_path / "runs").mkdir()
    done = nys_here("report", "runs", "--out", str(tmp_path))
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 2 and len(output.splitlines()) == 1
    assert f"--out={tmp_path}" in output


def test_report_out_where_nothing_can_be_written_is_one_line_before_any_table(nys_here, tmp_path):
    """sysfs takes no new file, not even from root: the line names the file asked for, and
    the tables (which used to print first) do not print."""
    fake_run(tmp_path / "runs" / "a")
    done = nys_here("report", "runs", "--out", "/sys/x.csv")
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 2 and len(output.splitlines()) == 1, output
    assert output.startswith("error: /sys/x.csv: ")


# ------------------------------------------------------------------- overwrite refusal


def fake_run(folder: Path) -> dict[str, str]:
    """A finished-looking run folder; returns {relative path: sha256} of its files."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text("command: bench\n")
    (folder / "results.csv").write_text("attention,time_ms\nnystrom-64,1.5\n")
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "last.pt").write_bytes(b"\x00weights" * 100)
    return digest(folder)


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_existing_run_given_as_run_dir_is_refused_and_left_byte_identical(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "old_run"
    before = fake_run(run)
    assert launch("bench", [f"hydra.run.dir={run}", "seq_lens=[8]"]) == 2
    assert f"hydra.run.dir={run} already holds a run" in one_error(capsys)
    assert digest(run) == before


def test_existing_sweep_given_as_sweep_dir_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    before = fake_run(tmp_path / "sweep" / "0")
    code = launch("bench", ["--multirun", f"hydra.sweep.dir={tmp_path / 'sweep'}", "seed=1,2"])
    assert code == 2
    assert "hydra.sweep.dir=" in one_error(capsys)
    assert digest(tmp_path / "sweep" / "0") == before
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == ["0"]


def test_existing_run_is_refused_by_the_real_command(run_nys, tmp_path):
    before = fake_run(tmp_path / "done")
    done = run_nys("bench", "hydra.run.dir=done", "seq_lens=[8]")
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 2 and len(output.splitlines()) == 1, output
    assert "already holds a run" in output
    assert digest(tmp_path / "done") == before


# --------------------------------------------------------------------- faults at run time


def imdb_csv_gz(path: Path, rows: int = 40) -> bytes:
    lines = ["review,sentiment"] + [
        f"review {i} was {'good' if i % 2 else 'bad'},{'positive' if i % 2 else 'negative'}"
        for i in range(rows)
    ]
    data = gzip.compress(("\n".join(lines) + "\n").encode())
    path.write_bytes(data)
    return data


@pytest.mark.parametrize("damage", ["truncated", "not_gzip", "empty"])
def test_corrupt_csv_gz_is_one_line_naming_the_file(damage, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "imdb.csv.gz"
    data = imdb_csv_gz(bad)
    damaged = {"truncated": data[: len(data) // 2], "not_gzip": b"<html>", "empty": b""}
    bad.write_bytes(damaged[damage])
    code = launch("lra", ["task=text", f"data.path={bad}", "threads=1", "trainer.max_steps=1"])
    assert code == 2
    line = one_error(capsys)
    assert str(bad) in line and "data.path" in line
    assert not (tmp_path / "outputs").exists()


def test_binary_text_file_is_refused_before_a_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    binary = tmp_path / "notes.txt"
    binary.write_bytes(bytes(range(256)) * 8)
    assert launch("approx_error", ["source=minilm", f"data.path={binary}"]) == 2
    assert f"data.path={binary} is a binary file" in one_error(capsys)
    assert not (tmp_path / "outputs").exists()
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_bytes(bytes(range(256)) * 8)
    code = launch("pretrain", ["data=folder", f"data.path={corpus}", "threads=1"])
    assert code == 2
    assert f"{corpus / 'a.txt'} is a binary file" in one_error(capsys)
    assert not (tmp_path / "outputs").exists()


def empty_sst2(root: Path) -> Path:
    """An SST-2 folder whose train and dev files hold a header and no example."""
    glue = root / "SST-2"
    glue.mkdir()
    for split in ("train", "dev"):
        (glue / f"{split}.tsv").write_text("sentence\tlabel\n")
    return glue


def test_empty_training_set_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    glue = empty_sst2(tmp_path)
    assert launch("finetune", [f"data.path={glue}", "threads=1", "trainer.max_steps=1"]) == 2
    line = one_error(capsys)
    assert str(glue) in line and "no labelled examples" in line and "train" in line
    assert not (tmp_path / "outputs").exists()


def test_run_time_fault_removes_only_the_folders_it_created(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    glue = empty_sst2(tmp_path)
    bad = [f"data.path={glue}", "threads=1", "trainer.max_steps=1"]
    assert launch("finetune", [*bad, "hydra.run.dir=deep/er/run"]) == 2
    assert "no labelled examples" in one_error(capsys)
    assert not (tmp_path / "deep").exists()
    kept = tmp_path / "outputs" / "finetune" / "an_earlier_run"
    kept.mkdir(parents=True)
    assert launch("finetune", bad) == 2
    assert "no labelled examples" in one_error(capsys)
    assert [p.name for p in kept.parent.iterdir()] == ["an_earlier_run"]


@pytest.mark.parametrize("key", ["hydra.run.dir", "data_cache"])
def test_unwritable_path_is_one_line_naming_it(key, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    target = blocker / "below"
    code = launch("lra", [f"{key}={target}", "threads=1", "trainer.max_steps=1"])
    assert code == 2
    line = one_error(capsys)
    said = "is a file, not a folder" if key == "hydra.run.dir" else "Not a directory"
    assert str(blocker) in line and said in line
    assert not (tmp_path / "outputs").exists()


TINY_LRA = [
    "data.generate.n_train=8",
    "data.generate.n_val=4",
    "data.generate.n_test=4",
    "data.generate.min_len=5",
    "data.generate.max_len=40",
    "data.generate.max_depth=3",
    "task.max_len=48",
    "model.dim=16",
    "model.ffn_dim=16",
    "model.depth=1",
    "trainer.batch_size=4",
    "trainer.max_steps=3",
    "trainer.eval_every=1",
    "trainer.progress=false",
    "attention=softmax",
    "threads=1",
]


def test_full_disk_during_checkpoint_save_keeps_the_previous_one(tmp_path, monkeypatch, capsys):
    """The second save hits ENOSPC half-way: one line naming last.pt, no temp file, the first
    checkpoint intact, and the run folder marked failed (report does not count it)."""
    import torch

    from nyscli.train import checkpoint

    monkeypatch.chdir(tmp_path)
    saves = {"n": 0}
    real_save = torch.save

    class FullDisk:
        """The temp file's handle on a disk that fills after 64 bytes: torch's zip writer then
        raises RuntimeError("unexpected pos"), the OSError only its __context__, as for real."""

        def __init__(self, handle):
            self.handle, self.left = handle, 64

        def write(self, data):
            if len(data) > self.left:
                self.handle.write(bytes(data[: self.left]))
                raise OSError(errno.ENOSPC, "No space left on device")
            self.left -= len(data)
            return self.handle.write(data)

        def flush(self):
            self.handle.flush()

    def full_disk(obj, handle, *args, **kwargs):
        target = os.readlink(f"/proc/self/fd/{handle.fileno()}")  # the temp file's path
        saves["n"] += ".last.pt." in target
        if saves["n"] >= 2:
            handle = FullDisk(handle)
        return real_save(obj, handle, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    code = launch("lra", [*TINY_LRA, f"data_cache={tmp_path / 'cache'}"])
    assert code == 2
    out = capsys.readouterr().out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in out
    assert (
        "last.pt: No space left on device (" in errors[0]
        and "free there; it needs at least" in errors[0]
    )
    (run,) = find_run_folders([tmp_path / "outputs"])
    assert not list(run.rglob("*.tmp"))
    state = checkpoint.load_checkpoint(run / "checkpoints" / "last.pt")
    assert state["step"] == 1
    assert (run / ERROR_FILE).exists() and not load_run(run).ok


def test_full_disk_when_hydra_writes_the_runs_config_is_one_line_and_no_folder(
    tmp_path, monkeypatch, capsys
):
    """Hydra's own write of .hydra/config.yaml (before the job starts) on a full disk: it
    printed Hydra's two-line exception and exited 1; now one line naming the folder, exit 2."""
    from hydra.core import utils as hydra_utils

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")  # a write names no file

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(hydra_utils, "_save_config", full)
    assert launch("lra", [*TINY_LRA, "hydra.run.dir=run"]) == 2
    line = one_error(capsys)
    assert line.startswith("error: run/.hydra: No space left on device (") and "free there" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("error", [RuntimeError("boom in the job"), UserInputError("bad data")])
@pytest.mark.parametrize("given_dir", [True, False])
def test_a_sweep_with_failed_jobs_exits_1_with_one_line_and_no_traceback(
    error, given_dir, tmp_path, monkeypatch, capsys
):
    """Every job fails (a bug, or a user error found only at run time): the sweep exits 1 and
    ends with one line naming the failed jobs; the traceback is in each job's error.txt, not on
    the console. A sweep given hydra.sweep.dir used to exit 0."""
    monkeypatch.chdir(tmp_path)

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(experiment_module("bench"), "run", fail)
    where = [f"hydra.sweep.dir={tmp_path / 'sweep'}"] if given_dir else []
    tiny = ["seq_lens=[64]", "attention_set=none", "hidden=32", "num_heads=2"]
    assert launch("bench", ["-m", *tiny, "attention.num_landmarks=8,16", *where]) == 1
    [sweep] = {job.parent for job in find_run_folders([tmp_path])}
    out = capsys.readouterr()
    console = out.out + out.err
    assert "Traceback" not in console
    shown = sweep if given_dir else sweep.relative_to(tmp_path)  # as the user named it
    assert console.strip().splitlines()[-1] == f"2 job(s) failed; see {shown / '0'}, {shown / '1'}"
    for job in ("0", "1"):
        written = (sweep / job / ERROR_FILE).read_text()
        assert written.startswith(str(error))
        assert ("Traceback" in written) == isinstance(error, RuntimeError)


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["data.path=my", "file.txt"], "for your shell: \"data.path=my file.txt\""),
        (["data.path=a(b).txt"], "inside the shell's quotes: \"data.path='a(b).txt'\""),
        (["seq_len=16", "data.path=x=y"], "\"data.path='x=y'\""),
        # Letters outside ASCII: Hydra's raw "LexerNoViableAltException: ... ^" (issue 61.4)
        (["hydra.run.dir=outputs/ünïrun"], "no character outside ASCII (ü, ï) in an unquoted "
         "value; quote the value inside the shell's quotes: \"hydra.run.dir='outputs/ünïrun'\""),
        (["data.path=résumé.txt"], "\"data.path='résumé.txt'\""),
        (["ü=3"], "a key is written in ASCII letters, digits, _ and . (not ü)"),
    ],
)  # fmt: skip
def test_a_path_hydra_cannot_parse_says_how_to_quote_it(
    overrides, said, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    assert launch("approx_error", overrides) == 2
    assert said in one_error(capsys)
    assert not (tmp_path / "outputs").exists()


def test_the_quoting_the_hint_gives_is_read_as_the_path(nys_here):
    done = nys_here("approx-error", "data.path='a(b) c=d.txt'", "--cfg", "job")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "path: a(b) c=d.txt" in done.stdout
    done = nys_here("approx-error", "hydra.run.dir='outputs/ünïrun'", "--cfg", "hydra")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "dir: outputs/ünïrun" in done.stdout


@pytest.mark.parametrize(
    ("sweep", "said"),
    [
        ("seed=range(5,0)", "seed=range(5,0) is not allowed: it holds no value (it counts up "
         "from 5 while below 0), so nothing would run; give range(0, 5)"),
        ("seed=range(0,5,step=-1)", "give range(0, 5, step=1)"),
        ("seed=range(0,10,step=0)", "its step is 0"),  # was a ValueError traceback
    ],
)  # fmt: skip
def test_an_empty_sweep_is_one_line_and_no_folder(sweep, said, nys_here, tmp_path):
    """``-m seed=range(5,0)`` used to exit 0 after "Launching 0 jobs", leaving a sweep folder
    (issue 61.4); ``--cfg job`` says the same."""
    for extra in ((), ("--cfg", "job")):
        done = nys_here("approx-error", "-m", sweep, *extra)
        line = (done.stdout + done.stderr).strip()
        assert done.returncode == 2 and len(line.splitlines()) == 1, line
        assert line.startswith(f"error: {sweep} is not allowed: ") and said in line, line
        assert not (tmp_path / "outputs").exists()


def test_a_report_over_no_runs_is_one_line_and_exit_2(nys_here, tmp_path):
    (tmp_path / "empty").mkdir()
    done = nys_here("report", "empty")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.startswith("error: no run folders") and done.stdout.count("\n") == 1
    assert not (tmp_path / "empty" / "summary.csv").exists()


def test_a_huge_text_file_is_read_only_as_far_as_the_run_needs(tmp_path, monkeypatch):
    """approx-error source=minilm/checkpoint reads at most 64 bytes per token it uses
    (max_sequences x seq_len): a 64 MB file costs what a short one does; the prefix ends at
    whitespace, never inside a word or a UTF-8 character."""
    from omegaconf import OmegaConf

    from nyscli.data.common import read_text_file
    from nyscli.experiments.approx_error import command as approx_error

    words = "naïve café résumé 東京 attention landmarks " * 1000  # multi-byte characters
    big = tmp_path / "big.txt"
    with open(big, "w", encoding="utf-8") as handle:
        for _ in range(1500):
            handle.write(words + "\n")
    assert big.stat().st_size > 60 * 2**20
    cfg = OmegaConf.create({"seq_len": 48, "max_sequences": 2, "source": "minilm"})
    limit = approx_error.text_bytes(cfg)
    assert limit == 64 * 48 * 2
    text = read_text_file(big, "data.path", limit_bytes=limit)
    assert 0 < len(text.encode()) <= limit and "\ufffd" not in text
    assert text.split() == words.split()[: len(text.split())]  # whole words, in order
    read_sizes = []
    real_open = open

    class Recorded:
        """The file handle, counting what is read from it."""

        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def read(self, *size):
            data = self.handle.read(*size)
            read_sizes.append(len(data))
            return data

    def recording_open(path, mode="r", *args, **kwargs):
        handle = real_open(path, mode, *args, **kwargs)
        return Recorded(handle) if str(path) == str(big) else handle

    monkeypatch.setattr("builtins.open", recording_open)
    read_text_file(big, "data.path", limit_bytes=limit)
    assert read_sizes and sum(read_sizes) <= limit + 1  # read no further than the limit


@pytest.mark.parametrize(
    ("overrides", "needs"),
    [
        (["seq_len=2000000", "heads=1"], "370 GB for seq_len=2000000"),  # the smooth source
        (["source=gaussian", "seq_len=1024", "budgets=[100000000000]"],
         "budgets up to 100000000000"),
        (["source=gaussian", "seq_len=262144", "max_matrix_mb=1000000"], "for seq_len=262144"),
    ],
)  # fmt: skip
def test_approx_error_sizes_beyond_the_machine_are_one_line_before_any_allocation(
    overrides, needs, tmp_path, monkeypatch, capsys
):
    """The estimate against the machine's memory (here pinned to 16 GB available), in the
    check before any folder or tensor: no traceback from a 400 GB allocation."""
    from nyscli.experiments.approx_error import memory

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(memory, "available_bytes", lambda: 16 * 2**30)
    assert launch("approx_error", overrides) == 2
    line = one_error(capsys)
    assert needs in line and "more than the 14.4 GB this machine can give it" in line
    assert not (tmp_path / "outputs").exists()


def test_the_memory_estimate_is_above_the_measured_peak_and_not_far_above():
    """n = 2048, 2 heads, smooth, the default methods, fp64: 1.12 GB peak RSS measured on a
    2-core CPU (``/usr/bin/time -f %M nys approx-error seq_len=2048 heads=2``); n = 128,
    ``budget_unit=pairs -b 100000`` (Performer's 100,000 features): 1.09 GB."""
    from nyscli.experiments.approx_error import memory

    estimate = memory.estimated_bytes("smooth", 2048, 2, 64, 2, 64.0, 64, 8, True, True)
    assert 1.12 * 2**30 < estimate < 1.5 * 1.12 * 2**30
    estimate = memory.estimated_bytes("smooth", 128, 4, 64, 2, 64.0, 100000, 8, True, True)
    assert 1.09 * 2**30 < estimate < 1.5 * 1.09 * 2**30


def test_a_budget_past_n_costs_what_exact_attention_costs(tmp_path, monkeypatch):
    """``approx-error budget_unit=pairs -b 100000`` at n = 128 was refused as needing 299 GB
    (m x m blocks of m = 100,000), while every method but Linformer and Performer is exact
    attention at m >= n (issue 61.4): the check passes, and without those two any budget
    costs what m = n costs."""
    from nyscli.experiments.approx_error import memory
    from nyscli.launch.plan import plan_launch

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(memory, "available_bytes", lambda: 16 * 2**30)
    plan_launch("approx_error", ["budget_unit=pairs", "budgets=100000", "seq_len=128"], False)
    exact = ["nystrom", "longformer", "nystrom_local"]

    def estimate(m: int) -> int:
        return memory.estimated_bytes("smooth", 128, 4, 64, 2, 64.0, m, 8, True, True, exact)

    assert estimate(1000) == estimate(100000) == estimate(10**11) == estimate(128)
    huge = ["budget_unit=pairs", "budgets=100000000000", "seq_len=128"]
    plan_launch("approx_error", [*huge, f"methods=[{','.join(exact)}]"], False)
    with pytest.raises(UserInputError, match="budgets up to 100000000000"):
        plan_launch("approx_error", huge, False)  # Performer's 10^11 features: refused
    assert not (tmp_path / "outputs").exists()


def test_a_file_that_cannot_be_created_is_named_not_its_temp_file():
    """atomic writes create a temp file beside the target: when that fails (a folder such as
    /proc takes no files) the error names the file asked for, not .x.csv.1a2b.tmp."""
    from nyscli.files import write_text

    with pytest.raises(OSError) as raised:
        write_text("x", Path("/proc/x.csv"))
    assert raised.value.filename == "/proc/x.csv"


@pytest.mark.parametrize("digits", [4300, 5000])
def test_a_number_thousands_of_digits_long_is_one_short_line(digits, nys_here, tmp_path):
    # 5,000 digits: more than Python reads (Hydra's parser raised a ValueError, a traceback);
    # 4,300: read, refused by the rule, and the line used to print all 4,300 of them.
    done = nys_here("bench", "-n", "64", f"seed={'9' * digits}")
    said = (done.stdout + done.stderr).strip()
    assert done.returncode == 2 and len(said.splitlines()) == 1 and len(said) < 200, said
    assert said.startswith("error: seed=999") and str(digits) in said.replace(",", "")
    assert not (tmp_path / "outputs").exists()

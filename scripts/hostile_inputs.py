"""Try ``nys`` as a hostile user would and write what happened as a table.

Every case runs the real console entry point (``python -m nyscli.cli``) in a fresh folder,
with its own setup (files, folders, links) and, for the signal cases, a signal sent once the
run is under way. A case passes when the exit code is the expected one, nothing prints a
Python traceback, a refusal ends in one ``error:`` line, and a refused run leaves no run
folder (a run that had produced something keeps it, marked failed).

    .venv/bin/python scripts/hostile_inputs.py --out docs/results/hostile-inputs.md

Needs about 7 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

TINY_LRA = [
    "task=listops",
    "data.generate.n_train=48",
    "data.generate.n_val=16",
    "data.generate.n_test=16",
    "data.generate.min_len=10",
    "data.generate.max_len=40",
    "task.max_len=40",
    "model.dim=16",
    "model.ffn_dim=16",
    "attention.num_landmarks=4",
    "threads=1",
    "trainer.batch_size=8",
    "trainer.eval_every=2",
]
TINY_AE = ["seq_len=32", "budgets=8", "heads=1", "threads=1", "plots=false"]


@dataclass
class Case:
    name: str
    args: list[str]
    code: int = 2
    setup: Callable[[Path], None] = lambda folder: None
    stop: tuple[int, float] | None = None  # (signal, seconds after start)
    keeps: bool = False  # a run folder is expected to stay (it produced something)
    says: str = ""  # the output must contain this
    lines: int | None = None  # the output must be this many lines (a refusal alone: 1)
    env: dict[str, str] = field(default_factory=dict)  # set for nys; "{folder}": the case's
    result: dict = field(default_factory=dict)


def _preloadable(name: str) -> Callable[[Path], None]:
    """A library called ``name`` that is safe to preload: a link to this process's own libc."""

    def setup(folder: Path) -> None:
        maps = Path("/proc/self/maps").read_text().split()
        libc = next(p for p in maps if Path(p).name.startswith("libc.so") or "/libc-" in p)
        (folder / name).symlink_to(libc)

    return setup


def _write(name: str, data: bytes | str) -> Callable[[Path], None]:
    def setup(folder: Path) -> None:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())

    return setup


def _link(name: str, target: str) -> Callable[[Path], None]:
    return lambda folder: (folder / name).symlink_to(target)


def _big_text(folder: Path) -> None:
    with open(folder / "big.txt", "w") as handle:
        for _ in range(2000):
            handle.write("the lighthouse keeper wrote letters every night " * 2000 + "\n")


def _finished_run(folder: Path) -> None:
    run = folder / "done"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("command: lra\n")
    (run / "results.csv").write_text("status\nok\n")


def _nys(folder: Path, *args: str) -> None:
    """A case's setup step: run nys in the case's folder; it must succeed."""
    command = [sys.executable, "-m", "nyscli.cli", *args]
    subprocess.run(command, cwd=folder, capture_output=True, check=True)


def _real_run(folder: Path) -> None:
    _nys(folder, "approx-error", *TINY_AE, "hydra.run.dir=real")


def _stopped_lra(folder: Path, name: str = "stopped", *extra: str) -> None:
    stop = ["--steps", "4", "trainer.stop_at_step=2"]
    _nys(folder, "lra", *TINY_LRA, *stop, f"hydra.run.dir={name}", *extra)


def _foreign_checkpoint(folder: Path) -> None:
    """A stopped run whose last.pt was copied from a run of another model.dim."""
    _stopped_lra(folder)
    _stopped_lra(folder, "other", "model.dim=32")
    last = Path("checkpoints") / "last.pt"
    (folder / "stopped" / last).write_bytes((folder / "other" / last).read_bytes())


def _ae_sweep(folder: Path) -> None:
    _nys(folder, "approx-error", *TINY_AE, "-m", "seed=0,1", "hydra.sweep.dir=sw")


def _stopped_sweep(folder: Path) -> None:
    """An LRA sweep whose two jobs stopped at step 2 (checkpoints kept)."""
    _nys(folder, "lra", *TINY_LRA, "--steps", "4", "trainer.stop_at_step=2", "-m", "seed=0,1",
         "hydra.sweep.dir=sw")  # fmt: skip


def _corrupt_listops(folder: Path) -> None:
    """A ListOps data folder whose three files are random bytes (found when the job reads it)."""
    for split in ("train", "val", "test"):
        _write(f"bad/basic_{split}.tsv", bytes(range(256)) * 8)(folder)


def _garbled_metrics(folder: Path) -> None:
    _stopped_lra(folder)
    (folder / "stopped" / "metrics.csv").write_bytes(bytes(range(128, 256)) * 4)


def _truncated_checkpoint(folder: Path) -> None:
    _stopped_lra(folder)
    last = folder / "stopped" / "checkpoints" / "last.pt"
    last.write_bytes(last.read_bytes()[:100])


def cases() -> list[Case]:
    big = "99999999999999999999999"
    return [
        # numbers: types and bounds
        Case("bench seed beyond 64 bits", ["bench", f"seed={big}"]),
        Case("bench seq_lens entry beyond 64 bits", ["bench", f"seq_lens=[64,{big}]"]),
        Case("bench batch_size=inf", ["bench", "batch_size=inf"]),
        Case("bench repeats=1e400", ["bench", "repeats=1e400"]),
        Case("bench time_budget_s=nan", ["bench", "time_budget_s=nan"]),
        Case("bench memory_limit_mb=inf", ["bench", "memory_limit_mb=inf"]),
        Case("bench hidden=2^20", ["bench", "hidden=1048576"]),
        Case("bench num_heads=0", ["bench", "num_heads=0"]),
        Case("approx-error seq_len=1e3 (float)", ["approx-error", "seq_len=1e3"]),
        Case("approx-error correlation_length=inf", ["approx-error", "correlation_length=inf"]),
        Case("approx-error max_matrix_mb=1e309", ["approx-error", "max_matrix_mb=1e309"]),
        Case(
            "approx-error max_sequences=2^63", ["approx-error", "max_sequences=9223372036854775808"]
        ),
        Case("approx-error budgets=[64,-1]", ["approx-error", "budgets=[64,-1]"]),
        Case("approx-error scale=nan", ["approx-error", "scale=nan"]),
        Case("approx-error head_dim=10^6", ["approx-error", "head_dim=1000000"]),
        Case("lra trainer.max_steps=1e20 (float)", ["lra", "trainer.max_steps=1e20"]),
        Case("lra trainer.clip_grad_norm=inf", ["lra", "trainer.clip_grad_norm=inf"]),
        Case("lra trainer.eps=0", ["lra", "trainer.eps=0"]),
        Case("lra model.depth=10^6", ["lra", "model.depth=1000000"]),
        Case("lra model.num_heads=2^63-1", ["lra", "model.num_heads=9223372036854775807"]),
        Case("lra trainer.eval_batch_size=2^40", ["lra", "trainer.eval_batch_size=1099511627776"]),
        Case("lra seed=-1", ["lra", "seed=-1"]),
        Case("lra threads=1000", ["lra", "threads=1000"]),
        Case("lra device=cuda:7 without a GPU", ["lra", "device=cuda:7"]),
        Case("lra device=tpu", ["lra", "device=tpu"]),
        Case("finetune warmup_ratio=inf", ["finetune", "warmup_ratio=inf"]),
        Case("finetune epochs=1e400", ["finetune", "epochs=1e400"]),
        Case("finetune task.train_examples=0", ["finetune", "task.train_examples=0"]),
        Case(
            "finetune trainer.accumulate=2^64",
            ["finetune", "trainer.accumulate=18446744073709551616"],
        ),
        Case("pretrain mlm_probability=nan", ["pretrain", "mlm_probability=nan"]),
        Case(
            "pretrain tokenizer.vocab_size=2^40", ["pretrain", "tokenizer.vocab_size=1099511627776"]
        ),
        Case("pretrain trainer.lr=-inf", ["pretrain", "trainer.lr=-inf"]),
        Case("--steps 1e3", ["lra", "--steps", "1e3"]),
        Case("--steps -1", ["lra", "--steps", "-1"]),
        Case("--steps beyond 64 bits", ["lra", "--steps", big]),
        # sizes
        Case("approx-error seq_len=10^6 (estimate > memory)", ["approx-error", "seq_len=1000000"]),
        Case("approx-error 12 heads at n=65536", ["approx-error", "seq_len=65536", "heads=12"]),
        Case(
            "approx-error a 200 MB text read in part",
            [
                "approx-error",
                "source=minilm",
                "data.path=big.txt",
                "seq_len=32",
                "max_sequences=1",
                "budgets=8",
                "methods=[nystrom]",
                "baselines=[uniform]",
                "plots=false",
            ],
            0,
            _big_text,
            keeps=True,
        ),
        # folders and paths
        Case(
            "hydra.run.dir holding a finished run's parent",
            ["approx-error", *TINY_AE, "hydra.run.dir=done/x"],
            setup=_finished_run,
        ),
        Case(
            "hydra.run.dir with only a claim file",
            ["approx-error", *TINY_AE, "hydra.run.dir=claimed"],
            setup=_write("claimed/.nys-claim", ""),
        ),
        Case(
            "hydra.sweep.dir inside a run",
            ["approx-error", "-m", *TINY_AE, "seed=1,2", "hydra.sweep.dir=done/sweep"],
            setup=_finished_run,
        ),
        Case("outputs is a file", ["approx-error", *TINY_AE], setup=_write("outputs", "x")),
        Case(
            "outputs links to a file",
            ["approx-error", *TINY_AE],
            setup=lambda f: (_write("target", "x")(f), _link("outputs", "target")(f)),
        ),
        Case(
            "hydra.run.dir under /dev/null",
            ["approx-error", *TINY_AE, "hydra.run.dir=/dev/null/run"],
        ),
        Case("hydra.run.dir in /proc", ["approx-error", *TINY_AE, "hydra.run.dir=/proc/nys"]),
        Case("data_cache is /dev/null", ["lra", *TINY_LRA, "data_cache=/dev/null"]),
        Case(
            "data_cache is a file",
            ["lra", *TINY_LRA, "data_cache=afile"],
            setup=_write("afile", "x"),
        ),
        Case(
            "approx-error data.path=/dev/zero",
            ["approx-error", "source=minilm", "data.path=/dev/zero", "seq_len=32"],
        ),
        Case(
            "approx-error data.path is a folder",
            ["approx-error", "source=minilm", "data.path=.", "seq_len=32"],
        ),
        Case(
            "approx-error data.path empty file",
            ["approx-error", "source=minilm", "data.path=empty.txt", "seq_len=32"],
            setup=_write("empty.txt", ""),
        ),
        Case(
            "approx-error data.path random bytes",
            ["approx-error", "source=minilm", "data.path=noise.bin", "seq_len=32"],
            setup=_write("noise.bin", os.urandom(5000)),
        ),
        Case("finetune data.path=/dev/null", ["finetune", "data.path=/dev/null"]),
        Case(
            "finetune init=minilm with a bad data.path: the refusal alone",
            ["finetune", "init=minilm", "data.path=/dev/null"],
            lines=1,
        ),
        Case("finetune init= a missing folder", ["finetune", "init=/nonexistent/run"]),
        Case("finetune init=hf: a missing folder", ["finetune", "init=hf:/nonexistent"]),
        Case("finetune eval_only= a folder that is no run", ["finetune", "eval_only=/tmp"]),
        Case("lra resume= a folder that is no run", ["lra", *TINY_LRA, "resume=/tmp"]),
        Case(
            "lra resume= a truncated last.pt",
            ["lra", *TINY_LRA, "--steps", "4", "resume=stopped"],
            setup=_truncated_checkpoint,
        ),
        Case("report on a file", ["report", "afile"], setup=_write("afile", "x")),
        Case(
            "report --out in /proc",
            ["report", "real", "--out", "/proc/x.csv"],
            setup=_real_run,
            says="/proc/x.csv",
            lines=1,
        ),
        Case(
            "report --out on a read-only file system (/sys)",
            ["report", "real", "--out", "/sys/x.csv"],
            setup=_real_run,
            says="/sys/x.csv: Permission denied",
            lines=1,
        ),
        Case(
            "lra resume= a last.pt copied from a run of another model.dim",
            ["lra", *TINY_LRA, "--steps", "4", "resume=stopped"],
            setup=_foreign_checkpoint,
            says="model.dim (32 there, 16 here)",
            lines=1,
        ),
        Case(
            "a sweep continued with other values",
            ["approx-error", *TINY_AE, "-m", "seed=0,2", "hydra.sweep.dir=sw"],
            setup=_ae_sweep,
            says="holds a sweep of other values (seed: 0,1 there, 0,2 here)",
            lines=1,
        ),
        Case(
            "a sweep continued by another command",
            ["bench", "-m", "seed=0,1", "hydra.sweep.dir=sw"],
            setup=_ae_sweep,
            says="holds a sweep of nys approx-error, not of nys bench",
            lines=1,
        ),
        Case(
            "a sweep continued, a job's .hydra/hydra.yaml garbage",
            ["approx-error", *TINY_AE, "-m", "seed=0,1", "hydra.sweep.dir=sw"],
            setup=lambda f: (_ae_sweep(f), (f / "sw/1/.hydra/hydra.yaml").write_bytes(b"{{\xff")),
            says="sw/1/.hydra/hydra.yaml cannot be read",
            lines=1,
        ),
        Case(
            "a sweep stopped at checkpoints, continued without --resume true",
            ["lra", *TINY_LRA, "--steps", "4", "-m", "seed=0,1", "hydra.sweep.dir=sw"],
            setup=_stopped_sweep,
            says="add --resume true to continue it from there",
            lines=1,
        ),
        Case(
            "the same, with --resume true: both jobs go on from step 2",
            [
                "lra",
                *TINY_LRA,
                "--steps",
                "4",
                "-m",
                "seed=0,1",
                "hydra.sweep.dir=sw",
                "--resume=true",
            ],
            0,
            setup=_stopped_sweep,
            keeps=True,
            says="resumed from its checkpoint: job 0, 1",
        ),
        Case(
            "report over a run with a garbage results.csv",
            ["report", "bad"],
            0,
            says="unreadable results.csv (ValueError)",
            setup=lambda f: (
                _finished_run(f),
                os.rename(f / "done", f / "bad"),
                (f / "bad" / "results.csv").write_bytes(b"\x00\xff" * 50),
            ),
        ),
        Case(
            "a 1000-job sweep checked without a terminal says how far it is",
            ["approx-error", "-m", "seed=range(0,1000)", *TINY_AE, "hydra.sweep.dir=/dev/null/x"],
            says="of 1000 checked",
        ),
        Case(
            "an MLflow store SQLite cannot open (a folder; a read-only disk alike)",
            [
                "lra",
                *TINY_LRA,
                "--steps",
                "2",
                "logger=mlflow",
                "logger.mlflow.tracking_uri=sqlite:///a_folder",
            ],
            0,
            lambda folder: (folder / "a_folder").mkdir(),
            keeps=True,
            says="cannot open the MLflow store",
        ),
        # parsing
        Case("key with no value", ["lra", "seed="]),
        Case("unknown key", ["lra", "foo=1"]),
        Case(
            "path split by the shell", ["approx-error", "source=minilm", "data.path=my", "file.txt"]
        ),
        Case("brackets in a path", ["approx-error", "source=minilm", "data.path=runs[1].txt"]),
        Case("an option twice", ["lra", "--steps", "3", "trainer.max_steps=5"]),
        Case(
            "a seed of 5,000 digits",
            ["bench", "-n", "64", "seed=" + "9" * 5000],
            says="a number of 5000 digits",
        ),
        Case(
            "--fail-fast, the second job's data corrupt",
            [
                "lra",
                *TINY_LRA,
                "--steps",
                "2",
                "--fail-fast",
                "-m",
                "seed=0,1",
                "data.path=null,bad",
            ],
            1,
            setup=_corrupt_listops,
            keeps=True,  # job 0 finished: the sweep folder stays, jobs 2 and 3 never start
            says="fail_fast stopped the sweep",
        ),
        Case(
            "nys report, a run's metrics.csv random bytes",
            ["report", "stopped"],
            0,
            setup=_garbled_metrics,
            keeps=True,
            says="cannot be read",
        ),
        Case(
            "a search's optuna.db that is no database",
            ["lra", "hparams_search=lra_lr", "hydra.sweep.dir=old"],
            setup=_write("old/optuna.db", bytes(range(256)) * 8),
            says="cannot be opened (file is not a database)",
        ),
        Case(
            "a search space under hydra.sweeper.params",
            ["lra", "hparams_search=lra_lr", "hydra.sweeper.params.trainer.lr=interval(1e-5,1e-3)"],
            says="'trainer.lr=interval(1e-5,1e-3)'",
            lines=1,
        ),
        # signals
        Case(
            "SIGTERM during approx-error",
            ["approx-error", "seq_len=2048", "heads=4"],
            143,
            stop=(signal.SIGTERM, 8.0),
        ),
        Case(
            "SIGINT during approx-error",
            ["approx-error", "seq_len=2048", "heads=4"],
            130,
            stop=(signal.SIGINT, 8.0),
        ),
        Case(
            "SIGTERM while ListOps trees are generated",
            ["lra", "task=listops", "threads=1", "data.generate.n_train=200000"],
            143,
            stop=(signal.SIGTERM, 8.0),
        ),
        Case(
            "unknown allocator",
            ["approx-error", *TINY_AE],
            env={"NYS_ALLOCATOR": "syst"},
            says="NYS_ALLOCATOR='syst' is not allowed",
        ),
        Case(
            "tcmalloc asked for beside a preloaded allocator",
            ["approx-error", *TINY_AE],
            setup=_preloadable("libmimalloc.so.2"),
            env={"NYS_ALLOCATOR": "tcmalloc", "LD_PRELOAD": "{folder}/libmimalloc.so.2"},
            says="LD_PRELOAD already names",
        ),
        Case(
            "SIGINT during bench",
            ["bench", "seq_lens=[4096]", "threads=1"],
            130,
            stop=(signal.SIGINT, 10.0),
        ),
    ]


def run_case(case: Case, root: Path) -> None:
    folder = Path(tempfile.mkdtemp(prefix="case-", dir=root))
    case.setup(folder)
    before = {p for p in folder.rglob("*")}
    env = {
        **os.environ,
        "COLUMNS": "200",
        "NO_COLOR": "1",
        "NYSCLI_DATA_CACHE": str(folder / "cache"),
        **{key: value.format(folder=folder) for key, value in case.env.items()},
    }
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "nyscli.cli", *case.args],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    if case.stop is not None:
        signum, after = case.stop
        try:
            process.wait(after)
        except subprocess.TimeoutExpired:
            process.send_signal(signum)
    try:
        out = process.communicate(timeout=600)[0]
    except subprocess.TimeoutExpired:
        process.kill()
        out = process.communicate()[0] + "\n(killed after 600 s)"
    lines = [line.rstrip() for line in out.strip().splitlines() if line.strip()]
    runs = {p.parent for p in folder.rglob(".hydra")} | {p for p in folder.rglob("outputs")}
    left = sorted(str(p.relative_to(folder)) for p in runs if p not in before)
    last = lines[-1] if lines else ""
    ok = (
        process.returncode == case.code
        and "Traceback" not in out
        and (case.code == 0 or last.startswith("error:"))
        and (case.keeps or case.code == 0 or not left)
        and case.says in out
        and (case.lines is None or len(lines) == case.lines)
    )
    case.result = {
        "code": process.returncode,
        "lines": len(lines),
        "last": last,
        "left": ", ".join(left) or "nothing",
        "ok": ok,
        "seconds": time.monotonic() - started,
    }


def table(done: list[Case]) -> str:
    rows = [
        "| # | case | command | exit (expected) | lines | last line | folder left | ok |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, case in enumerate(done, 1):
        r = case.result
        given = [f"{key}={value.format(folder='.')}" for key, value in case.env.items()]
        command = " ".join([*given, "nys", *case.args]).replace("|", "\\|")
        last = r["last"].replace("|", "\\|")
        if len(last) > 180:
            last = last[:177] + "..."
        rows.append(
            f"| {i} | {case.name} | `{command}` | {r['code']} ({case.code}) | "
            f"{r['lines']} | {last} | {r['left']} | {'yes' if r['ok'] else '**NO**'} |"
        )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the markdown table here too")
    parser.add_argument("-k", default="", help="only cases whose name contains this")
    args = parser.parse_args()
    selected = [c for c in cases() if args.k in c.name]
    with tempfile.TemporaryDirectory(prefix="hostile-") as root:
        for case in selected:
            run_case(case, Path(root))
            mark = "ok" if case.result["ok"] else "FAIL"
            print(
                f"{mark:4} {case.result['code']:>3} {case.name}: {case.result['last'][:120]}",
                flush=True,
            )
    text = table(selected)
    if args.out:
        args.out.write_text(text + "\n")
    failed = [c.name for c in selected if not c.result["ok"]]
    print(
        f"{len(selected) - len(failed)} of {len(selected)} cases pass"
        + (f"; failing: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

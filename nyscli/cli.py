"""The ``nys`` command line: Typer commands whose typed options become Hydra overrides."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

try:  # Typer >= 0.26 vendors click; older ones use the click package
    from typer._click import exceptions as click_errors
    from typer._click.core import ParameterSource
    from typer._click.globals import get_current_context
except ImportError:  # pragma: no cover
    from click import exceptions as click_errors
    from click import get_current_context
    from click.core import ParameterSource

from nyscli import gpu_env
from nyscli.allocator import reexec_with_tcmalloc
from nyscli.console import say_error
from nyscli.errors import UserInputError, describe_os_error
from nyscli.overrides import override_key
from nyscli.paths import CONF_DIR
from nyscli.stops import sigterm_raises, stop_code, stopped, unreported

# Only typer, rich and the config folder at import time: torch, Hydra and the experiments load
# when a command runs, so ``nys --help`` and tab completion answer in well under a second.

app = typer.Typer(
    help="nys: measure and reproduce Nyström attention and its rivals (Xiong et al., AAAI 2021).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

# nys finetune's task= is this config group's choice (conf/task/ is LRA's).
FINETUNE_TASK = "finetune_task"
HYDRA_COMMAND = {"allow_extra_args": True, "ignore_unknown_options": True}
OVERRIDES_HELP = (
    "Hydra overrides (key=value, group=option; with -m, comma lists sweep), and Hydra flags "
    "such as --cfg job."
)


def complete_overrides(command: str):
    """Tab completion of ``group=option`` from conf/ and of the primary config's keys."""

    def complete(incomplete: str) -> list[str]:
        import yaml  # not omegaconf: completion must answer fast

        choices = []
        internal = ("hydra", "base", "__pycache__")
        for group in sorted(p for p in CONF_DIR.iterdir() if p.is_dir() and p.name not in internal):
            choices += [f"{group.name}={opt.stem}" for opt in sorted(group.glob("*.yaml"))]
        # The command's own keys and those every command shares (conf/base/default.yaml).
        for source in (CONF_DIR / f"{command}.yaml", CONF_DIR / "base" / "default.yaml"):
            if source.exists():
                keys = (yaml.safe_load(source.read_text()) or {}).keys()
                choices += [f"{k}=" for k in keys if k not in ("defaults", "hydra")]
        return [c for c in choices if c.startswith(incomplete)]

    return complete


def _list(values: list | None) -> str:
    return "[" + ",".join(str(v) for v in values) + "]"


def run_hydra_command(
    command: str,
    typed: dict[str, object],
    overrides: list[str] | None,
    multirun: bool,
    fail_fast: bool = False,
) -> None:
    """Typed options (None = keep the YAML default) + free overrides -> Hydra.

    A key set both ways (``--seq-len 64 seq_lens=[128]``) is refused: neither silently wins.
    """
    typed = {**typed, "fail_fast": "true" if fail_fast else None}
    given = {key: value for key, value in typed.items() if value is not None}
    for override in overrides or []:
        key = override_key(override)
        if key in given:
            name = "task" if key == FINETUNE_TASK else key
            fail(
                f"{name} is given twice, by a typed option ({name}={given[key]}) and by the "
                f"override {override.replace(FINETUNE_TASK, 'task', 1)}; give it once"
            )
    _refuse_unknown_flags(overrides or [])
    arguments = [f"{key}={value}" for key, value in given.items()]
    as_typed = {f"{key}={given[key]}": text for key, text in _typed_texts(given).items()}
    arguments += list(overrides or [])
    if multirun:
        arguments.insert(0, "--multirun")
    try:  # Hydra, then torch load here (seconds): Typer would turn Ctrl-C into a silent 130
        from nyscli.launch.compose import early_refusal

        refused = early_refusal(command, arguments, as_typed)  # before torch is imported
        if refused:
            fail(refused)
        from nyscli.launch.run import launch
    except KeyboardInterrupt as stop:
        fail(f"{stopped(stop)}; nothing was written", stop_code(stop))
    raise typer.Exit(launch(command, arguments, as_typed))


def _typed_texts(given: dict[str, object]) -> dict[str, str]:
    """Config key -> the typed option that set it, as the user typed it (``seq_lens`` ->
    ``--seq-len 0``), so a refusal names what was typed. An option belongs to the one key
    whose last part is its name, or starts or ends with it (``seq_len`` -> ``seq_lens``,
    ``steps`` -> ``trainer.max_steps``, ``data_path`` -> ``data.path``)."""
    ctx = get_current_context(silent=True)
    if ctx is None:
        return {}
    texts = {}
    for param in ctx.command.params:
        if not param.opts[0].startswith("--") or param.name is None or getattr(param, "is_flag", 0):
            continue
        if ctx.get_parameter_source(param.name) != ParameterSource.COMMANDLINE:
            continue
        name = param.name
        keys = [
            key
            for key in given
            if key.replace(".", "_") == name
            or key.rpartition(".")[2].startswith(name)
            or key.rpartition(".")[2].endswith(name)
        ]
        value = ctx.params[name]
        if len(keys) == 1 and value is not None:
            values = value if isinstance(value, list | tuple) else [value]
            texts[keys[0]] = " ".join(f"{param.opts[0]} {v}" for v in values)
    return texts


def _refuse_unknown_flags(overrides: list[str]) -> None:
    """A misspelt option (``--seq-lens``) reaches here among the overrides (the commands take
    unknown options, for Hydra's flags): refused with the nearest name."""
    import difflib

    from hydra._internal.utils import get_args_parser

    ctx = get_current_context(silent=True)
    known = list(get_args_parser()._option_string_actions)
    known += [opt for param in (ctx.command.params if ctx else []) for opt in param.opts]
    for override in overrides:
        flag = override.split("=", 1)[0]
        if flag.startswith("-") and flag not in known:
            near = difflib.get_close_matches(flag, known, n=1)
            hint = f"; did you mean {near[0]}?" if near else ""
            fail(f"no such option: {flag}{hint} (see nys {ctx.info_name if ctx else ''} --help)")


def overrides_argument(command: str, extra_help: str = "") -> Any:
    """The free Hydra overrides every Hydra command takes, completed from conf/."""
    return typer.Argument(
        help=OVERRIDES_HELP + extra_help,
        show_default=False,
        autocompletion=complete_overrides(command),
    )


# Options several commands share, declared once (each command adds its own beside them).
Multirun = Annotated[bool, typer.Option("--multirun", "-m", help="Run a Hydra sweep.")]
FailFast = Annotated[
    bool,
    typer.Option(
        "--fail-fast", help="In a sweep, stop at the first failed job (sets fail_fast=true)."
    ),
]
Steps = Annotated[int | None, typer.Option(help="Optimizer steps (sets trainer.max_steps).")]
BatchSize = Annotated[
    int | None, typer.Option(help="Examples per step, per rank (sets trainer.batch_size).")
]
Seed = Annotated[int | None, typer.Option(help="Seed of every random draw of the run.")]
Resume = Annotated[
    str | None,
    typer.Option(
        help="true (newest matching run under outputs/<command>/) or a run folder to continue; "
        "with -m and hydra.sweep.dir=<sweep>, true continues that sweep."
    ),
]
BenchOverrides = Annotated[list[str] | None, overrides_argument("bench")]
ApproxOverrides = Annotated[list[str] | None, overrides_argument("approx_error")]
LraOverrides = Annotated[list[str] | None, overrides_argument("lra")]
PretrainOverrides = Annotated[list[str] | None, overrides_argument("pretrain")]
FinetuneOverrides = Annotated[
    list[str] | None, overrides_argument("finetune", " task=... selects conf/finetune_task/.")
]


def training_options(
    steps: int | None, batch_size: int | None, seed: int | None, resume: str | None
) -> dict[str, object]:
    """The typed options lra, pretrain and finetune share, as config keys."""
    return {
        "trainer.max_steps": steps,
        "trainer.batch_size": batch_size,
        "seed": seed,
        "resume": resume,
    }


@app.command(context_settings=HYDRA_COMMAND)
def bench(
    overrides: BenchOverrides = None,
    seq_len: Annotated[
        list[int] | None,
        typer.Option("--seq-len", "-n", help="Sequence length; repeat for a grid (sets seq_lens)."),
    ] = None,
    attention_set: Annotated[
        str | None,
        typer.Option(help="Rows to measure: table1, all, none (plus attention=... if given)."),
    ] = None,
    scope: Annotated[
        list[str] | None,
        typer.Option(
            help="module (projections + attention, the paper's protocol), core (q,k,v -> out "
            "only) or projections (the module around its core); repeat to time several."
        ),
    ] = None,
    mode: Annotated[
        str | None, typer.Option(help="forward (inference) or train (forward + backward).")
    ] = None,
    dtype: Annotated[
        str | None, typer.Option(help="fp32, bf16 or fp16 (bf16/fp16 via autocast).")
    ] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Batch size (paper: 1).")] = None,
    repeats: Annotated[
        int | None, typer.Option(help="Most timed repeats per point (median reported).")
    ] = None,
    multirun: Multirun = False,
    fail_fast: FailFast = False,
) -> None:
    """Table 1: time and peak memory of one self-attention module vs sequence length."""
    typed = {
        "seq_lens": _list(seq_len) if seq_len else None,
        "attention_set": attention_set,
        "scope": _list(scope) if scope and len(scope) > 1 else (scope or [None])[0],
        "mode": mode,
        "dtype": dtype,
        "device": device,
        "batch_size": batch_size,
        "repeats": repeats,
    }
    run_hydra_command("bench", typed, overrides, multirun, fail_fast)


@app.command("approx-error", context_settings=HYDRA_COMMAND)
def approx_error(
    overrides: ApproxOverrides = None,
    source: Annotated[
        str | None,
        typer.Option(
            help="Where q, k, v come from: smooth, gaussian, minilm (real BERT) or checkpoint."
        ),
    ] = None,
    seq_len: Annotated[
        int | None, typer.Option("--seq-len", "-n", help="Sequence length n.")
    ] = None,
    budget: Annotated[
        list[int] | None,
        typer.Option("--budget", "-b", help="Budget m; repeat for a curve (sets budgets)."),
    ] = None,
    method: Annotated[
        list[str] | None,
        typer.Option("--method", help="Method to compare; repeat for several (sets methods)."),
    ] = None,
    data_path: Annotated[
        Path | None,
        typer.Option(
            help="minilm/checkpoint: a UTF-8 text file to run the model on (sets data.path)."
        ),
    ] = None,
    seed: Seed = None,
    multirun: Multirun = False,
    fail_fast: FailFast = False,
    text_path: Annotated[str | None, typer.Option(hidden=True)] = None,  # renamed: --data-path
) -> None:
    """How close Nyström (and its rivals) come to exact attention, sweeping the budget m."""
    if text_path is not None:
        fail(f"--text-path is now --data-path: give --data-path {text_path}")
    typed = {
        "source": source,
        "seq_len": seq_len,
        "budgets": _list(budget) if budget else None,
        "methods": _list(method) if method else None,
        "data.path": data_path,
        "seed": seed,
    }
    run_hydra_command("approx_error", typed, overrides, multirun, fail_fast)


@app.command(context_settings=HYDRA_COMMAND)
def lra(
    overrides: LraOverrides = None,
    task: Annotated[
        str | None,
        typer.Option(help="listops, text, retrieval, image or pathfinder (the task group)."),
    ] = None,
    steps: Steps = None,
    batch_size: BatchSize = None,
    seed: Seed = None,
    resume: Resume = None,
    nproc_per_node: Annotated[
        int | None,
        typer.Option(
            help="Training processes (torch.distributed ranks) per job "
            "(sets trainer.nproc_per_node)."
        ),
    ] = None,
    multirun: Multirun = False,
    fail_fast: FailFast = False,
) -> None:
    """Table 3: train and test on a Long Range Arena task (attention=... picks the variant)."""
    typed = {
        "task": task,
        **training_options(steps, batch_size, seed, resume),
        "trainer.nproc_per_node": nproc_per_node,
    }
    run_hydra_command("lra", typed, overrides, multirun, fail_fast)


@app.command(context_settings=HYDRA_COMMAND)
def pretrain(
    overrides: PretrainOverrides = None,
    model: Annotated[
        str | None, typer.Option(help="bert_mini, bert_small or bert_base (model group).")
    ] = None,
    data: Annotated[
        str | None, typer.Option(help="wiki_summaries, folder (data.path=...) or hf.")
    ] = None,
    steps: Steps = None,
    batch_size: BatchSize = None,
    seed: Seed = None,
    resume: Resume = None,
    multirun: Multirun = False,
    fail_fast: FailFast = False,
) -> None:
    """Fig. 5/6: BERT MLM + SOP pre-training (attention=... picks the variant)."""
    typed = {"model": model, "data": data, **training_options(steps, batch_size, seed, resume)}
    run_hydra_command("pretrain", typed, overrides, multirun, fail_fast)


@app.command(context_settings=HYDRA_COMMAND)
def finetune(
    overrides: FinetuneOverrides = None,
    task: Annotated[
        str | None, typer.Option(help="sst2, mrpc, qnli, qqp, mnli, imdb or csv (your own file).")
    ] = None,
    init: Annotated[
        str | None,
        typer.Option(
            help="scratch, or a pretrained folder (nys pretrain run folder or its pretrained/)."
        ),
    ] = None,
    epochs: Annotated[
        float | None, typer.Option(help="Passes over the training set (paper: 4).")
    ] = None,
    steps: Steps = None,
    batch_size: BatchSize = None,
    max_len: Annotated[
        int | None, typer.Option(help="Tokens per example (sets task.max_len).")
    ] = None,
    seed: Seed = None,
    resume: Resume = None,
    multirun: Multirun = False,
    fail_fast: FailFast = False,
) -> None:
    """Table 2: fine-tune on GLUE or IMDB from a nys pretrain checkpoint (or from scratch)."""
    # The tasks live in conf/finetune_task/ (conf/task/ is LRA's): task=... is rewritten.
    overrides = [
        f"{FINETUNE_TASK}={o.split('=', 1)[1]}" if o.split("=", 1)[0] == "task" else o
        for o in overrides or []
    ]
    typed = {
        FINETUNE_TASK: task,
        "init": init,
        "epochs": epochs,
        **training_options(steps, batch_size, seed, resume),
        "task.max_len": max_len,
    }
    run_hydra_command("finetune", typed, overrides, multirun, fail_fast)


@app.command()
def report(
    paths: list[Path] = typer.Argument(..., help="Run folders, sweep folders or outputs/ itself."),
    out: Path = typer.Option(
        None,
        help="The combined CSV; each command's comparison PNG goes beside it as "
        "<stem>_<command>*.png (default: PATH/summary.csv for one PATH, else ./report.csv).",
    ),
    per_run: bool = typer.Option(
        False,
        "--per-run",
        help="Every run on its own (default: runs that differ only in seed as mean ± std).",
    ),
) -> None:
    """Aggregate run folders (also partly failed sweeps) into one table, one CSV and the figure
    that compares them (pre-training curves, learning curves, error vs budget, time/memory)."""
    from nyscli.experiments.report.command import show_report

    if out is None:
        one = len(paths) == 1 and paths[0].is_dir()
        out = paths[0] / "summary.csv" if one else Path("report.csv")
    if out.is_dir():
        fail(f"--out={out} is a folder; give a file name, e.g. --out {out / 'summary.csv'}")
    try:
        show_report(paths, out, figures=out.parent, per_run=per_run)
    except UserInputError as error:
        fail(str(error))
    except OSError as error:
        fail(describe_os_error(error))


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` as one line and exit with ``code``."""
    say_error(message)
    raise typer.Exit(code)


def main() -> None:
    """The ``nys`` entry point. Typer's usage errors (an unknown option, ``--steps abc``) are
    one line and exit code 2 here, instead of Typer's multi-line panel. Ctrl-C or SIGTERM at
    any moment, also while torch is still being imported, is one line too (exit 130 / 143).

    First of all it re-executes itself on tcmalloc where that is installed (``nyscli.allocator``:
    before torch allocates, and before the signal handlers, which an exec would drop)."""
    try:
        gpu_env.check(os.environ)  # the GPU path's switches, before torch is imported
        reexec_with_tcmalloc()
    except UserInputError as error:
        say_error(str(error))
        sys.exit(2)
    with sigterm_raises():
        code = _main()
    sys.exit(code or 0)


def _main(args: list[str] | None = None) -> int:
    """Run ``nys`` with ``args`` (default: the command line) and return its exit code."""
    try:
        code = app(args=args, standalone_mode=False)
        stop = unreported()
        if stop is not None:  # Typer made a SIGTERM during parsing a silent Exit(130)
            say_error(stopped(stop))
            code = stop_code(stop)
    except click_errors.NoArgsIsHelpError as error:
        error.show()
        code = 0
    except click_errors.ClickException as error:
        message = " ".join(error.format_message().split()).rstrip(".")
        ctx = getattr(error, "ctx", None)
        hint = f"; see {ctx.command_path} --help" if ctx is not None else ""
        say_error(message + hint)
        code = error.exit_code
    except (typer.Abort, KeyboardInterrupt) as error:
        # click turns a KeyboardInterrupt (Ctrl-C, or our SIGTERM) into Abort
        stop = error if isinstance(error, KeyboardInterrupt) else error.__context__
        if not isinstance(stop, KeyboardInterrupt):
            say_error("aborted")
            return 1
        say_error(stopped(stop))
        code = stop_code(stop)
    return code


if __name__ == "__main__":
    main()

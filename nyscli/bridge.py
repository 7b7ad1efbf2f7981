"""The bridge from a Typer command to Hydra: overrides in, a composed config and a run folder out.

Each command turns its typed options into Hydra override strings, appends the free overrides
and hands everything to Hydra's own entry point (``_run_hydra``), so multirun, launcher plugins,
``--cfg``, ``.hydra/`` and callbacks behave exactly as in a ``@hydra.main`` script. Before
launching, every job's config is composed and validated, so a typo fails in one line with exit
code 2 instead of deep inside a sweep.
"""

from __future__ import annotations

import itertools
import logging
import traceback
from datetime import datetime
from pathlib import Path

import hydra
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra._internal.utils import _run_hydra, get_args_parser
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nyscli.attention import AttentionConfigError
from nyscli.errors import UserInputError
from nyscli.experiments import experiment_module
from nyscli.experiments.summary import write_summary
from nyscli.paths import CONF_DIR
from nyscli.report.console import console
from nyscli.report.env import collect_env
from nyscli.report.files import write_csv, write_json, write_text
from nyscli.report.runs import ERROR_FILE, RESULTS_FILE, find_run_folders
from nyscli.train import distributed

log = logging.getLogger("nys")

OUTPUT_ROOT = "outputs"
USER_ERRORS = (UserInputError, AttentionConfigError, HydraException, OmegaConfBaseException)
# The optional Hydra launcher plugins behind conf/cluster/ presets: launcher -> pip package.
LAUNCHER_PACKAGES = {
    "joblib": "hydra-joblib-launcher",
    "submitit_local": "hydra-submitit-launcher",
    "submitit_slurm": "hydra-submitit-launcher",
}


class Abort(BaseException):
    """Leaves Hydra's job runner untouched (it only catches Exception) with an exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def one_line(error: BaseException) -> str:
    """The error's message, and its cause's, on one line."""
    # Hydra appends its whole config search path to missing-config errors: noise for users.
    text = " ".join(str(error).split("Config search path")[0].split())
    cause = error.__cause__
    if cause is not None and str(cause).strip():
        first = str(cause).strip().splitlines()[0].strip()
        if first not in text:
            text += f" ({first})"
    return text


def missing_launcher(error: BaseException, overrides: list[str]) -> str | None:
    """The one-line install hint when a cluster preset's launcher plugin is not installed."""
    if not isinstance(error, MissingConfigException):
        return None
    missing = str(error.missing_cfg_file or "")
    launcher = missing.removeprefix("hydra/launcher/")
    if launcher == missing or launcher not in LAUNCHER_PACKAGES:
        return None
    package = LAUNCHER_PACKAGES[launcher]
    # The default preset (local) needs no plugin: the culprit is the one given, if any.
    presets = [o.lstrip("+~") for o in overrides if o.lstrip("+~").startswith("cluster=")]
    choice = presets[-1] if presets else f"hydra/launcher={launcher}"
    return (
        f"{choice} needs the Hydra launcher plugin {package}, which is not installed: "
        f"pip install {package}"
    )


def claim_dir(base: Path) -> Path:
    """Create ``base`` (or ``base_1``, ``base_2``, ...) atomically: folders are never reused."""
    for i in itertools.count():
        candidate = base if i == 0 else base.with_name(f"{base.name}_{i}")
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


def job_overrides(overrides: list[str], multirun: bool) -> list[list[str]]:
    """The override list of every job the launch would run (one list unless multirun)."""
    if not multirun:
        return [overrides]
    parsed = OverridesParser.create().parse_overrides(overrides)
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def config_multirun(command: str, overrides: list[str]) -> bool:
    """Whether the composed config puts Hydra in multirun mode (every cluster preset but
    ``local`` does), exactly as Hydra decides it; missing configs raise here."""
    with hydra.initialize_config_dir(
        config_dir=str(CONF_DIR), version_base="1.3", job_name=command
    ):
        cfg = GlobalHydra.instance().hydra.compose_config(  # type: ignore[union-attr]
            config_name=command,
            overrides=overrides,
            run_mode=RunMode.MULTIRUN,
            with_log_configuration=False,
            validate_sweep_overrides=False,
        )
    return cfg.hydra.mode == RunMode.MULTIRUN


def validate_jobs(command: str, overrides: list[str], multirun: bool) -> None:
    """Compose and validate every job's config; raise one of USER_ERRORS at the first bad one."""
    task_overrides = [o for o in overrides if not o.lstrip("+~").startswith("hydra")]
    module = experiment_module(command)
    with hydra.initialize_config_dir(
        config_dir=str(CONF_DIR), version_base="1.3", job_name=command
    ):
        for job in job_overrides(task_overrides, multirun):
            module.validate(hydra.compose(config_name=command, overrides=job))


class Task:
    """The Hydra task function of ``command``: run the experiment, write results and env.

    A class, not a closure, so launchers that ship the task to other processes (joblib,
    submitit) pickle it by reference.
    """

    def __init__(self, command: str) -> None:
        self.command = command

    def __call__(self, cfg: DictConfig) -> None:
        command = self.command
        hydra_cfg = HydraConfig.get()
        run_dir = Path(hydra_cfg.runtime.output_dir)
        multirun = hydra_cfg.mode == RunMode.MULTIRUN
        module = experiment_module(command)
        main = distributed.launched_rank() == 0  # torchrun/srun/submitit ranks > 0 write nothing
        if main:
            env = collect_env(str(cfg.get("device", "cpu")), cfg.get("threads"))
            write_json(env, run_dir / "env.json")
        else:
            logging.getLogger().setLevel(logging.WARNING)
        nproc = int(OmegaConf.select(cfg, "trainer.nproc_per_node", default=1))
        try:
            module.validate(cfg)
            df = distributed.run_on_ranks(module.run, cfg, run_dir, console, nproc)
        except USER_ERRORS as error:
            message = one_line(error)
            write_text(message + "\n", run_dir / ERROR_FILE)
            if not multirun:
                raise Abort(message, 2) from error
            log.error("job failed: %s", message)
            return
        except Exception as error:
            write_text(f"{one_line(error)}\n\n{traceback.format_exc()}", run_dir / ERROR_FILE)
            if not multirun:
                raise
            log.exception("job failed")
            return
        if df is None:
            return
        write_csv(df, run_dir / RESULTS_FILE)
        console.print(module.render(df))
        log.info("results: %s", run_dir / RESULTS_FILE)


def _run_folder(base: Path, shared: bool) -> Path:
    """A new folder for this run, or the one all ranks of a launched world share."""
    if not shared:
        return claim_dir(base)
    base.mkdir(parents=True, exist_ok=True)
    return base


def _overrides_key(overrides: list[str], key: str) -> bool:
    return any(o.split("=", 1)[0].lstrip("+~") == key for o in overrides)


def launch(command: str, arguments: list[str]) -> int:
    """Run ``nys <command>`` with Hydra-style ``arguments``; returns the process exit code."""
    parser = get_args_parser()
    parser.prog = f"nys {command}"
    args = parser.parse_intermixed_args(arguments)
    hydra.version.setbase("1.3")
    multirun = bool(args.multirun)
    inspecting = bool(
        args.cfg or args.info or args.help or args.hydra_help or args.shell_completion
    )
    sweep_dir = None
    if not inspecting:
        try:
            multirun = multirun or config_multirun(command, list(args.overrides))
            validate_jobs(command, list(args.overrides), multirun)
            key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
            given = _overrides_key(args.overrides, key)
            # Every rank of a torchrun/srun job runs this: they must share one folder.
            shared = None if given else distributed.shared_run_name()
        except USER_ERRORS as error:
            message = missing_launcher(error, args.overrides) or one_line(error)
            console.print(f"[red]error:[/] {message}", highlight=False, soft_wrap=True)
            return 2
        if not given:
            root = Path(OUTPUT_ROOT) / command / ("multirun" if multirun else "")
            name = shared or datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
            folder = _run_folder(root / name, shared is not None)
            args.overrides.append(f"{key}={folder}")
            sweep_dir = folder if multirun else None
    try:
        _run_hydra(
            args=args,
            args_parser=parser,
            task_function=Task(command),
            config_path=str(CONF_DIR),
            config_name=command,
        )
    except Abort as abort:
        console.print(f"[red]error:[/] {abort.message}", highlight=False, soft_wrap=True)
        return abort.code
    except SystemExit:
        # Hydra reported a launcher failure (e.g. a submitit job killed by SIGKILL, OOM):
        # the jobs that did finish still get their summary, and the lost ones are listed.
        if sweep_dir is None:
            raise
        write_summary(sweep_dir)
    if sweep_dir is not None:
        # Jobs of any launcher, also ones killed before they could write error.txt.
        failed = [p for p in find_run_folders([sweep_dir]) if not (p / RESULTS_FILE).exists()]
        if failed:
            console.print(
                f"[red]{len(failed)} job(s) failed[/]; see {', '.join(str(f) for f in failed)}"
            )
            return 1
    return 0

"""The one training loop: updates, periodic dev evaluation, checkpoints, resume, NaN stop.

Generic on purpose: the caller supplies the model, an *objective* (``(model, batch) ->
BatchResult``; the batch is already on the device), resumable training batches
(:class:`~nyscli.train.batches.ShuffledBatches`), re-iterable dev/test batches and a
:class:`~nyscli.train.config.TrainerConfig`. ``lra`` uses it now; ``pretrain`` and
``finetune`` plug in their own objectives.
"""

from __future__ import annotations

import contextlib
import logging
import math
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from torch import nn

from nyscli.console import heartbeat
from nyscli.errors import UserInputError
from nyscli.output.curves import is_rate
from nyscli.stops import Terminated, reported, sigterm_raises, unreported
from nyscli.train import distributed
from nyscli.train.batches import ShuffledBatches
from nyscli.train.checkpoint import (
    BEST,
    CHECKPOINT_DIR,
    LAST,
    load_best,
    load_checkpoint,
    save_checkpoint,
    shape_mismatch,
)
from nyscli.train.config import TrainerConfig
from nyscli.train.errors import CheckpointError, TrainingDiverged, TrainingInterrupted
from nyscli.train.metrics import METRICS_FILE, BatchResult, MetricsLog, Running
from nyscli.train.optim import build_optimizer
from nyscli.train.resources import release_free_heap
from nyscli.train.resume import resume_command
from nyscli.train.schedule import build_scheduler, warmup_decay_factor
from nyscli.train.seed import rng_state, set_rng_state
from nyscli.train.splits import DEV, TEST, TRAIN

log = logging.getLogger(__name__)

Objective = Callable[[nn.Module, Any], BatchResult]
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
HEAP_TRIM_EVERY = 10  # CPU updates between heap trims (see release_free_heap)
# Updates left out of the reported training throughput: the first ones pay for allocator
# growth, thread-pool start and kernel caches (a 30-step run read 2,471 tokens/s after its
# first steps and 7,091 at its end). A tenth of the run, at most this many.
THROUGHPUT_WARMUP = 10


def throughput_warmup(max_steps: int) -> int:
    """Updates at the start of a ``max_steps`` run that tokens/s does not count."""
    return min(THROUGHPUT_WARMUP, max_steps // 10)


@dataclass
class FitResult:
    """Where training ended. ``completed`` is False when ``stop_at_step`` or
    ``stop_after_minutes`` cut it short."""

    step: int
    completed: bool
    best_value: float | None
    best_step: int | None
    train_seconds: float
    train_tokens: int
    # Seconds and tokens of the updates after throughput_warmup(max_steps): tokens_per_s.
    steady_seconds: float = 0.0
    steady_tokens: int = 0

    @property
    def tokens_per_s(self) -> float:
        """Training tokens per second after the warm-up updates (all updates if none)."""
        if self.steady_seconds > 0:
            return self.steady_tokens / self.steady_seconds
        return self.train_tokens / self.train_seconds if self.train_seconds > 0 else math.nan


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Within the block Ctrl-C and SIGTERM wait until it ends (main thread only), so writing a
    checkpoint and recording it as the last good one happen together: the interruption line
    never names an older step than the file on disk holds."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        held.append(signum)

    previous = {s: signal.signal(s, hold) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if held:
        raise Terminated() if held[0] == signal.SIGTERM else KeyboardInterrupt()


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor inside nested tuples/lists/dicts to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, tuple | list):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


class Trainer:
    """Train ``model`` with ``objective``; files go to ``run_dir`` (metrics.csv, checkpoints/)."""

    def __init__(
        self,
        model: nn.Module,
        objective: Objective,
        config: TrainerConfig,
        run_dir: Path,
        device: torch.device | str = "cpu",
        metric_names: tuple[str, ...] = ("accuracy",),
        console: Console | None = None,
        architecture: dict[str, Any] | None = None,
    ) -> None:
        """``architecture``: the settings that shaped ``model``'s weights, recorded in each
        checkpoint (:func:`nyscli.train.resume.architecture`)."""
        self.architecture = architecture
        self.device = torch.device(device)
        if config.precision == "fp16" and self.device.type != "cuda":
            raise UserInputError(
                "trainer.precision=fp16 needs a CUDA device; use bf16 or fp32 on CPU"
            )
        self.model = model.to(self.device)
        # Several ranks (torch.distributed): training steps go through DistributedDataParallel
        # (rank 0's weights everywhere, gradients averaged in backward); evaluation, checkpoints
        # and the optimizer use the model itself. Metrics are summed across ranks; rank 0 alone
        # writes metrics.csv and checkpoints.
        self.main = distributed.is_main()
        self.parallel = distributed.data_parallel(self.model)
        # Training steps only: a compiled module's state dict would prefix every key, and
        # evaluation batches of other shapes would compile again.
        self.forward = torch.compile(self.parallel) if config.compile else self.parallel
        self.objective = objective
        self.config = config
        self.run_dir = Path(run_dir)
        self.console = console
        self.optimizer = build_optimizer(
            model, config.lr, config.weight_decay, (config.beta1, config.beta2), config.eps
        )
        self.scheduler = build_scheduler(
            self.optimizer, config.warmup_steps, config.max_steps, config.decay, config.min_lr_ratio
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=config.precision == "fp16")
        self.metrics = MetricsLog(self.run_dir / METRICS_FILE, metric_names, write=self.main)
        self.checkpoints = self.run_dir / CHECKPOINT_DIR
        self.step = 0
        self.best_value: float | None = None
        self.best_step: int | None = None
        self.window = Running()  # train batches since the last train row
        self.train_seconds = 0.0
        self.train_tokens = 0
        self.steady_seconds = 0.0  # after throughput_warmup: what tokens/s reports
        self.steady_tokens = 0
        self._unsaved_best: dict[str, Any] | None = None  # best.pt's content until _save_last
        self._live: Progress | None = None  # fit's progress display: evaluations add a bar
        self.last_good: tuple[Path, int] | None = None
        self.train_batches: ShuffledBatches | None = None

    # ------------------------------------------------------------------ public API

    def fit(
        self, train: ShuffledBatches, dev: Iterable[Any], resume_from: Path | None = None
    ) -> FitResult:
        """Train up to ``max_steps`` updates (or ``stop_at_step``, or ``stop_after_minutes``),
        evaluating on ``dev``.

        ``resume_from``: a ``last.pt`` checkpoint; model, optimizer, schedule, scaler, RNGs,
        data position and best-so-far continue from it and its metrics rows are carried over.
        """
        cfg = self.config
        self.train_batches = train
        source = None
        if resume_from is not None:
            resume_from = Path(resume_from)
            self._restore(load_checkpoint(resume_from, self.device), train)
            self._apply_settings()
            self._adopt_best(resume_from.parent / BEST)
            self.last_good = (resume_from, self.step)
            source = resume_from.parent.parent / METRICS_FILE
            log.info("resumed from %s at step %d", resume_from, self.step)
        self.metrics.start(keep_until=self.step, source=source)
        batches = iter(train)
        stop = min(cfg.max_steps, cfg.stop_at_step or cfg.max_steps)
        deadline = None
        if cfg.stop_after_minutes is not None:
            deadline = time.monotonic() + 60.0 * cfg.stop_after_minutes
        out_of_time = False
        # The bar shows only on a terminal; the log hears the step every HEARTBEAT_S seconds.
        steps = f"train: step {{}}/{cfg.max_steps}"
        with (
            self._interruptible(),
            self._progress() as progress,
            heartbeat(log, steps.format(self.step)) as beat,
        ):
            self._live = progress
            bar = progress.add_task("train", total=cfg.max_steps, completed=self.step, status="")
            while self.step < stop and not out_of_time:
                lost = unreported()  # a SIGTERM whose exception a callback swallowed
                if lost is not None:
                    raise lost
                lr = self._update(batches)
                if self.step % cfg.log_every == 0:
                    self._log_train(lr)
                status = ""
                evaluated = self.step % cfg.eval_every == 0 or self.step == cfg.max_steps
                if evaluated:
                    status = self._evaluate_dev(dev)
                out_of_time = deadline is not None and time.monotonic() >= deadline
                if self.step % cfg.save_every == 0 or self.step == stop or out_of_time:
                    self._save_last()
                if status:
                    progress.update(bar, status=status)
                progress.update(bar, completed=self.step)
                beat.say(steps.format(self.step))
        self._live = None
        return FitResult(
            self.step,
            self.step >= cfg.max_steps,
            self.best_value,
            self.best_step,
            self.train_seconds,
            self.train_tokens,
            self.steady_seconds,
            self.steady_tokens,
        )

    @contextlib.contextmanager
    def _interruptible(self) -> Iterator[None]:
        """Ctrl-C or SIGTERM inside the block becomes :class:`TrainingInterrupted` (one line)."""
        try:
            with sigterm_raises():
                yield
        except KeyboardInterrupt as interrupt:
            raise self._interrupted(interrupt) from None

    def _interrupted(self, interrupt: KeyboardInterrupt) -> TrainingInterrupted:
        """The one line for Ctrl-C/SIGTERM: where training stood and how to continue."""
        signum = signal.SIGTERM if isinstance(interrupt, Terminated) else signal.SIGINT
        reported(interrupt)  # the TrainingInterrupted below is its line
        if self.last_good is None:
            kept, resume = "no checkpoint was written yet", None
        else:
            kept = f"last checkpoint {self.last_good[0]} (step {self.last_good[1]})"
            resume = resume_command(self.run_dir)
        return TrainingInterrupted(f"interrupted at step {self.step}; {kept}", 128 + signum, resume)

    @torch.no_grad()
    def evaluate(self, batches: Iterable[Any], name: str = "evaluate") -> dict[str, float]:
        """Average loss and metrics of the model over ``batches`` (eval mode, autocast), with
        a progress bar called ``name``.

        With several ranks each evaluates every world-size-th batch and the sums are added up:
        all ranks get the same numbers, computed on every batch exactly once.
        """
        self.model.eval()
        running = Running()
        start = time.perf_counter()
        rank, size = distributed.rank(), distributed.world_size()
        # Interruptible on its own too: the final dev and test evaluations run after fit, and
        # their Ctrl-C must also leave error.txt and the resume line (the checkpoint is there).
        with self._interruptible(), self._eval_bar(name, batches) as advance:
            for i, batch in enumerate(batches):
                advance()
                if i % size != rank:
                    continue
                with self._autocast():
                    result = self.objective(self.model, to_device(batch, self.device))
                running.add(result, float(result.loss))
        running.seconds = time.perf_counter() - start
        self.model.train()
        return distributed.reduce_running(running).summary()

    def test(self, batches: Iterable[Any]) -> dict[str, float]:
        """Evaluate the best-dev checkpoint (the current model if none) and log a test row."""
        distributed.barrier()  # rank 0 has written best.pt
        load_best(self.model, self.checkpoints, self.device)
        summary = self.evaluate(batches, TEST)
        summary.pop("tokens_per_s", None)  # eval speed is not training throughput
        self.metrics.append(self.step, TEST, summary)
        return summary

    # ------------------------------------------------------------------ one update

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.config.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=AMP_DTYPES[self.config.precision])

    def _update(self, batches: Iterator[Any]) -> float:
        """One optimizer update over ``accumulate`` micro-batches; returns the lr it used."""
        cfg = self.config
        start = time.perf_counter()
        lr = self.scheduler.get_last_lr()[0]
        tokens = 0
        bad_loss = None
        for micro in range(cfg.accumulate):
            batch = to_device(next(batches), self.device)
            # DDP averages the gradients in the last micro-batch's backward only.
            with distributed.no_sync(self.parallel, micro == cfg.accumulate - 1):
                with self._autocast():
                    result = self.objective(self.forward, batch)
                loss = float(result.loss.detach())
                # Every rank runs every backward, even after a bad loss: the last one is a
                # collective, and the update is dropped below anyway.
                self.scaler.scale(result.loss / cfg.accumulate).backward()
            if not math.isfinite(loss):
                bad_loss = loss if bad_loss is None else bad_loss
                continue
            self.window.add(result, loss)
            tokens += result.tokens
        # Every rank learns whether any rank diverged, and the update's global token count.
        diverged, tokens = distributed.sum_across_ranks([float(bad_loss is not None), tokens])
        if diverged:
            raise self._diverged(f"loss became {bad_loss or 'non-finite on another rank'}", lr)
        if cfg.clip_grad_norm is not None:
            self.scaler.unscale_(self.optimizer)
            norm = float(nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip_grad_norm))
            # With fp16 an inf norm is the GradScaler's business (it skips the step).
            if not math.isfinite(norm) and not self.scaler.is_enabled():
                raise self._diverged(f"gradient norm became {norm}", lr)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        if self.device.type == "cpu" and self.step % HEAP_TRIM_EVERY == 0:
            release_free_heap()
        seconds = time.perf_counter() - start
        self.window.seconds += seconds
        self.train_seconds += seconds
        self.train_tokens += round(tokens)
        if self.step > throughput_warmup(cfg.max_steps):
            self.steady_seconds += seconds
            self.steady_tokens += round(tokens)
        return lr

    def _tokens_per_s(self) -> float:
        """Training throughput so far, after the warm-up updates (all of them before that)."""
        if self.steady_seconds > 0:
            return self.steady_tokens / self.steady_seconds
        return self.train_tokens / max(self.train_seconds, 1e-9)

    def _diverged(self, what: str, lr: float | None, step: int | None = None) -> TrainingDiverged:
        """The one line for a non-finite loss at ``step`` (default: the update being made)."""
        if self.last_good is None:
            kept = "no checkpoint had been written yet"
        else:
            kept = f"last finite checkpoint: {self.last_good[0]} (step {self.last_good[1]})"
        step = self.step + 1 if step is None else step
        at = f"at step {step}" if lr is None else f"at step {step} (lr {lr:.3g})"
        remedies = ["lower trainer.lr"]
        if self.config.clip_grad_norm is None:
            remedies.append("add trainer.clip_grad_norm")
        if self.config.precision != "fp32":
            remedies.append("use trainer.precision=fp32")
        return TrainingDiverged(f"{what} {at}; training stopped, {kept}; {' or '.join(remedies)}")

    # ------------------------------------------------------------------ logging, eval

    def _log_train(self, lr: float) -> None:
        summary = distributed.reduce_running(self.window).summary()
        self.metrics.append(
            self.step, TRAIN, {**summary, "lr": lr, "elapsed_s": self.train_seconds}
        )
        self.window = Running()

    def _evaluate_dev(self, dev: Iterable[Any]) -> str:
        summary = self.evaluate(dev, DEV)
        summary.pop("tokens_per_s", None)  # eval speed is not training throughput
        self.metrics.append(self.step, DEV, {**summary, "elapsed_s": self.train_seconds})
        value = summary.get(self.config.monitor, summary["loss"])
        # NaN logits still give an accuracy (argmax picks some class): the loss decides.
        bad = [k for k in ("loss", self.config.monitor) if not math.isfinite(summary.get(k, 0.0))]
        if bad:
            raise self._diverged(f"dev {bad[0]} became {summary[bad[0]]}", None, self.step)
        if self._improves(value):
            self.best_value, self.best_step = value, self.step
            if self.main:  # best.pt is written with the next last.pt (_save_last)
                weights = {
                    k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()
                }
                self._unsaved_best = {"model": weights, "step": self.step, "value": value}
        best = math.nan if self.best_value is None else self.best_value
        monitor = self.config.monitor
        if is_rate(monitor):  # accuracy and F1 read as percentages everywhere
            text = f"dev {monitor} {100 * value:.2f}% (best {100 * best:.2f}%)"
        else:
            text = f"dev {monitor} {value:.4f} (best {best:.4f})"
        log.info(
            "step %d: dev loss %.4f, %s, %.0f train tokens/s",
            self.step,
            summary["loss"],
            text,
            self._tokens_per_s(),
        )
        return text

    def _improves(self, value: float) -> bool:
        if self.best_value is None:
            return True
        if self.config.monitor_mode == "max":
            return value > self.best_value
        return value < self.best_value

    # ------------------------------------------------------------------ checkpoints

    def _save_last(self) -> None:
        # An update can turn the weights non-finite while its own loss was still finite:
        # such weights never replace the last finite checkpoint.
        if not all(bool(torch.isfinite(p).all()) for p in self.model.parameters()):
            raise self._diverged("the weights became non-finite", None, self.step)
        # The window's sums over all ranks go into the checkpoint; on resume rank 0 takes them.
        window = distributed.reduce_running(self.window)
        if not self.main:
            self.last_good = (self.checkpoints / LAST, self.step)
            return
        with _signals_held():
            # The best weights since the last save go first, so best.pt is never newer than
            # last.pt (a resume from last.pt then finds the best it names). Keeping them in
            # memory until now lets a short run evaluate often without writing its weights
            # (and the optimizer's) to disk at every evaluation.
            if self._unsaved_best is not None:
                save_checkpoint(self._unsaved_best, self.checkpoints / BEST)
                self._unsaved_best = None
            path = save_checkpoint(
                {
                    "step": self.step,
                    "model": self.model.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(),
                    "scaler": self.scaler.state_dict(),
                    "rng": rng_state(),
                    "loader": self.train_batches.state_dict() if self.train_batches else None,
                    "best_value": self.best_value,
                    "best_step": self.best_step,
                    "window": window.state_dict(),
                    "train_seconds": self.train_seconds,
                    "train_tokens": self.train_tokens,
                    "steady_seconds": self.steady_seconds,
                    "steady_tokens": self.steady_tokens,
                    "architecture": self.architecture,
                },
                self.checkpoints / LAST,
            )
            self.last_good = (path, self.step)
            # With the checkpoint, so a resume never finds steps logged that it redoes.
            self.metrics.checkpointed(self.step)

    def _restore(self, state: dict[str, Any], train: ShuffledBatches) -> None:
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as error:
            first = str(error).strip().splitlines()[0][:160]
            first = shape_mismatch(self.model, state.get("model", {})) or first
            raise CheckpointError(
                f"checkpoint does not fit this model/optimizer ({first}); resume with the "
                "same model, task and attention settings"
            ) from None
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        same_seed = state["loader"] is None or int(state["loader"]["seed"]) == train.seed
        if same_seed:  # a changed seed (resume_changes=allow) draws from its own stream
            set_rng_state(state["rng"])
        if state["loader"] is not None:
            train.load_state_dict(state["loader"])
        self.step = int(state["step"])
        self.best_value, self.best_step = state["best_value"], state["best_step"]
        self.window = Running.from_state(state["window"]) if self.main else Running()
        self.train_seconds = float(state["train_seconds"])
        self.train_tokens = int(state["train_tokens"])
        # Checkpoints written before steady throughput was kept count every update.
        self.steady_seconds = float(state.get("steady_seconds", self.train_seconds))
        self.steady_tokens = int(state.get("steady_tokens", self.train_tokens))

    def _apply_settings(self) -> None:
        """This run's optimizer settings and schedule over the ones the checkpoint restored.

        The optimizer's and scheduler's state dicts carry lr, betas, eps and weight decay of
        the run that wrote them; a resumed run trains with its own (recorded) config. Without
        changes this sets the same values again.
        """
        cfg = self.config
        factor = warmup_decay_factor(
            self.step, cfg.warmup_steps, cfg.max_steps, cfg.decay, cfg.min_lr_ratio
        )
        decay_group = self.optimizer.param_groups[0]  # build_optimizer: [decay, no decay]
        decay_group["weight_decay"] = cfg.weight_decay
        for group in self.optimizer.param_groups:
            group.update(betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, initial_lr=cfg.lr)
            group["lr"] = cfg.lr * factor
        self.scheduler.base_lrs = [cfg.lr] * len(self.optimizer.param_groups)
        self.scheduler._last_lr = [g["lr"] for g in self.optimizer.param_groups]  # noqa: SLF001

    def _adopt_best(self, source: Path) -> None:
        """Copy the interrupted run's best.pt here, so ``test`` uses the same best weights."""
        if self.best_step is None or not source.exists():
            return
        if load_checkpoint(source)["step"] != self.best_step:
            log.warning("%s is not the best checkpoint the resumed state names; ignored", source)
            self.best_value = self.best_step = None
            return
        target = self.checkpoints / BEST
        if self.main and source.resolve() != target.resolve():  # a sweep's job resumes in place
            self.checkpoints.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)

    def _progress(self, transient: bool = False) -> Progress:
        return Progress(
            TextColumn("[bold]{task.description}[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[status]}"),
            console=self.console,
            disable=not self.config.progress or not self.main,
            transient=transient,
        )

    @contextlib.contextmanager
    def _eval_bar(self, name: str, batches: Iterable[Any]) -> Iterator[Callable[[], None]]:
        """A bar for one evaluation, ``advance()`` per batch: below training's bar during
        fit (rich allows one live display), on its own before or after it; gone when done."""
        total = len(batches) if hasattr(batches, "__len__") else None  # type: ignore[arg-type]
        done = 0

        def tell(advance: Callable[[], None]) -> Callable[[], None]:
            def step() -> None:  # the log hears how far it got (a non-terminal has no bar)
                nonlocal done
                done += 1
                advance()
                beat.say(f"evaluating {name}: batch {done}/{total or '?'}")

            return step

        live = self._live
        with heartbeat(log, f"evaluating {name}") as beat:
            if live is not None and (live.disable or live.live.is_started):  # fit still running
                task = live.add_task(name, total=total, status="")
                try:
                    yield tell(lambda: live.advance(task))
                finally:
                    live.remove_task(task)
                return
            with self._progress(transient=True) as progress:
                task = progress.add_task(name, total=total, status="")
                yield tell(lambda: progress.advance(task))

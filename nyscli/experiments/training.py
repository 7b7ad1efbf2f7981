"""What every training command (lra, pretrain, finetune) checks and does before it trains."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from nyscli.attention import AttentionConfigError, MultiHeadAttention
from nyscli.bridge import OUTPUT_ROOT
from nyscli.errors import UserInputError
from nyscli.experiments import schema
from nyscli.train import TrainerConfig, distributed, resolve_device, seed_everything
from nyscli.train.resume import find_resume_checkpoint


def check_device(cfg: DictConfig, trainer: TrainerConfig) -> torch.device:
    """The device ``cfg.device`` names; fp16 without CUDA is a one-line error."""
    device = resolve_device(str(cfg.device))
    if trainer.precision == "fp16" and device.type != "cuda":
        raise UserInputError("trainer.precision=fp16 needs CUDA; use bf16 or fp32 on CPU")
    return device


def check_values(cfg: DictConfig, rules: Mapping[str, schema.Rule]) -> None:
    """``rules``, then the shared training keys (seed, threads, model.*, trainer.*) that
    ``rules`` does not redefine."""
    schema.check(cfg, rules)  # first: a task key names what the user set, not its echo
    schema.check(cfg, {k: r for k, r in schema.TRAINING.items() if k not in rules})


def check_attention(cfg: DictConfig) -> None:
    """Build one attention module of the configured width, so a bad value fails in one line."""
    schema.check_attentions([("attention", cfg.attention)])
    try:
        MultiHeadAttention(
            cfg.model.dim,
            cfg.model.num_heads,
            OmegaConf.to_container(cfg.attention, resolve=True),
        )
    except AttentionConfigError as error:
        raise UserInputError(str(error)) from error


def start_run(
    cfg: DictConfig, command: str, run_dir: Path, same_setup: Callable[[DictConfig], bool]
) -> tuple[torch.device, Path | None]:
    """Threads, device, the checkpoint to resume from (``cfg.resume``) and the seed.

    Returns (device, last.pt of the run to continue or None).
    """
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    device = resolve_device(str(cfg.device))
    resume_from = find_resume_checkpoint(
        cfg.resume, Path(OUTPUT_ROOT) / command, run_dir, same_setup
    )
    seed_everything(int(cfg.seed))
    return device, resume_from


def run_context(
    cfg: DictConfig, trainer: TrainerConfig, device: torch.device, resume_from: Path | None
) -> dict[str, Any]:
    """The results-row fields that say how a training run ran (ranks, precision, device...)."""
    return {
        "world_size": distributed.world_size(),
        "precision": trainer.precision,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "seed": int(cfg.seed),
        "resumed_from": str(resume_from) if resume_from else None,
    }

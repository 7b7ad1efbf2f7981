#!/usr/bin/env python3
"""nys's LRA model beside the Nyströmformer authors' own LRA code, same model, same batches.

    git clone https://github.com/mlpen/Nystromformer /tmp/peer     # once, online; not ours
    .venv/bin/python scripts/peer_lra.py --peer /tmp/peer/LRA/code --attention nystrom
    .venv/bin/python scripts/peer_lra.py --peer ... --attention softmax --train-steps 200

Nothing of the peer's code is in this repository: it is imported from ``--peer`` at run time.
Both models are built from the peer's own ``lra_config.py`` for ``--task`` (2 layers, width 64,
2 heads of 32, FFN 128, dropout 0.1, mean pooling; Nyström-64 with conv skip 35, or softmax
with the peer's gradient checkpointing and attention dropout as its config sets them), at the
length the peer's code runs (``max_seq_len`` rounded up to a power of two: 2,048 for ListOps;
its Nyström needs a length that ``num_landmarks`` divides). Each side's own optimizer: the
peer's ``torch.optim.AdamW`` (its run_tasks.py), nys's fused AdamW.

Speed: one training step of each on the same random batch of 32 full-length sequences, in
turn, ``--rounds`` times; the median, as training tokens/s. ``--train-steps K``: both train K
steps on the same batches (generated ListOps, the release generator's settings, lengths up to
the run's length; or Image: grey CIFAR-10 from ``--image-data``, else the Fashion-MNIST
substitute) with the same linear warm-up/decay schedule, then both are scored on the same
seeded sample of ``--eval-examples`` dev examples, with its binomial standard error, beside
the majority class. ``--seed`` sets the weights, the data order, the dev sample and the
dropout stream; run several to see the noise between seeds. ``--sides nys`` (or ``peer``)
trains one side only: each side's run depends on the seed alone, not on the other side.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from nyscli.data.common import TaskData
from nyscli.models.classifier import build_classifier
from nyscli.train.optim import build_optimizer
from nyscli.train.schedule import warmup_decay_factor

BATCH = 32
PEER = "peer (mlpen LRA/code)"
SIDES = {PEER: "peer", "nys": "nys"}  # --sides names
ATTENTIONS = {"nystrom": "nystrom-64", "softmax": "softmax"}


def peer_model(peer: Path, task: str, attention: str) -> tuple[nn.Module, dict]:
    """The peer's ModelForSC and its config (as its run_tasks.py builds them, on the CPU)."""
    sys.path.insert(0, str(peer))
    config_module = importlib.import_module("lra_config")
    wrapper = importlib.import_module("model_wrapper")
    task_config = config_module.config[task]
    config = copy.deepcopy(task_config["model"])
    config.update(task_config["extra_attn_config"][ATTENTIONS[attention]])
    config["mixed_precision"] = False  # its autocast is CUDA's; fp32 like ours
    config["attn_type"] = ATTENTIONS[attention]
    config["max_seq_len"] = int(2 ** math.ceil(math.log2(config["max_seq_len"])))
    config["seq_len"] = config["max_seq_len"]
    model = wrapper.ModelForSC(config)
    config["weight_decay"] = task_config["training"]["weight_decay"]  # its run_tasks.py's AdamW
    return model, config


def nys_model(
    config: dict, attention: str, init: str = "torch", attention_dropout: bool = True
) -> nn.Module:
    """nys's classifier with the peer config's sizes; ``init`` torch starts its Linear layers
    as the peer's (PyTorch's default, never re-initialised), normal as BERT (N(0, 0.02));
    softmax drops the config's ``attention_dropout`` of its probabilities, as the peer's does,
    unless ``attention_dropout`` is False (the peer's Nyström has no attention dropout)."""
    spec = {"name": "softmax", "dropout": config["attention_dropout"] if attention_dropout else 0}
    if attention == "nystrom":
        spec = {
            "name": "nystrom",
            "num_landmarks": config["num_landmarks"],
            "conv_kernel_size": config["conv_kernel_size"],
        }
    model = {
        "dim": config["transformer_dim"],
        "depth": config["num_layers"],
        "num_heads": config["num_head"],
        "ffn_dim": config["transformer_hidden_dim"],
        "dropout": config["dropout_prob"],
        "pooling": config["pooling_mode"].lower(),
        "init": init,
    }
    return build_classifier(
        vocab_size=config["vocab_size"],
        max_len=config["max_seq_len"],
        num_classes=config["num_classes"],
        model=model,
        attention=spec,
    )


Step = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], float]


def peer_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> Step:
    def step(ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> float:
        loss = model(input_ids_0=ids, mask_0=mask.float(), label=labels)["loss"].mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return float(loss.detach())

    return step


def nys_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> Step:
    def step(ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> float:
        loss = nn.functional.cross_entropy(model(ids, mask), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


class Side:
    """One side of the comparison: its model, optimizer and training step."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, step: Step) -> None:
        self.model, self.optimizer, self.step = model, optimizer, step


def build(opts: argparse.Namespace, lr: float) -> tuple[dict[str, Side], dict]:
    torch.manual_seed(opts.seed)  # both models' initial weights
    peer, config = peer_model(opts.peer, opts.task, opts.attention)
    ours = nys_model(config, opts.attention, opts.nys_init, not opts.nys_no_attention_dropout)
    decay = config["weight_decay"]  # 0 in every LRA task (AdamW's own default is 0.01)
    peer_opt = torch.optim.AdamW(
        peer.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=decay
    )
    ours_opt = build_optimizer(ours, lr, weight_decay=decay, eps=1e-6)
    sides = {
        PEER: Side(peer, peer_opt, peer_step(peer, peer_opt)),
        "nys": Side(ours, ours_opt, nys_step(ours, ours_opt)),
    }
    # Both are built either way, peer first, so each side's weights are the same for a seed.
    sides = {name: side for name, side in sides.items() if opts.sides in ("both", SIDES[name])}
    for name, side in sides.items():
        print(f"{name}: {sum(p.numel() for p in side.model.parameters()):,} parameters")
    return sides, config


def speed(opts: argparse.Namespace) -> None:
    sides, config = build(opts, 1e-4)
    steps = {name: side.step for name, side in sides.items()}
    n = config["max_seq_len"]
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, config["vocab_size"] - 1, (BATCH, n), generator=gen)
    mask = torch.ones(BATCH, n, dtype=torch.bool)
    labels = torch.randint(0, config["num_classes"], (BATCH,), generator=gen)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for step in steps.values():
        step(ids, mask, labels)  # warm-up
    for _ in range(opts.rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            step(ids, mask, labels)
            times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(
        f"{opts.task} n={n}, {opts.attention}, batch {BATCH}, {torch.get_num_threads()} "
        f"threads, median of {opts.rounds} interleaved steps:"
    )
    for name, seconds in med.items():
        print(f"  {name:24s} {1000 * seconds:7.0f} ms  {BATCH * n / seconds:10,.0f} tokens/s")
    print(f"  nys / peer tokens/s: {med[PEER] / med['nys']:.2f}x")


def task_data(task: str, n: int, count: int, seed: int, image_data: Path | None) -> TaskData:
    """The task's data at length n: generated ListOps (the release generator's settings,
    lengths 500-2000, padded to n), or grey 32 x 32 images: CIFAR-10 from ``image_data``, else
    the Fashion-MNIST substitute the ``nys lra`` Image task falls back to."""
    if task == "image":
        from nyscli.data.image import load_cifar10, load_fashion_mnist

        return load_cifar10(image_data) if image_data else load_fashion_mnist()
    from nyscli.data.listops import ListOpsConfig, load_listops

    cfg = ListOpsConfig(n_train=count * BATCH, n_val=2000, n_test=BATCH, seed=seed)
    cache = Path.home() / ".cache" / "nyscli" / "data"
    return load_listops(cache_dir=cache, config=cfg, max_len=n, pad_to_max_len=True)


def batches(opts: argparse.Namespace, n: int) -> tuple[list, list]:
    """``--train-steps`` training batches (a seeded order of the train split) and a seeded
    sample of ``--eval-examples`` from the dev split, both collated at length n."""
    data = task_data(opts.task, n, opts.train_steps, opts.seed, opts.image_data)
    gen = torch.Generator().manual_seed(opts.seed)
    order = torch.randperm(len(data.train), generator=gen).tolist()
    if len(order) < opts.train_steps * BATCH:
        sys.exit(f"--train-steps {opts.train_steps}: the train split has {len(order)} examples")
    train = [
        data.collate([data.train[i] for i in order[k : k + BATCH]])
        for k in range(0, opts.train_steps * BATCH, BATCH)
    ]
    count = min(opts.eval_examples, len(data.val))
    sample = torch.randperm(len(data.val), generator=gen)[:count].tolist()
    dev = [
        data.collate([data.val[i] for i in sample[k : k + BATCH]]) for k in range(0, count, BATCH)
    ]
    return train, dev


@torch.no_grad()
def accuracy(name: str, model: nn.Module, dev: list) -> float:
    model.eval()
    right = 0
    for ids, mask, labels in dev:
        if name == "nys":
            logits = model(ids, mask)
        else:
            logits = model.seq_classifer(model.model(ids, mask.float()))  # its own forward
        right += int((logits.argmax(-1) == labels).sum())
    model.train()
    return right / sum(len(b[2]) for b in dev)


def train(opts: argparse.Namespace) -> None:
    lr, warmup = 1e-3, max(1, opts.train_steps // 10)
    sides, config = build(opts, lr)
    train_batches, dev = batches(opts, config["max_seq_len"])
    labels = torch.cat([b[2] for b in dev])
    majority = labels.bincount().max().item() / len(labels)
    print(
        f"{opts.task}, seed {opts.seed}: {opts.train_steps} steps of batch {BATCH}, lr {lr} "
        f"(linear warm-up {warmup}, linear decay), dev sample of {len(labels)}"
    )
    for name, side in sides.items():
        torch.manual_seed(opts.seed + 1)  # the same dropout stream start for both
        start, losses = time.perf_counter(), []
        for k, (ids, mask, labels_k) in enumerate(train_batches):
            for group in side.optimizer.param_groups:
                group["lr"] = lr * warmup_decay_factor(k, warmup, opts.train_steps, "linear", 0.0)
            losses.append(side.step(ids, mask, labels_k))
            if not math.isfinite(losses[-1]):
                sys.exit(f"{name}: loss {losses[-1]} at step {k + 1}")
        seconds = time.perf_counter() - start
        right = accuracy(name, side.model, dev)
        error = math.sqrt(right * (1 - right) / len(labels))  # binomial standard error
        print(
            f"{name}: {opts.train_steps} steps in {seconds:.0f} s, last-50 loss "
            f"{statistics.mean(losses[-50:]):.3f}, dev accuracy {100 * right:.1f}% "
            f"± {100 * error:.1f} (majority {100 * majority:.1f}%)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peer", type=Path, required=True, help="the peer clone's LRA/code")
    parser.add_argument("--task", default="listops", choices=["listops", "text", "image"])
    parser.add_argument("--attention", default="nystrom", choices=sorted(ATTENTIONS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--train-steps", type=int, default=0)
    parser.add_argument("--eval-examples", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0, help="data order, dev sample, dropout")
    parser.add_argument(
        "--image-data", type=Path, default=None, help="CIFAR-10 python folder (else Fashion-MNIST)"
    )
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument(
        "--nys-init", default="torch", choices=["torch", "normal"], help="nys's model.init"
    )
    parser.add_argument(
        "--nys-no-attention-dropout",
        action="store_true",
        help="nys's softmax without the config's attention dropout (as before 2026-11-26)",
    )
    parser.add_argument(
        "--sides", default="both", choices=["both", "nys", "peer"], help="train only one side"
    )
    opts = parser.parse_args()
    if not (opts.peer / "model_wrapper.py").is_file():
        parser.error(f"--peer {opts.peer}: no model_wrapper.py there (give the clone's LRA/code)")
    for flag, value, low in (
        ("--train-steps", opts.train_steps, 0),
        ("--eval-examples", opts.eval_examples, 1),
        ("--seed", opts.seed, 0),
        ("--rounds", opts.rounds, 1),
        ("--threads", 1 if opts.threads is None else opts.threads, 1),
    ):
        if value < low:
            parser.error(f"{flag} {value}: give a whole number >= {low}")
    if opts.threads:
        torch.set_num_threads(opts.threads)
    if opts.train_steps and opts.task == "text":
        parser.error("--train-steps trains on ListOps or Image; Text is timed only")
    if opts.sides != "both" and not opts.skip_speed:
        parser.error("--sides: the speed comparison needs both; add --skip-speed")
    if not opts.skip_speed:
        speed(opts)
    if opts.train_steps:
        train(opts)


if __name__ == "__main__":
    main()

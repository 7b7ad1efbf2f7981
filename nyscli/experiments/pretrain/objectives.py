"""BERT pre-training objectives: masked language model (MLM) and sentence order (SOP), and
hidden-state distillation for continuing a checkpoint with another attention.

* MLM (Devlin et al.): each real, non-special token is selected with probability 15%; a
  selected token becomes ``[MASK]`` with probability 80%, a random non-special token with 10%,
  and stays itself with 10%. The loss (and accuracy) is over selected tokens only; labels are
  ``IGNORE`` (-100) everywhere else.
* SOP (ALBERT): an example is two consecutive segments A, B of one document laid out as
  ``[CLS] A [SEP] B [SEP]`` (segment ids 0 up to the first [SEP], 1 after); in half of the
  examples (a fair coin each) the two are swapped, label 1 = swapped.
* Distillation: the model (a checkpoint given another attention) learns to give every block's
  output of the same checkpoint with its own softmax attention (the frozen teacher) on the
  unmasked pairs; no head is involved, so a checkpoint without an MLM head needs no warm-up.

The random draws of a batch come from a ``torch.Generator`` when one is given (validation:
the batches are drawn once, so every evaluation sees the same masks), else from torch's
global RNG (training: the trainer saves and restores it, so a resumed run masks the same).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset

from nyscli.data.common import pad_batch
from nyscli.data.subsets import subset_indices
from nyscli.tokenizers.tokenizer import WordPieceTokenizer
from nyscli.train.metrics import BatchResult

IGNORE = -100
METRICS = ("mlm_loss", "mlm_accuracy", "sop_loss", "sop_accuracy")
DISTILL_METRICS = ("distill_loss",)
Batch = dict[str, Tensor]


def mask_tokens(
    ids: Tensor,
    candidates: Tensor,
    mask_id: int,
    replacements: Tensor,
    probability: float = 0.15,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """BERT's 80/10/10 masking.

    ids: (B, n) int64; candidates: (B, n) bool, the tokens that may be selected (real and
    not special); replacements: (R,) int64 ids a "random token" is drawn from.
    Returns inputs (B, n) with the replacements made and labels (B, n): the original id at
    selected positions, ``IGNORE`` elsewhere.
    """
    selected = (torch.rand(ids.shape, generator=generator) < probability) & candidates
    draw = torch.rand(ids.shape, generator=generator)
    pick = torch.randint(len(replacements), ids.shape, generator=generator)
    inputs = torch.where(selected & (draw < 0.8), mask_id, ids)
    inputs = torch.where(selected & (draw >= 0.8) & (draw < 0.9), replacements[pick], inputs)
    return inputs, torch.where(selected, ids, IGNORE)


def layout_pair(first: Tensor, second: Tensor, cls_id: int, sep_id: int) -> tuple[Tensor, Tensor]:
    """``[CLS] first [SEP] second [SEP]`` (L,) and its segment ids (L,): 0 ... 0 1 ... 1."""
    cls, sep = first.new_tensor([cls_id]), first.new_tensor([sep_id])
    ids = torch.cat([cls, first, sep, second, sep])
    segments = torch.zeros_like(ids)
    segments[len(first) + 2 :] = 1
    return ids, segments


@dataclass(frozen=True)
class PretrainCollate:
    """[(a (n_a,), b (n_b,))] -> batch dict of (B, L) ``ids`` (masked), ``mask`` (True =
    real), ``segments``, ``labels`` (MLM targets or IGNORE) and (B,) ``sop`` (1 = swapped)."""

    cls_id: int
    sep_id: int
    mask_id: int
    pad_id: int
    special_ids: tuple[int, ...]
    vocab_size: int
    probability: float = 0.15

    @classmethod
    def for_tokenizer(cls, tokenizer: WordPieceTokenizer, probability: float) -> PretrainCollate:
        t = tokenizer
        return cls(
            t.cls_id, t.sep_id, t.mask_id, t.pad_id, t.special_ids, t.vocab_size, probability
        )

    def replacements(self) -> Tensor:
        """(R,) the non-special ids: what a "random token" may be."""
        keep = torch.ones(self.vocab_size, dtype=torch.bool)
        keep[list(self.special_ids)] = False
        return keep.nonzero().squeeze(1)

    def __call__(
        self, items: Sequence[tuple[Tensor, Tensor]], generator: torch.Generator | None = None
    ) -> Batch:
        swapped = torch.rand(len(items), generator=generator) < 0.5
        rows, segs = [], []
        for (a, b), swap in zip(items, swapped.tolist(), strict=True):
            ids, segments = layout_pair(*((b, a) if swap else (a, b)), self.cls_id, self.sep_id)
            rows.append(ids)
            segs.append(segments)
        width = max(len(r) for r in rows)
        ids, mask = pad_batch(rows, width, self.pad_id)
        segments, _ = pad_batch(segs, width, 0)
        candidates = mask & ~torch.isin(ids, torch.tensor(self.special_ids))
        inputs, labels = mask_tokens(
            ids, candidates, self.mask_id, self.replacements(), self.probability, generator
        )
        return {
            "ids": inputs,
            "mask": mask,
            "segments": segments,
            "labels": labels,
            "sop": swapped.long(),
        }


def frozen_batches(
    dataset: Dataset, batch_size: int, collate: PretrainCollate, seed: int, limit: int | None
) -> list[Batch]:
    """Validation batches drawn once (swaps and masks from a generator seeded ``seed``) over
    a seeded random sample of ``limit`` examples (all if None; the shared evaluation sample,
    :func:`~nyscli.data.subsets.subset_indices`): every evaluation sees the same."""
    index = subset_indices(len(dataset), limit).tolist()  # type: ignore[arg-type]
    generator = torch.Generator().manual_seed(seed)
    return [
        collate([dataset[i] for i in index[start : start + batch_size]], generator)
        for start in range(0, len(index), batch_size)
    ]


def pretraining_objective(model: nn.Module, batch: Batch) -> BatchResult:
    """loss = mean MLM cross-entropy over selected tokens + mean SOP cross-entropy.

    ``model(ids, mask, segments, mlm_positions=...)`` -> (mlm logits (k, V) of the k selected
    tokens, sop logits (B, 2)): :class:`nyscli.models.bert.BertForPretraining`.
    """
    labels = batch["labels"]
    picked = labels != IGNORE
    mlm_logits, sop_logits = model(
        batch["ids"], batch["mask"], batch["segments"], mlm_positions=picked
    )
    targets = labels[picked]
    n_masked = int(targets.numel())
    mlm_sum = F.cross_entropy(mlm_logits.float(), targets, reduction="sum")
    sop_sum = F.cross_entropy(sop_logits.float(), batch["sop"], reduction="sum")
    size = int(batch["sop"].shape[0])
    # A batch without a selected token (possible for tiny inputs) adds 0 MLM loss, not NaN.
    loss = mlm_sum / max(n_masked, 1) + sop_sum / size
    counts = {
        "mlm_loss": (float(mlm_sum.detach()), n_masked),
        "mlm_accuracy": (float((mlm_logits.argmax(-1) == targets).sum()), n_masked),
        "sop_loss": (float(sop_sum.detach()), size),
        "sop_accuracy": (float((sop_logits.argmax(-1) == batch["sop"]).sum()), size),
    }
    return BatchResult(loss, size, int(batch["mask"].sum()), counts)


def most_frequent_token_accuracy(batches: Iterable[Batch], token: int) -> float:
    """Share of the MLM targets in ``batches`` equal to ``token`` (the constant baseline)."""
    hits = total = 0
    for batch in batches:
        targets = batch["labels"][batch["labels"] != IGNORE]
        hits += int((targets == token).sum())
        total += int(targets.numel())
    return hits / total if total else float("nan")


def unmasked_ids(batch: Batch) -> Tensor:
    """(B, L) the pairs' token ids before MLM masking (the labels hold the replaced ones)."""
    labels = batch["labels"]
    return torch.where(labels != IGNORE, labels, batch["ids"])


@dataclass
class HiddenStateDistillation:
    """loss = mean over blocks and real tokens of the squared difference between the model's
    and the teacher's block outputs, averaged over the hidden size.

    ``model`` and ``teacher`` are :class:`~nyscli.models.bert.BlockOutputs` of one checkpoint
    (the teacher frozen, in eval mode): ids (B, L) -> (depth, B, L, dim). Both read the pairs
    unmasked. With the same attention and no dropout the loss is exactly 0.
    """

    teacher: nn.Module

    def __call__(self, model: nn.Module, batch: Batch) -> BatchResult:
        ids, mask, segments = unmasked_ids(batch), batch["mask"], batch["segments"]
        with torch.no_grad():
            target = self.teacher(ids, mask, segments)
        hidden = model(ids, mask, segments)
        depth, dim, tokens = hidden.shape[0], hidden.shape[-1], int(mask.sum())
        wide = torch.promote_types(hidden.dtype, torch.float32)  # bf16/fp16 -> fp32, fp64 stays
        squared = (hidden.to(wide) - target.to(wide)).square().sum(-1) * mask  # (depth, B, L)
        total = squared.sum() / (depth * dim)
        loss = total / max(tokens, 1)
        counts = {"distill_loss": (float(total.detach()), tokens)}
        return BatchResult(loss, int(mask.shape[0]), tokens, counts)

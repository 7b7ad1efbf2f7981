"""AdamW with the usual split: no weight decay on biases, norms and embeddings' 1-D params."""

from __future__ import annotations

from torch import nn
from torch.optim import AdamW


def build_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> AdamW:
    """AdamW over trainable parameters; 1-D tensors (biases, LayerNorm) get no weight decay."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (no_decay if param.ndim < 2 else decay).append(param)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return AdamW(groups, lr=lr, betas=betas, eps=eps)

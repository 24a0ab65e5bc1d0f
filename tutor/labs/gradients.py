"""The gradient a backward pass left on a tensor, for labs that read gradients after loss.backward()."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def grad_of(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor.grad` after a backward pass that reached `tensor`; RuntimeError when it has none
    (the lab asked for a gradient that autograd never computed)."""
    if tensor.grad is None:
        raise RuntimeError(f"no gradient on a {tuple(tensor.shape)} tensor: backward did not reach it")
    return tensor.grad

"""A small, genuine pre-norm transformer in torch, and a recorder of what autograd saves.

Imported only inside a probe's run(): this module imports torch at the top.

The block is written out op by op (as Hugging Face's modelling code is) so that each tensor the
forward pass keeps for backward can be attributed to a named region: the recorder counts unique
storages (by data pointer, so views of one buffer count once), skips parameters, and files each
under the region the forward pass was in when autograd packed it.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Self, TypedDict

import torch
import torch.nn.functional as F
from torch import nn

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
STYLES = ("gpt", "llama")
ATTENTIONS = ("eager", "sdpa")



class _ThreadState(threading.local):
    """Per thread: the region the forward pass is in, and the recorder that is listening (if any).
    Class attributes are the defaults a thread sees before it sets its own."""

    region: str = "other"
    recorder: SavedTensorRecorder | None = None


_current = _ThreadState()


@contextlib.contextmanager
def region(name: str) -> Iterator[None]:
    """Tensors autograd saves inside this block are filed under `name`."""
    previous = _current.region
    _current.region = name
    try:
        yield
    finally:
        _current.region = previous


def _note_extra(tensor: torch.Tensor, reason: str, counted_share: float = 0.0) -> None:
    """Mark a tensor's storage as one the theory does not count (or counts only `counted_share`
    of): the recorder reports its bytes beyond that share as an explained difference."""
    recorder = _current.recorder
    if recorder is not None:
        recorder.extras[tensor.untyped_storage().data_ptr()] = (reason, counted_share)


def sdpa_has_enable_gqa() -> bool:
    """Whether F.scaled_dot_product_attention takes `enable_gqa` (added in PyTorch 2.5)."""
    return torch.torch_version.TorchVersion(torch.__version__) >= "2.5"


class _GqaOption(TypedDict, total=False):
    """scaled_dot_product_attention's `enable_gqa`, passed only to a torch that has it."""

    enable_gqa: bool


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout through torch.native_dropout, the kernel F.dropout uses on GPUs: it keeps a 1-byte
    boolean mask (Korthikanti's assumption). F.dropout on a CPU would keep a mask in x's dtype."""
    if not p or not training:
        return x
    return torch.native_dropout(x, p, True)[0]


@dataclass(frozen=True)
class SavedTensor:
    """One unique storage autograd kept for backward."""

    region: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    extra: str = ""  # why PyTorch keeps it although the theory does not count it; "" if it does
    counted_share: float = 1.0  # the share of nbytes the theory counts

    @property
    def extra_bytes(self) -> int:
        """Bytes of this tensor beyond what the theory counts."""
        return round(self.nbytes * (1.0 - self.counted_share)) if self.extra else 0


class SavedTensorRecorder:
    """Context manager: sums unique non-parameter storages packed by autograd, per region."""

    def __init__(self, model: nn.Module | None = None) -> None:
        self.excluded = {p.untyped_storage().data_ptr() for p in model.parameters()} if model is not None else set()
        self.seen: dict[int, tuple[str, tuple[int, ...], str, int]] = {}
        # Every view packed per storage: (shape, stride, offset, element size), to find bytes of a
        # buffer that stay alive only because a slice of it was saved.
        self.views: dict[int, set[tuple[tuple[int, ...], tuple[int, ...], int, int]]] = {}
        self.extras: dict[int, tuple[str, float]] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr and ptr not in self.excluded:
            if ptr not in self.seen:
                self.seen[ptr] = (_current.region, tuple(tensor.shape),
                                  str(tensor.dtype).removeprefix("torch."), storage.nbytes())
            self.views.setdefault(ptr, set()).add(
                (tuple(tensor.shape), tuple(tensor.stride()), int(tensor.storage_offset()), tensor.element_size()))
        return tensor

    def _unused_bytes(self, ptr: int, nbytes: int) -> int:
        """Bytes of a saved storage that no saved view covers (alive only because of a slice)."""
        views = self.views.get(ptr, set())
        sizes = {itemsize for _shape, _stride, _offset, itemsize in views}
        if len(sizes) != 1:
            return 0
        itemsize = sizes.pop()
        if all(math.prod(shape) * itemsize >= nbytes for shape, _stride, _offset, _size in views):
            return 0
        covered = torch.zeros(nbytes // itemsize, dtype=torch.bool)
        for shape, stride, offset, _size in views:
            covered.as_strided(shape, stride, offset).fill_(True)
        return int((~covered).sum()) * itemsize

    @staticmethod
    def _unpack(tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def __enter__(self) -> Self:
        _current.recorder = self
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)
        _current.recorder = None

    @property
    def tensors(self) -> tuple[SavedTensor, ...]:
        tensors = []
        for ptr, (region_name, shape, dtype, nbytes) in self.seen.items():
            reason, share = self.extras.get(ptr, ("", 1.0))
            if not reason and region_name.endswith("norm") and len(shape) > 1 and shape[-1] == 1:
                reason, share = "the norm keeps per-token statistics (mean and 1/std, or 1/rms) for backward", 0.0
            if not reason:
                unused = self._unused_bytes(ptr, nbytes)
                if unused:
                    reason = "a saved slice keeps its whole buffer alive (e.g. V, a view of the fused QKV output)"
                    share = 1 - unused / nbytes
            tensors.append(SavedTensor(region_name, shape, dtype, nbytes, reason, share))
        return tuple(tensors)

    @property
    def total_bytes(self) -> int:
        return sum(item[3] for item in self.seen.values())


class RMSNorm(nn.Module):
    """Llama's RMSNorm as Hugging Face writes it (LlamaRMSNorm): x * rsqrt(mean(x^2) + eps) * w."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        normed = x * torch.rsqrt(variance + self.eps)
        _note_extra(normed, "RMSNorm written out in PyTorch keeps x·rsqrt(mean(x²)) for the weight's gradient")
        return self.weight * normed


@dataclass(frozen=True)
class BlockShape:
    """The shape of one layer, as tutor.theory.activations describes it."""

    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    style: str  # "gpt": LayerNorm, GeLU MLP of ffn, biases, dropout; "llama": RMSNorm, SwiGLU, none
    attention: str  # "eager" (softmax written out) or "sdpa" (F.scaled_dot_product_attention)
    dropout: float

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def gated_mlp(self) -> bool:
        return self.style == "llama"


class Block(nn.Module):
    """One pre-norm transformer layer: x + Attn(Norm(x)), then h + MLP(Norm(h)); causal."""

    def __init__(self, shape: BlockShape) -> None:
        super().__init__()
        self.shape = shape
        h, d = shape.hidden, shape.head_dim
        gpt = shape.style == "gpt"
        self.norm1 = nn.LayerNorm(h) if gpt else RMSNorm(h)
        self.norm2 = nn.LayerNorm(h) if gpt else RMSNorm(h)
        self.qkv = nn.Linear(h, (shape.heads + 2 * shape.kv_heads) * d, bias=gpt)
        self.proj = nn.Linear(shape.heads * d, h, bias=gpt)
        if gpt:
            self.fc1 = nn.Linear(h, shape.ffn)
        else:
            self.gate_up = nn.Linear(h, 2 * shape.ffn, bias=False)
        self.fc2 = nn.Linear(shape.ffn, h, bias=gpt)
        self.sdpa_backend = ""  # set by forward when attention is "sdpa"

    def _dropout(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.shape.dropout, self.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = self.shape
        b, s, _ = x.shape
        a, kv, d = shape.heads, shape.kv_heads, shape.head_dim
        with region("attention norm"):
            normed = self.norm1(x)
        with region("QKV projection"):
            qkv = self.qkv(normed)
        with region("attention core"):
            q, k, v = qkv.split((a * d, kv * d, kv * d), dim=-1)
            q = q.view(b, s, a, d).transpose(1, 2)
            k = k.view(b, s, kv, d).transpose(1, 2)
            v = v.view(b, s, kv, d).transpose(1, 2)
            if shape.attention == "sdpa":
                gqa: _GqaOption = {}
                if kv != a and sdpa_has_enable_gqa():
                    gqa["enable_gqa"] = True
                elif kv != a:
                    k = k.repeat_interleave(a // kv, dim=1)
                    v = v.repeat_interleave(a // kv, dim=1)
                    _note_extra(k, "SDPA before torch 2.5 needs K copied to every query head", kv / a)
                    _note_extra(v, "SDPA before torch 2.5 needs V copied to every query head", kv / a)
                out = F.scaled_dot_product_attention(
                    q, k, v, is_causal=True, dropout_p=shape.dropout if self.training else 0.0, **gqa)
                self.sdpa_backend = sdpa_backend(out.grad_fn)
            else:
                if kv != a:
                    # Hugging Face repeat_kv: every query head gets its own copy of its K and V.
                    k = k.repeat_interleave(a // kv, dim=1)
                    v = v.repeat_interleave(a // kv, dim=1)
                    _note_extra(k, "eager GQA copies K to every query head (repeat_kv)", kv / a)
                    _note_extra(v, "eager GQA copies V to every query head (repeat_kv)", kv / a)
                scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d)
                # An additive mask, as Hugging Face's eager path uses: add keeps nothing for backward
                # (masked_fill would keep its s x s boolean mask).
                causal = torch.full((s, s), float("-inf"), dtype=scores.dtype, device=x.device).triu(1)
                scores = scores + causal
                probs = torch.softmax(scores, dim=-1)
                out = torch.matmul(self._dropout(probs), v)
            attended = out.transpose(1, 2).reshape(b, s, a * d)
        with region("output projection"):
            projected = self.proj(attended)
        with region("attention residual dropout"):
            x = x + self._dropout(projected)
        with region("MLP norm"):
            normed = self.norm2(x)
        if shape.gated_mlp:
            with region("MLP input projection"):
                gate_up = self.gate_up(normed)
            with region("MLP activation"):
                gate, up = gate_up.chunk(2, dim=-1)
                silu = F.silu(gate)
                _note_extra(silu, "unfused SwiGLU: the multiply keeps silu(gate) as well as gate")
                hidden = silu * up
        else:
            with region("MLP input projection"):
                hidden = self.fc1(normed)
            with region("MLP activation"):
                hidden = F.gelu(hidden)
        with region("MLP output projection"):
            out = self.fc2(hidden)
        with region("MLP residual dropout"):
            return x + self._dropout(out)


class TinyLM(nn.Module):
    """Token embedding, `layers` blocks, a final norm and an untied LM head."""

    def __init__(self, shape: BlockShape, layers: int, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, shape.hidden)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(layers))
        self.norm = nn.LayerNorm(shape.hidden) if shape.style == "gpt" else RMSNorm(shape.hidden)
        self.head = nn.Linear(shape.hidden, vocab, bias=False)
        self.shape = shape

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        with region("embedding"):
            x = self.embed(ids)
            x = dropout(x, self.shape.dropout, self.training)
        for block in self.blocks:
            x = block(x)
        with region("final norm"):
            x = self.norm(x)
        with region("LM head"):
            return self.head(x)


def sdpa_backend(grad_fn: object) -> str:
    """Which SDPA kernel ran, from the autograd node it left: 'flash', 'efficient', 'cudnn' or 'math'."""
    name = type(grad_fn).__name__.lower()
    for backend in ("flash", "efficient", "cudnn"):
        if backend in name:
            return backend
    return "math"

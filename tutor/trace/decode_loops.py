"""Decode loops as engines run them, for the labs and `time --verify` on a GPU.

- eager: transformers' forward with a DynamicCache, one token per step (the loop `generate` runs);
- static: the same step on a StaticCache whose every input stays at one address, which a CUDA graph can
  capture and replay (PyTorch's "CUDA Graphs" notes; serving engines capture their decode steps so).
Device-agnostic except capture_cuda_graph.
"""

from __future__ import annotations

import inspect
from typing import Any

from tutor.trace.memory_trace import cache_argument

GRAPH_WARMUPS = 3  # eager steps on a side stream before capture, as torch.cuda.graphs asks


def eager_decoder(model, config, prompt_ids):
    """Reads the prompt into a DynamicCache, then returns step(): one greedy token through the model's
    forward, the cache growing by one position, as `generate` does at batch 1."""
    from transformers import DynamicCache

    keyword = cache_argument(model)
    try:
        cache = DynamicCache(config=config)  # per-layer kinds (sliding windows) from the config
    except TypeError:  # a transformers release whose DynamicCache takes no config
        cache = DynamicCache()
    # Only the last position's logits, as generate asks: a long prompt's full logits are gigabytes.
    first = model(prompt_ids, **{keyword: cache}, use_cache=True, logits_to_keep=1).logits
    state = {"token": first[:, -1:].argmax(dim=-1)}

    def step():
        logits = model(state["token"], **{keyword: cache}, use_cache=True).logits
        state["token"] = logits[:, -1:].argmax(dim=-1)
        return logits

    step.cache = cache  # type: ignore[attr-defined]
    return step


class StaticDecoder:
    """One decode step whose every input stays at one address: a StaticCache of `max_len` positions,
    the token and its position in tensors updated in place. Replaying the same kernels then decodes
    the next token, which is what a CUDA graph needs (a captured step cannot take new Python values).
    Device-agnostic: on a CPU it runs (the tests compare it with eager decode); only capture is CUDA's."""

    def __init__(self, model, config, prompt_ids, max_len: int) -> None:
        import torch
        from transformers import StaticCache

        self.model = model
        self.keyword = cache_argument(model)
        self.takes_cache_position = "cache_position" in inspect.signature(model.forward).parameters
        self.cache = StaticCache(config=config, max_cache_len=max_len)
        prompt = int(prompt_ids.shape[1])
        device = prompt_ids.device
        logits = self._forward(prompt_ids, torch.arange(prompt, device=device).view(1, -1))
        self.token = logits[:, -1:].argmax(dim=-1)
        self.position = torch.full((1, 1), prompt, dtype=torch.long, device=device)
        self.room = max_len - prompt  # steps the cache still holds: a step past it would index out of range

    def _forward(self, ids, positions):
        kwargs: dict[str, Any] = {self.keyword: self.cache, "use_cache": True, "position_ids": positions,
                                  "logits_to_keep": 1}
        if self.takes_cache_position:  # transformers releases whose StaticCache writes at cache_position
            kwargs["cache_position"] = positions.view(-1)
        return self.model(ids, **kwargs).logits

    def step(self):
        if self.room <= 0:
            raise RuntimeError("the static cache is full")
        self.room -= 1
        logits = self._forward(self.token, self.position)
        self.token.copy_(logits[:, -1:].argmax(dim=-1))
        self.position.add_(1)
        return logits


def capture_cuda_graph(decoder: StaticDecoder):
    """The step captured in a CUDA graph after warm-up steps on a side stream (PyTorch's "CUDA Graphs"
    notes: warm up outside capture so lazy initialisation and allocations happen before it). Each
    replay runs one more step; `decoder.room` is spent by the caller per replay."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(GRAPH_WARMUPS):
            decoder.step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    room = decoder.room
    with torch.cuda.graph(graph):
        decoder.step()  # recorded, not run: the cache does not advance
    decoder.room = room
    return graph

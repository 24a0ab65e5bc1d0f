"""kv-pages: a request mix allocated in a KV-cache pool three ways, counting every slot.

- contiguous: each request reserves one chunk of `max_len` tokens when it arrives, the way systems
  before vLLM allocated (Kwon et al., SOSP 2023, arXiv 2309.06180, §3);
- paged: a pool of fixed-size blocks, a free list and a block table per request; a request takes a
  block whenever its last one is full (PagedAttention, §4.2-4.3);
- paged with prefix caching: the requests start with the same `shared_prefix` tokens (a system
  prompt); the prefix's full blocks are allocated once and referenced by every request through a
  reference count (§4.4; vLLM's automatic prefix caching shares whole blocks only).

The allocator runs for real (block ids handed out and taken back, tables and reference counts kept);
the lab counts the slots each scheme holds when every request of the mix is resident at its final
length, turns them into bytes with the chosen model's KV bytes per token (tutor.theory.kv_cache),
and sets each count beside tutor.theory.serving's formula. No tensor is allocated: the slots a
scheme holds are the bytes it would take on a GPU, whatever this machine is.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field

from tutor.errors import UserError
from tutor.formatting import format_bytes, format_count, format_number, format_percent
from tutor.labs._params import Param, make_probe
from tutor.labs.probe import Measurement, ProbeResult, ProgressFn


@dataclass
class BlockPool:
    """A paged KV-cache pool: block ids on a free list, a block table per request, reference counts
    so a block can belong to several requests (vLLM's BlockSpaceManager, in miniature)."""

    block_size: int
    free: list[int] = field(default_factory=list)
    refcount: dict[int, int] = field(default_factory=dict)
    tables: dict[int, list[int]] = field(default_factory=dict)
    lengths: dict[int, int] = field(default_factory=dict)
    created: int = 0

    def _take(self) -> int:
        block = self.free.pop() if self.free else self.created
        if block == self.created:
            self.created += 1
        self.refcount[block] = 1
        return block

    def start(self, request: int, shared: list[int] | None = None, shared_tokens: int = 0) -> None:
        """A new request, its table starting with the `shared` blocks (full, `shared_tokens` tokens)."""
        for block in shared or []:
            self.refcount[block] += 1
        self.tables[request] = list(shared or [])
        self.lengths[request] = shared_tokens

    def append(self, request: int, tokens: int) -> None:
        """`tokens` more tokens for `request`: a new block each time the last one is full."""
        for _ in range(tokens):
            if self.lengths[request] % self.block_size == 0:
                self.tables[request].append(self._take())
            self.lengths[request] += 1

    def finish(self, request: int) -> None:
        """The request is done: each of its blocks returns to the free list once no request uses it."""
        for block in self.tables.pop(request):
            self.refcount[block] -= 1
            if self.refcount[block] == 0:
                del self.refcount[block]
                self.free.append(block)
        del self.lengths[request]

    @property
    def blocks_held(self) -> int:
        return len(self.refcount)


def bytes_per_token(model: str, kv_dtype: str) -> int:
    """KV bytes per token of a preset model (tutor.theory.kv_cache, MLA where the model has it)."""
    from tutor.files.models import load_preset
    from tutor.theory.kv_cache import kv_cache_bytes_per_token, kv_dtype_bytes, mla_kv_cache_bytes_per_token
    from tutor.theory.models import architecture_from_config

    config, info = load_preset(model)
    arch = architecture_from_config(config, info.display_name)
    element = kv_dtype_bytes(kv_dtype)
    if getattr(arch, "kv_lora_rank", 0):
        return mla_kv_cache_bytes_per_token(layers=arch.num_layers, kv_lora_rank=arch.kv_lora_rank,
                                            qk_rope_head_dim=arch.qk_rope_head_dim, bytes_per_element=element)
    return kv_cache_bytes_per_token(layers=arch.num_layers, kv_heads=arch.num_kv_heads, head_dim=arch.head_dim,
                                    bytes_per_element=element)


def _kv_pages(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    if cancel.is_set():
        return ProbeResult("kv-pages", (), {}, "cancelled before the requests were drawn", True, "cpu")
    from tutor.theory.serving import (
        contiguous_reserved_tokens,
        expected_block_waste_tokens,
        paged_reserved_tokens,
        prefix_cache_saved_tokens,
    )

    requests, block, prefix = params["requests"], params["block_size"], params["shared_prefix"]
    max_len = params["max_len"]
    if prefix + params["prompt_max"] + params["output_max"] > max_len:
        raise UserError(f"kv-pages: shared_prefix + prompt_max + output_max "
                        f"({format_count(prefix + params['prompt_max'] + params['output_max'], exact=True)}) must not "
                        f"exceed max_len ({format_count(max_len, exact=True)}): a request could outgrow its chunk")
    per_token = bytes_per_token(params["model"], params["kv_dtype"])
    rng = random.Random(params["seed"])
    lengths = [prefix + rng.randint(1, params["prompt_max"]) + rng.randint(1, params["output_max"])
               for _ in range(requests)]
    progress(0.2, "allocating the requests block by block")

    paged = BlockPool(block)
    for request, length in enumerate(lengths):
        paged.start(request)
        paged.append(request, length)
    paged_blocks = paged.blocks_held

    shared_pool = BlockPool(block)
    shared_blocks: list[int] = []
    shared_tokens = prefix // block * block  # only full blocks are shared
    if shared_tokens:
        shared_pool.start(-1)
        shared_pool.append(-1, shared_tokens)
        shared_blocks = list(shared_pool.tables[-1])
    for request, length in enumerate(lengths):
        shared_pool.start(request, shared_blocks, shared_tokens)
        shared_pool.append(request, length - shared_tokens)
    if shared_tokens:
        shared_pool.finish(-1)  # the cache's own reference: the requests hold the prefix now
    shared_held = shared_pool.blocks_held
    for request in range(requests):  # every block returns to the free list once its last user ends
        shared_pool.finish(request)
    assert shared_pool.blocks_held == 0, "the pool leaked blocks"
    progress(0.8, "counting the slots")

    used = sum(lengths)
    contiguous = requests * max_len
    paged_slots = paged_blocks * block
    shared_slots = shared_held * block
    metrics = {
        "used_bytes": float(used * per_token),
        "contiguous_bytes": float(contiguous * per_token),
        "paged_bytes": float(paged_slots * per_token),
        "prefix_cached_bytes": float(shared_slots * per_token),
        "contiguous_waste_fraction": 1 - used / contiguous,
        "paged_waste_fraction": 1 - used / paged_slots,
        "paged_waste_tokens_per_request": (paged_slots - used) / requests,
        "capacity_gain": contiguous / paged_slots,
        "prefix_saved_fraction": 1 - shared_slots / paged_slots,
        "bytes_per_token": float(per_token),
    }
    theory_contiguous = contiguous_reserved_tokens(lengths, max_len) * per_token
    theory_paged = paged_reserved_tokens(lengths, block) * per_token
    theory_saved = prefix_cache_saved_tokens(requests=requests, prefix_tokens=prefix, block_size=block)
    mix = (f"{requests} requests: {format_count(prefix, exact=True)} shared + 1 to "
           f"{format_count(params['prompt_max'], exact=True)} prompt + 1 to "
           f"{format_count(params['output_max'], exact=True)} output tokens; {params['model']} at "
           f"{format_bytes(per_token)} per token")
    rows = (
        Measurement("KV cache the tokens really use", metrics["used_bytes"], "B",
                    note=f"{format_count(used, exact=True)} tokens; {mix}"),
        Measurement(f"contiguous: a {format_count(max_len, exact=True)}-token chunk per request",
                    metrics["contiguous_bytes"], "B", float(theory_contiguous), "requests × max_len × bytes per token",
                    f"{format_percent(metrics['contiguous_waste_fraction'])} of it reserved but empty"),
        Measurement(f"paged: {format_count(block, exact=True)}-token blocks, a table per request",
                    metrics["paged_bytes"], "B", float(theory_paged), "Σ ceil(length / block) × block × bytes per token",
                    f"{format_count(paged_blocks, exact=True)} blocks; "
                    f"{format_percent(metrics['paged_waste_fraction'])} empty, all in last blocks"),
        Measurement("empty slots per request (paged)", metrics["paged_waste_tokens_per_request"], "tokens",
                    expected_block_waste_tokens(block), "(block - 1) / 2 for lengths uniform modulo the block",
                    "at most block - 1 each"),
        Measurement("requests the same memory holds: paged over contiguous", metrics["capacity_gain"], "x",
                    note="the batch a server can run grows by this much for this mix"),
        Measurement("paged, the shared prefix's full blocks stored once", metrics["prefix_cached_bytes"], "B",
                    float(theory_paged - theory_saved * per_token),
                    "paged - (requests - 1) × full prefix blocks × bytes per token",
                    f"{format_count(shared_held, exact=True)} blocks; "
                    f"{format_percent(metrics['prefix_saved_fraction'])} less than paged alone"),
    )
    progress(1.0, "done")
    summary = (f"contiguous {format_bytes(metrics['contiguous_bytes'])}, paged {format_bytes(metrics['paged_bytes'])}"
               f" ({format_number(metrics['capacity_gain'])}x the requests), with the prefix shared "
               f"{format_bytes(metrics['prefix_cached_bytes'])}, for {format_bytes(metrics['used_bytes'])} used")
    return ProbeResult("kv-pages", rows, metrics, summary, False, "cpu", {"lengths": lengths})


KV_PAGES = make_probe(
    name="kv-pages",
    title="The KV cache as pages: reserved, paged and shared",
    description="Allocates a request mix's KV cache three ways with a real block allocator (free list, block "
                "tables, reference counts): a contiguous max-length chunk per request, PagedAttention's "
                "fixed-size blocks, and blocks with a shared prompt prefix stored once; slots counted, in bytes of "
                "the chosen model, beside the formulas.",
    needs_torch=False,
    params=(
        Param("model", "str", "llama-3.1-8b", "the model whose KV bytes per token the slots are counted in"),
        Param("requests", "int", 64, "requests resident together", minimum=1, maximum=100_000),
        Param("prompt_max", "int", 1024, "longest prompt (uniform from 1)", minimum=1, maximum=1_000_000,
              unit="tokens"),
        Param("output_max", "int", 1024, "longest output (uniform from 1)", minimum=1, maximum=1_000_000,
              unit="tokens"),
        Param("max_len", "int", 4096, "the maximum length a contiguous chunk is reserved for", minimum=2,
              maximum=2_000_000, unit="tokens"),
        Param("block_size", "int", 16, "tokens per block (vLLM's default 16)", minimum=1, maximum=1024,
              unit="tokens"),
        Param("shared_prefix", "int", 0, "tokens of a prompt prefix every request shares", minimum=0,
              maximum=1_000_000, unit="tokens"),
        Param("kv_dtype", "str", "bf16", "KV-cache dtype", choices=("fp32", "bf16", "fp16", "fp8", "int8")),
        Param("seed", "int", 0, "random seed", minimum=0),
    ),
    metrics=("used_bytes", "contiguous_bytes", "paged_bytes", "prefix_cached_bytes", "contiguous_waste_fraction",
             "paged_waste_fraction", "paged_waste_tokens_per_request", "capacity_gain", "prefix_saved_fraction",
             "bytes_per_token"),
    body=_kv_pages,
)

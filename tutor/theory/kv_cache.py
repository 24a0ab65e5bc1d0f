"""The KV cache of inference: keys and values kept for every past token of every layer.

Bytes = 2 (K and V) × layers × kv_heads × head_dim × tokens × bytes per element (vLLM's
`AttentionSpec.page_size_bytes`; Hugging Face `DynamicCache`). Multi-head latent attention
(DeepSeek-V2/V3) caches one compressed latent plus the decoupled RoPE key per layer instead.
Sliding-window layers (Mistral-7B-v0.1, Gemma-2's alternate layers) keep at most `window` tokens
in a serving engine (vLLM allocates the window only). transformers' DynamicSlidingWindowLayer
(cache_utils.py, 5.x) concatenates the whole prompt at prefill and keeps a window-long view of
it, so right after prefill its storage still holds every prompt token, until the first decode
step's concatenation frees it: model that peak with sliding_layers=0 (fit does, for --impl hf).
"""

from __future__ import annotations

from collections.abc import Sequence

from tutor.errors import UserError
from tutor.theory.checks import positive_int
from tutor.theory.parallel import kv_heads_per_rank

__all__ = [
    "KV_DTYPES",
    "VLLM_DEFAULT_BLOCK_SIZE",
    "kv_cache_blocks",
    "kv_cache_bytes",
    "kv_cache_bytes_per_token",
    "kv_cache_tokens_that_fit",
    "kv_dtype_bytes",
    "kv_heads_per_rank",
    "mla_kv_cache_bytes_per_token",
]

# Bytes per cached element. fp8 (vLLM --kv-cache-dtype fp8_e4m3/fp8_e5m2) and int8 carry a
# per-tensor scale, a few bytes per layer, left out as negligible.
KV_DTYPES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}
_KV_DTYPE_ALIASES = {
    "float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
    "auto": "bf16", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "float8": "fp8",
}

# vLLM's default paged-attention block size in tokens (`--block-size`, CacheConfig).
VLLM_DEFAULT_BLOCK_SIZE = 16



def kv_dtype_bytes(name: str) -> int:
    """Bytes per cached K/V element for a KV-cache dtype name (bf16 2, fp8 1, ...).

    "auto" means the model's dtype in vLLM; it is taken as bf16 here.
    """
    key = str(name).strip().lower().replace("-", "_")
    key = _KV_DTYPE_ALIASES.get(key, key)
    if key not in KV_DTYPES:
        raise UserError(f"unknown KV-cache dtype {name!r} (choose one of: {', '.join(KV_DTYPES)})")
    return KV_DTYPES[key]


def kv_cache_bytes_per_token(*, layers: int, kv_heads: int, head_dim: int, bytes_per_element: int = 2) -> int:
    """KV-cache bytes per token of one sequence: 2·L·kv_heads·head_dim·bytes.

    Use the config's head_dim where given (Gemma-2: 256, not 3584/16); kv_heads is
    num_key_value_heads (GQA; 1 for MQA). Matches vLLM exactly: Mistral-Small-3.2-24B,
    2·40·8·128·2 = 163,840 B/token (llm-d docs/empirical-vllm-memory-results.md).
    """
    layers = positive_int(layers, "layers")
    kv_heads = positive_int(kv_heads, "kv_heads")
    head_dim = positive_int(head_dim, "head_dim")
    bytes_per_element = positive_int(bytes_per_element, "bytes_per_element")
    return 2 * layers * kv_heads * head_dim * bytes_per_element


def mla_kv_cache_bytes_per_token(
    *, layers: int, kv_lora_rank: int, qk_rope_head_dim: int, bytes_per_element: int = 2
) -> int:
    """Multi-head latent attention cache bytes per token: L·(kv_lora_rank + qk_rope_head_dim)·bytes.

    DeepSeek-V2 paper (arXiv 2405.04434) §2.1.2: MLA caches the compressed KV latent c_t (d_c =
    kv_lora_rank) and the shared decoupled RoPE key (d_h^R = qk_rope_head_dim) per layer.
    DeepSeek-V3 (61 layers, 512 + 64) in bf16: 70,272 B/token.
    """
    layers = positive_int(layers, "layers")
    kv_lora_rank = positive_int(kv_lora_rank, "kv_lora_rank")
    qk_rope_head_dim = positive_int(qk_rope_head_dim, "qk_rope_head_dim")
    bytes_per_element = positive_int(bytes_per_element, "bytes_per_element")
    return layers * (kv_lora_rank + qk_rope_head_dim) * bytes_per_element


def kv_cache_bytes(
    *,
    layer_widths: Sequence[int],
    seq_len: int,
    batch: int = 1,
    bytes_per_element: int = 2,
    sliding_window: int | None = None,
    sliding_layers: int = 0,
    tp: int = 1,
    kv_heads: int | None = None,
) -> int:
    """KV-cache bytes on one tensor-parallel rank for `batch` sequences of `seq_len` tokens.

    layer_widths: elements cached per token for each layer, for the whole model: 2·kv_heads·head_dim
    for standard attention, kv_lora_rank + qk_rope_head_dim for MLA.
    sliding_window / sliding_layers: that many layers (the FIRST `sliding_layers` entries of
    layer_widths: list windowed layers first when widths differ) cache min(seq_len, window) tokens.
    tp: tensor parallelism splits KV heads, but each rank keeps at least one (a replica), so
    with tp > 1 pass `kv_heads` (the KV heads of every layer) and each layer's width is scaled
    by kv_heads_per_rank(kv_heads, tp) / kv_heads. An MLA latent is one shared tensor that every
    rank keeps whole: pass kv_heads=1.
    Exact (no rounding); paged allocation rounds tokens up to blocks, see `kv_cache_blocks`.
    """
    if isinstance(layer_widths, (str, bytes)) or not isinstance(layer_widths, Sequence) or not layer_widths:
        raise UserError("layer_widths must be a non-empty list of elements cached per token, one per layer")
    widths = [positive_int(w, "each layer width (elements per token)") for w in layer_widths]
    seq_len = positive_int(seq_len, "seq_len")
    batch = positive_int(batch, "batch")
    bytes_per_element = positive_int(bytes_per_element, "bytes_per_element")
    tp = positive_int(tp, "tensor-parallel size (tp)")
    valid_count = isinstance(sliding_layers, int) and not isinstance(sliding_layers, bool)
    if not valid_count or not 0 <= sliding_layers <= len(widths):
        raise UserError(f"sliding_layers must be a whole number from 0 to {len(widths)}, got {sliding_layers!r}")
    if sliding_layers and sliding_window is None:
        raise UserError("sliding_layers needs sliding_window (the window length in tokens)")
    window = seq_len if sliding_window is None else min(seq_len, positive_int(sliding_window, "sliding_window"))
    if tp > 1:
        if kv_heads is None:
            raise UserError(
                "with tp > 1 pass kv_heads (KV heads per layer; 1 for an MLA latent) so replication is counted"
            )
        heads = positive_int(kv_heads, "kv_heads")
        for w in widths:
            if w % heads:
                raise UserError(
                    f"layer width {w} is not a whole number of elements per KV head for kv_heads={heads}"
                )
        widths = [w // heads * kv_heads_per_rank(heads, tp) for w in widths]
    elements = sum(w * window for w in widths[:sliding_layers]) + sum(w * seq_len for w in widths[sliding_layers:])
    return elements * batch * bytes_per_element


def kv_cache_blocks(tokens: int, block_size: int = VLLM_DEFAULT_BLOCK_SIZE) -> int:
    """Paged-attention blocks for `tokens` tokens of one sequence: ceil(tokens / block_size).

    vLLM allocates the KV cache in fixed blocks (default 16 tokens); llm-d measured
    ceil(15049/128) = 118 blocks with block size 128.
    """
    tokens = positive_int(tokens, "tokens")
    block_size = positive_int(block_size, "block_size")
    return -(-tokens // block_size)


def kv_cache_tokens_that_fit(budget_bytes: int, bytes_per_token: int, block_size: int = VLLM_DEFAULT_BLOCK_SIZE) -> int:
    """Tokens of KV cache that fit in `budget_bytes` when allocated in whole blocks.

    vLLM: num_blocks = budget // (block_size × bytes_per_token), tokens = num_blocks × block_size
    (the "GPU KV cache size: N tokens" startup line). Returns 0 when not even one block fits.
    """
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
        raise UserError(f"budget_bytes must be a whole number of bytes >= 0, got {budget_bytes!r}")
    bytes_per_token = positive_int(bytes_per_token, "bytes_per_token")
    block_size = positive_int(block_size, "block_size")
    return budget_bytes // (block_size * bytes_per_token) * block_size

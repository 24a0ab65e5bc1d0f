"""Which linear layers a decoder block has, and how many trainable parameters LoRA adds to them.

LoRA (Hu et al. 2021, arXiv 2106.09685 §4.1) freezes a weight W (d_out x d_in) and trains
B (d_out x r) and A (r x d_in): r * (d_in + d_out) parameters per adapted matrix. QLoRA
(Dettmers et al. 2023, arXiv 2305.14314 §4) adapts "all linear transformer block layers",
which is the default here; PEFT's original LoRA examples adapt only q and v.
"""

from __future__ import annotations

from dataclasses import dataclass

from tutor.errors import UserError
from tutor.theory.memory import lora_adapter_params
from tutor.theory.models import Architecture

# Module names as Hugging Face transformers (and PEFT's target_modules) call them.
ATTENTION_TARGETS = ("q", "k", "v", "o")
MLP_TARGETS = ("gate", "up", "down")
ALL_LINEAR = ATTENTION_TARGETS + MLP_TARGETS


@dataclass(frozen=True)
class LinearModule:
    """One nn.Linear of a decoder block: its role, shape, and how many copies the block has."""

    role: str      # one of ALL_LINEAR; a fused module carries the first role it serves
    roles: tuple[str, ...]
    d_in: int
    d_out: int
    copies: int = 1  # routed experts: one copy per expert


def linear_modules(arch: Architecture, *, moe_layer: bool) -> tuple[LinearModule, ...]:
    """The linear layers of one decoder block, following the transformers module structure.

    Fused modules count as one Linear, as PEFT adapts them: GPT-2's c_attn (h -> 3h) and c_fc,
    Phi-3's qkv_proj and gate_up_proj. MLA (DeepSeek-V3) has its low-rank q_a/q_b and kv_a/kv_b
    projections; they adapt as the q and k/v roles. Routed experts appear once with copies=E.
    """
    h, a, d = arch.hidden_size, arch.num_heads, arch.head_dim
    modules: list[LinearModule] = []
    if arch.uses_mla:
        qk = arch.qk_nope_head_dim + arch.qk_rope_head_dim
        if arch.q_lora_rank is None:
            modules.append(LinearModule("q", ("q",), h, a * qk))
        else:
            modules += [LinearModule("q", ("q",), h, arch.q_lora_rank),
                        LinearModule("q", ("q",), arch.q_lora_rank, a * qk)]
        modules += [LinearModule("k", ("k", "v"), h, arch.kv_lora_rank + arch.qk_rope_head_dim),
                    LinearModule("k", ("k", "v"), arch.kv_lora_rank, a * (arch.qk_nope_head_dim + arch.v_head_dim)),
                    LinearModule("o", ("o",), a * arch.v_head_dim, h)]
    elif arch.model_type in ("gpt2", "phi3"):
        modules += [LinearModule("q", ("q", "k", "v"), h, arch.q_width + 2 * arch.kv_width),
                    LinearModule("o", ("o",), arch.q_width, h)]
    else:
        modules += [LinearModule("q", ("q",), h, a * d), LinearModule("k", ("k",), h, arch.kv_width),
                    LinearModule("v", ("v",), h, arch.kv_width), LinearModule("o", ("o",), a * d, h)]

    def mlp(width: int, copies: int) -> list[LinearModule]:
        if not arch.gated_mlp:
            return [LinearModule("up", ("up",), h, width, copies), LinearModule("down", ("down",), width, h, copies)]
        if arch.model_type == "phi3":
            return [LinearModule("gate", ("gate", "up"), h, 2 * width, copies),
                    LinearModule("down", ("down",), width, h, copies)]
        return [LinearModule("gate", ("gate",), h, width, copies), LinearModule("up", ("up",), h, width, copies),
                LinearModule("down", ("down",), width, h, copies)]

    if moe_layer:
        modules += mlp(arch.moe_intermediate_size, arch.num_experts)
        if arch.shared_expert_intermediate_size:
            modules += mlp(arch.shared_expert_intermediate_size, 1)
    else:
        modules += mlp(arch.intermediate_size, 1)
    return tuple(modules)


def parse_lora_targets(text: str) -> tuple[str, ...]:
    """'all-linear' or a comma list such as 'q,v' (also 'q_proj,v_proj') -> roles; UserError otherwise."""
    cleaned = text.strip().lower()
    if cleaned in ("all", "all-linear", "all_linear"):
        return ALL_LINEAR
    roles = tuple(part.strip().removesuffix("_proj") for part in cleaned.split(",") if part.strip())
    unknown = [role for role in roles if role not in ALL_LINEAR]
    if not roles or unknown:
        raise UserError(f"unknown LoRA target {', '.join(unknown) or text!r}: use all-linear or a list of "
                        f"{', '.join(ALL_LINEAR)}")
    return roles


def lora_trainable_params(arch: Architecture, *, rank: int, targets: tuple[str, ...] = ALL_LINEAR) -> int:
    """Trainable LoRA parameters of the whole model: r * (d_in + d_out) per adapted matrix.

    Anchor: Llama-3.2-3B, r = 32 on q and v = 9,175,040 (huggingface/peft method_comparison/
    MetaMathQA lora--llama-3.2-3B-rank32.json, num_trainable_params).
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise UserError(f"LoRA rank must be a whole number >= 1, got {rank!r}")
    wanted = set(targets)
    total = 0
    for is_moe in arch.layer_is_moe:
        for module in linear_modules(arch, moe_layer=is_moe):
            if wanted & set(module.roles):
                total += module.copies * lora_adapter_params(module.d_in, module.d_out, rank)
    return total


def quantizable_weights_per_layer(arch: Architecture, *, moe_layer: bool) -> int:
    """Matrix weights of one block that weight-only quantization stores in the low-bit format.

    GPTQ/AWQ/bitsandbytes/FP8 checkpoints quantize the block's nn.Linear weights and keep the
    embeddings, LM head, norms, biases and routers in 16 bits (e.g. Llama-3.3-70B-FP8-dynamic:
    2,109,382,656 BF16 + 68,451,041,280 F8 elements in the Hub's safetensors metadata of
    Llama-3.3-70B-FP8-dynamic).
    A calibrated-trace architecture (no hand profile) counts the 2-D and grouped-expert weights of
    its real model class's layer.
    """
    if arch.measured is not None:
        kind = [layer.linear for layer in arch.measured.layers if (layer.routed > 0) == moe_layer]
        return kind[0] if kind else 0
    return sum(m.copies * m.d_in * m.d_out for m in linear_modules(arch, moe_layer=moe_layer))

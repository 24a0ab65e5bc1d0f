"""PEFT adapter folders as `fit` reads them: adapter_config.json and adapter_model.safetensors.

PEFT's `save_pretrained` writes a LoRA adapter as adapter_config.json (the LoraConfig: `peft_type`,
`base_model_name_or_path`, `r`, `target_modules`, ...) and adapter_model.safetensors (peft
utils/constants.py CONFIG_NAME, SAFETENSORS_WEIGHTS_NAME). `PeftModel.from_pretrained` loads the base
model from `base_model_name_or_path` (a local folder first, as transformers' from_pretrained does,
else a Hub id) and wraps each module whose name matches `target_modules` (a list of name suffixes, a
regular expression, or "all-linear"; peft tuners/tuners_utils.py `check_target_module_exists`).

Here the base becomes what `fit` takes (a preset or a local path) and the target modules become the
roles of tutor.theory.lora; nothing is fetched. Standard library only.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from tutor.errors import UserError
from tutor.theory.lora import ALL_LINEAR
from tutor.theory.models import shown
from tutor.theory.safetensors_header import SafetensorsSummary
from tutor.files.untrusted import POSITIVE_WHOLE, expect

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"

# Module names (the last part of a dotted name) as transformers' model classes spell them -> the roles of
# tutor.theory.lora.linear_modules that module serves. Fused modules serve several roles: PEFT adapts the
# whole module (GPT-2's c_attn, Phi-3's qkv_proj and gate_up_proj, GPT-NeoX's query_key_value); GPT-2's
# c_proj is both the attention output and the MLP down projection, and PEFT's suffix match takes both.
MODULE_ROLES: dict[str, tuple[str, ...]] = {
    "q_proj": ("q",), "k_proj": ("k",), "v_proj": ("v",), "o_proj": ("o",), "out_proj": ("o",),
    "query": ("q",), "key": ("k",), "value": ("v",), "wq": ("q",), "wk": ("k",), "wv": ("v",), "wo": ("o",),
    "qkv_proj": ("q", "k", "v"), "c_attn": ("q", "k", "v"), "query_key_value": ("q", "k", "v"), "Wqkv": ("q", "k", "v"),
    "dense": ("o",), "c_proj": ("o", "down"),
    "q_a_proj": ("q",), "q_b_proj": ("q",), "kv_a_proj_with_mqa": ("k", "v"), "kv_b_proj": ("k", "v"),
    "gate_proj": ("gate",), "up_proj": ("up",), "down_proj": ("down",), "gate_up_proj": ("gate", "up"),
    "w1": ("gate",), "w3": ("up",), "w2": ("down",), "c_fc": ("up",), "fc1": ("up",), "fc2": ("down",),
    "dense_h_to_4h": ("up",), "dense_4h_to_h": ("down",),
}
MAX_TARGET_NAMES = 1000  # a target_modules list longer than this is not a hand-written adapter config


@dataclass(frozen=True)
class PeftAdapter:
    """A LoRA adapter folder: its base model as `fit` takes it, its rank and the roles it adapts."""

    folder: Path
    base: str
    """The base model as fit takes it: a preset name or a local path."""
    base_named: str
    """base_model_name_or_path as the adapter config writes it."""
    rank: int
    target_modules: object
    """target_modules as written (a list, a regular expression or "all-linear")."""
    weights: SafetensorsSummary | None
    """adapter_model.safetensors' headers (None when the adapter is stored another way)."""
    notes: tuple[str, ...] = ()

    def roles(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(roles of tutor.theory.lora, notes) for target_modules; UserError when none can be named."""
        return lora_roles(self.target_modules, self.folder / ADAPTER_CONFIG)


def adapter_folder(spec: str | None) -> Path | None:
    """The folder of a PEFT adapter when `spec` is one (a folder holding adapter_config.json, or that
    file), else None. A preset name is never a folder."""
    from tutor.files.models import preset_names

    if not spec or not isinstance(spec, str) or spec.strip().lower() in preset_names():
        return None
    try:
        path = Path(os.path.expanduser(spec.strip()))
        if path.is_file() and path.name == ADAPTER_CONFIG:
            return path.parent
        if path.is_dir() and (path / ADAPTER_CONFIG).is_file():
            return path
    except (OSError, ValueError):
        return None
    return None


def read_adapter(folder: Path) -> PeftAdapter:
    """The adapter in `folder` (adapter_folder), checked: a LoRA adapter with a whole rank >= 1 and a base
    model fit can read; one UserError line otherwise."""
    from tutor.files.models import load_config, safetensors_summary

    config_path = folder / ADAPTER_CONFIG
    config = load_config(config_path)
    where = shown(config_path)
    peft_type = config.get("peft_type", "LORA")
    if not isinstance(peft_type, str) or peft_type.upper() != "LORA":
        raise UserError(f"{where} is a {str(peft_type)[:40]!r} adapter; fit counts LoRA adapters (peft_type LORA)")
    rank = expect(config, "r", POSITIVE_WHOLE, what=where, default=8)  # LoraConfig's default r
    target_modules = config.get("target_modules")
    named = config.get("base_model_name_or_path")
    base = base_model(named, folder, rank)
    notes = []
    for key, what in (("rank_pattern", "per-module ranks"), ("modules_to_save", "fully trained modules"),
                      ("layers_to_transform", "a subset of layers")):
        if config.get(key):
            notes.append(f"{where} sets {key} ({what}): counted as r={rank} on every layer's target modules, "
                         "without it")
    if config.get("use_dora"):
        notes.append("DoRA (use_dora) adds one magnitude vector per adapted matrix: not counted")
    weights = None
    if (folder / ADAPTER_WEIGHTS).exists():
        weights = safetensors_summary(folder / ADAPTER_WEIGHTS)
    return PeftAdapter(folder=folder, base=base, base_named=str(named), rank=rank, target_modules=target_modules,
                       weights=weights, notes=tuple(notes))


def base_model(named: object, folder: Path, rank: int) -> str:
    """base_model_name_or_path as fit takes it: a local model folder or config.json (from_pretrained looks
    there first), else the preset of that name or Hub repository; else one line saying to pass the base."""
    from tutor.files.models import list_presets

    hint = (f"pass the base model (a preset, config.json or folder) instead, with --mode train --recipe lora "
            f"--lora-rank {rank}")
    if not isinstance(named, str) or not named.strip():
        raise UserError(f"{shown(folder / ADAPTER_CONFIG)} names no base_model_name_or_path; {hint}")
    text = named.strip()
    try:
        local = Path(os.path.expanduser(text))
        is_model = (local.is_dir() and (local / "config.json").is_file()) or (local.is_file()
                                                                                 and local.suffix == ".json")
        same = is_model and local.resolve() == folder.resolve()
    except (OSError, ValueError):
        is_model = same = False
    if same:
        raise UserError(f"{shown(folder / ADAPTER_CONFIG)} names its own folder as the base model; {hint}")
    if is_model:
        return str(local)
    key = text.lower()
    for info in list_presets():
        if key in (info.name, info.hf_repo.lower()):
            return info.name
    raise UserError(f"the adapter's base model {shown(text)!r} (base_model_name_or_path) is neither a preset nor a "
                    f"local model folder (Hub ids are not fetched); {hint}"[:400])


def lora_roles(target_modules: object, where: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The roles (tutor.theory.lora) a LoraConfig's target_modules adapts, and notes on what was not counted.

    A list names module suffixes (MODULE_ROLES); "all-linear" is every linear layer but the output head;
    another text is a regular expression matched against full module names, read here by the module names
    it spells out (never run: a regular expression can take exponential time)."""
    hint = "pass --lora-targets (such as q,v or all-linear) to say which matrices it adapts"
    notes: tuple[str, ...]
    if isinstance(target_modules, str):
        if target_modules.strip().lower() in ("all-linear", "all_linear"):
            return ALL_LINEAR, ()
        mentioned = [name for name in MODULE_ROLES if re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])",
                                                                target_modules[:2000])]
        if not mentioned:
            raise UserError(f"{shown(where)}: target_modules {target_modules[:60]!r} names no module fit knows; {hint}")
        names, notes = mentioned, (f"target_modules is a regular expression: counted the modules it names "
                                   f"({', '.join(mentioned)})",)
    elif isinstance(target_modules, list) and target_modules and all(isinstance(n, str) for n in target_modules):
        if len(target_modules) > MAX_TARGET_NAMES:
            raise UserError(f"{shown(where)}: target_modules lists {len(target_modules):,} names; {hint}")
        names, notes = [n.rsplit(".", 1)[-1] for n in target_modules], ()
    elif target_modules is None:
        raise UserError(f"{shown(where)} has no target_modules (PEFT then picks them by model type); {hint}")
    else:
        raise UserError(f"{shown(where)}: target_modules must be a list of module names or text; {hint}")
    roles = tuple(dict.fromkeys(role for name in names for role in MODULE_ROLES.get(name, ())))
    unknown = sorted({name for name in names if name not in MODULE_ROLES})
    if not roles:
        raise UserError(f"{shown(where)}: target_modules {', '.join(unknown)[:80]} are not linear layers fit "
                        f"counts; {hint}")
    if unknown:
        notes += (f"not counted among the adapted matrices: {', '.join(unknown)[:120]} (not a decoder block's "
                  "linear layer fit knows)",)
    ordered = tuple(role for role in ALL_LINEAR if role in roles)
    return ordered, notes

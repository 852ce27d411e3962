"""What every prompted-family loader shares: the loaded bundle (`LoadedPrompted`), the decoder's shape from an
HF-style config section, where the model runs (`Placement`), and the strict build (meta device, one cast, load,
quantize, move). `families.py` (Chameleon, Lumina-mGPT, Janus-Pro) and `emu3.py` read their files and map their
names, then call these. This module reads no files.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import GPTConfig
from ..errors import ConfigError, shown
from ..models.prompted import PromptedImageLM
from ..models.quantized import quantize_at_load, scheme_named
from ..models.vq import VQModel
from ..prompts import PromptEncoder
from .checkpoints import build_on_meta, check_layer_count, load_state_strict
from .quantized_io import cast_for_load

log = logging.getLogger(__name__)


@dataclass
class LoadedPrompted:
    model: PromptedImageLM
    config: GPTConfig
    source_format: str  # "hf-chameleon", "hf-lumina", "hf-janus", "deepseek-janus", "emu3" or "hf-emu3"
    encoder: PromptEncoder
    vq: VQModel | None
    vq_source: str | None
    notes: list[str] = field(default_factory=list)

    @property
    def family(self) -> str:
        return self.config.family


def scales_rope(value: object) -> bool:
    """Whether a config's `rope_scaling` / `rope_parameters` entry asks for RoPE scaling: not when absent
    (None, {}) or when it only names the default kind (`{"rope_type": "default"}`, transformers' spelling of
    plain RoPE, perhaps with the base `rope_theta`), which transformers loads as no scaling."""
    if value in (None, {}, "default"):
        return False
    if not isinstance(value, dict):
        return True
    kind = value.get("rope_type", value.get("type", "default"))
    return kind != "default" or bool(set(value) - {"rope_type", "type", "rope_theta"})


def section(cfg: dict, *keys: str) -> dict:
    """cfg[k1][k2]... as a dict ({} when absent); a ConfigError naming the entry when it is not an object."""
    node = cfg
    for depth, key in enumerate(keys):
        node = node.get(key)
        if node is None:
            return {}
        if not isinstance(node, dict):
            raise ConfigError(f"config.json {'.'.join(keys[:depth + 1])}", "a JSON object", node)
    return node


# transformers' ChameleonConfig defaults: what its loaders take for a field a Chameleon-style config.json leaves out
CHAMELEON_DEFAULTS = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                      "num_attention_heads": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": 65536}


def fields_left_out(cfg: dict, defaults: dict) -> dict:
    """The entries of `defaults` that the config section `cfg` leaves out (a RoPE base given in `rope_parameters`
    or `rope_scaling` counts as given): what the model class reading it takes instead."""
    theta_given = any("rope_theta" in params for params in (section(cfg, "rope_parameters"),
                                                            section(cfg, "rope_scaling"), cfg))
    return {k: v for k, v in defaults.items() if k not in cfg and (k != "rope_theta" or not theta_given)}


def defaults_note(where: str, defaults: dict, whose: str) -> str:
    """The load note naming the fields `where` left out and the defaults (`whose`) taken for them."""
    values = ", ".join(f"{k} {v}" + (" (= num_attention_heads)" if k == "num_key_value_heads" and whose.startswith(
        "Llama") else "") for k, v in defaults.items())
    return f"{where} has no {', '.join(defaults)}: took {whose}: {values}"


def rope_theta(cfg: dict, where: str) -> float:
    params = section(cfg, "rope_parameters") or section(cfg, "rope_scaling")
    if "rope_theta" in params:
        return positive(params["rope_theta"], f"{where}.rope_parameters.rope_theta")
    return positive(cfg.get("rope_theta", 10000.0), f"{where}.rope_theta")


def positive(value: object, name: str, integer: bool = False) -> int | float:
    """A positive number (an integer when `integer`) read from a config field; a ConfigError naming it."""
    kind = "a positive integer" if integer else "a positive number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf") \
            or (integer and value != int(value)):
        raise ConfigError(name, kind, shown(value))
    return int(value) if integer else float(value)


def decoder_shape(cfg: dict, where: str) -> dict:
    """Shared fields of an HF Llama / Chameleon config (`where` names it in errors): the sizes are required
    (missing or invalid: a ConfigError naming the field); num_key_value_heads defaults to the head count,
    rms_norm_eps to 1e-6 and the RoPE base to 10000."""
    def size(name: str) -> int:
        if cfg.get(name) is None:
            raise ConfigError(f"{where}.{name}", "a positive integer (the model's size)",
                              "no such field" if name not in cfg else None, "re-download config.json with the model")
        return positive(cfg[name], f"{where}.{name}", integer=True)

    heads = size("num_attention_heads")
    kv_heads = cfg.get("num_key_value_heads")
    shape = dict(dim=size("hidden_size"), n_layer=size("num_hidden_layers"), n_head=heads,
                 n_kv_head=heads if kv_heads is None else positive(kv_heads, f"{where}.num_key_value_heads", True),
                 ffn_dim=size("intermediate_size"), text_vocab_size=size("vocab_size"),
                 norm_eps=positive(cfg.get("rms_norm_eps", 1e-6), f"{where}.rms_norm_eps"),
                 rope_base=rope_theta(cfg, where))
    for flag in ("attention_bias", "mlp_bias"):
        if cfg.get(flag):
            raise ConfigError(f"{where}.{flag}", "false (no biases, as every released checkpoint)", cfg[flag])
    return shape


def chameleon_config(cfg: dict, grid: int, max_prompt: int, row_end: bool = False, cols: int = 0,
                     codes: int | None = None) -> GPTConfig:
    """Anole / Chameleon / Lumina-mGPT; `row_end` (Lumina-mGPT) adds the end-of-row token as the last image code.
    `codes`: the image codes (default: config.json's vq_config, Chameleon's VQGAN)."""
    if codes is None:
        vq = section(cfg, "vq_config")
        codes = positive(vq.get("num_embeddings", vq.get("n_embed", 8192)), "config.json vq_config.num_embeddings",
                         integer=True)
    cfg = {"rms_norm_eps": CHAMELEON_DEFAULTS["rms_norm_eps"], **cfg}  # ChameleonConfig's (Llama's is 1e-6)
    if scales_rope(cfg.get("rope_scaling")):
        raise ConfigError("config.json rope_scaling", "none (plain RoPE, as every release; {\"rope_type\": "
                          "\"default\"} means none)", cfg["rope_scaling"])
    return GPTConfig(**decoder_shape(cfg, "config.json"), vocab_size=codes + int(row_end),
                     model_type="prompt", family="chameleon", qk_norm=True, swin_norm=bool(cfg.get("swin_norm")),
                     rope_dims=1, grid_size=grid, grid_cols=0 if cols == grid else cols, cls_token_num=max_prompt,
                     row_end=row_end)


@dataclass(frozen=True)
class Placement:
    """Where and how a loaded model runs: device, dtype, the VQ decoder's dtype (None: the model's) and the
    weight quantization scheme ("none", "int8", "fp8")."""

    device: torch.device | str = "cpu"
    dtype: torch.dtype = torch.float32
    vq_dtype: torch.dtype | None = None
    weights: str = "none"


def build_prompted(folder: Path, config: GPTConfig, sd: dict[str, torch.Tensor], placement: Placement,
                   notes: list[str], fix: str) -> PromptedImageLM:
    """A `PromptedImageLM` from its mapped state, strictly: layer count checked, built on the meta device,
    weights cast once straight to the run dtype (a 7B bf16 checkpoint never passes through float32), then
    quantized (`placement.weights`) and moved. `sd` is consumed (the model holds the weights). `fix` ends the
    errors (what to do with the folder)."""
    scheme = scheme_named(placement.weights)
    check_layer_count(folder, config, sd, fix)
    model = build_on_meta(PromptedImageLM, config, folder, fix)
    load_state_strict(model, cast_for_load(sd, placement.dtype), folder, fix, assign=True)
    model.rope_table = model._build_rope()
    sd.clear()  # quantizing frees each layer's original
    model = quantize_at_load(model, scheme, notes).to(device=placement.device, dtype=placement.dtype).eval()
    for note in notes:
        log.info("%s: %s", folder.name, note)
    return model


def place_vq(vq, placement: Placement):
    """The VQ decoder (or None) on the model's device, in `placement.vq_dtype` (default the model's dtype)."""
    return None if vq is None else vq.to(device=placement.device, dtype=placement.vq_dtype or placement.dtype)

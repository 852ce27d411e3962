"""Mapping the public Chameleon and Janus-Pro weight layouts onto the shared modules.

Language models: transformers' Chameleon layout (Anole-7b-v0.1-hf, Lumina-mGPT-7B-*: `model.layers.N.
self_attn.q_proj`, per-head `q_norm` / `k_norm`, `lm_head`), transformers' Janus layout (`model.
language_model.*`, `model.generation_*`) and DeepSeek's original Janus-Pro layout (`language_model.model.*`,
`gen_embed`, `gen_aligner.layers.{0,2}`, `gen_head.*`). q/k projections (and Chameleon's QK-norm
parameters) are permuted from rotate-half to interleaved RoPE pairs and fused into `wqkv`.

VQ tokenizers: the taming VQGAN layout of Chameleon's `vqgan.ckpt` (`encoder.down.N.block.M`,
`decoder.up.N` from the highest resolution), transformers' Janus VQ (`decoder.up.N` from the lowest
resolution) and LlamaGen's names (DeepSeek's `gen_vision_model.*`, already ours).

Everything is strict: a tensor that maps nowhere, or one that is missing, is a `CheckpointError`
listing the keys. Reading files and building models is `families.py`; this module only renames,
permutes and slices tensors.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from .checkpoints import HF_LAYER_MAP as LAYER_MAP
from ..config import GPTConfig
from ..errors import CheckpointError
from ..models.rope import interleave_head_norm, permute_rotate_half

QKV = re.compile(r"self_attn\.([qkv])_proj\.weight")
QK_NORM = re.compile(r"self_attn\.([qk])_norm\.(weight|bias)")

# Janus generation path: (transformers name, DeepSeek name) -> ours
JANUS_IMAGE_MAP = {
    ("model.generation_embeddings.weight", "gen_embed.weight"): "image.embedding.weight",
    ("model.generation_aligner.fc1.weight", "gen_aligner.layers.0.weight"): "image.aligner_fc1.weight",
    ("model.generation_aligner.fc1.bias", "gen_aligner.layers.0.bias"): "image.aligner_fc1.bias",
    ("model.generation_aligner.hidden_layers.0.weight", "gen_aligner.layers.2.weight"): "image.aligner_fc2.weight",
    ("model.generation_aligner.hidden_layers.0.bias", "gen_aligner.layers.2.bias"): "image.aligner_fc2.bias",
    ("model.generation_head.proj_out.weight", "gen_head.output_mlp_projector.weight"): "image.head_proj.weight",
    ("model.generation_head.proj_out.bias", "gen_head.output_mlp_projector.bias"): "image.head_proj.bias",
    ("model.generation_head.vision_head.weight", "gen_head.vision_head.weight"): "image.head_out.weight",
    ("model.generation_head.vision_head.bias", "gen_head.vision_head.bias"): "image.head_out.bias",
}
# Parts of a Janus / Chameleon checkpoint that image generation does not use (understanding path,
# text head, VQ weights loaded separately): skipped by prefix, never silently anything else.
JANUS_UNUSED = ("model.vision_model.", "model.aligner.", "lm_head.", "model.vqmodel.", "vision_model.",
                "aligner.", "language_model.lm_head.", "gen_vision_model.")
CHAMELEON_UNUSED = ("model.vqmodel.",)


def map_decoder_layers(path: Path, tensors: dict[str, torch.Tensor], prefix: str,
                       config: GPTConfig) -> dict[str, torch.Tensor]:
    """`{prefix}embed_tokens`, `{prefix}layers.N.*`, `{prefix}norm` (HF Llama / Chameleon names) -> ours.
    Keys outside `prefix` are ignored here (the caller accounts for them)."""
    out: dict[str, torch.Tensor] = {}
    qkv: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if not key.startswith(prefix):
            continue
        rest = key[len(prefix):]
        if rest == "embed_tokens.weight":
            out["tok_embeddings.weight"] = value
        elif rest == "norm.weight":
            out["norm.weight"] = value
        elif m := re.fullmatch(r"layers\.(\d+)\.(.+)", rest):
            layer, name = int(m.group(1)), m.group(2)
            if q := QKV.fullmatch(name):
                qkv.setdefault(layer, {})[q.group(1)] = value
            elif n := QK_NORM.fullmatch(name):
                heads = config.n_head if n.group(1) == "q" else config.n_kv_head
                out[f"layers.{layer}.attention.{n.group(1)}_norm.{n.group(2)}"] = interleave_head_norm(value, heads, config.head_dim)
            elif name in LAYER_MAP:
                out[f"layers.{layer}.{LAYER_MAP[name]}"] = value
            else:
                out[key] = value  # reported as unexpected by the strict load
        else:
            out[key] = value
    for layer, parts in qkv.items():
        if set(parts) != {"q", "k", "v"}:
            raise CheckpointError(path, f"q_proj, k_proj and v_proj in layer {layer}", f"only {sorted(parts)}",
                                  "the checkpoint is incomplete: download it again")
        q = permute_rotate_half(parts["q"], config.n_head)
        k = permute_rotate_half(parts["k"], config.n_kv_head)
        out[f"layers.{layer}.attention.wqkv.weight"] = torch.cat([q, k, parts["v"]], dim=0)
    return out


def _leftovers(tensors: dict[str, torch.Tensor], handled: tuple[str, ...], unused: tuple[str, ...]) -> dict:
    return {k: v for k, v in tensors.items() if not k.startswith(handled) and not k.startswith(unused)}


def chameleon_state(path: Path, tensors: dict[str, torch.Tensor], config: GPTConfig,
                    token_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """transformers' ChameleonForConditionalGeneration keys -> `PromptedImageLM` (family chameleon).
    `token_ids` (V,) are the vocabulary ids of image codes 0..V-1; the head keeps only their rows."""
    out = map_decoder_layers(path, tensors, "model.", config)
    out = {k: v for k, v in out.items() if not k.startswith(CHAMELEON_UNUSED)}
    head = tensors.get("lm_head.weight")
    if head is None:
        raise CheckpointError(path, "lm_head.weight (the language-model head)", "no such tensor",
                              "the folder is incomplete: download every model-*.safetensors shard")
    if int(token_ids.max()) >= head.shape[0]:
        raise CheckpointError(path, f"image token ids below the vocabulary size {head.shape[0]}",
                              f"id {int(token_ids.max())} from the tokenizer", "use the tokenizer.json shipped "
                              "with these weights")
    out["image.head.weight"] = head[token_ids]
    out["image.token_ids"] = token_ids.clone()
    out.update(_leftovers(tensors, ("model.", "lm_head."), CHAMELEON_UNUSED))
    return out


def janus_state(path: Path, tensors: dict[str, torch.Tensor], config: GPTConfig) -> dict[str, torch.Tensor]:
    """transformers' or DeepSeek's Janus-Pro keys -> `PromptedImageLM` (family janus)."""
    hf = "model.language_model.embed_tokens.weight" in tensors
    prefix = "model.language_model." if hf else "language_model.model."
    out = map_decoder_layers(path, tensors, prefix, config)
    image_names = {}
    for names, ours in JANUS_IMAGE_MAP.items():
        theirs = names[0] if hf else names[1]
        image_names[theirs] = ours
        if theirs in tensors:
            out[ours] = tensors[theirs]
    handled = (prefix,) + tuple(image_names)
    out.update(_leftovers(tensors, handled, JANUS_UNUSED))
    return out


# ------------------------------------------------------------------------------------------- VQ

def _map_resnet_levels(key: str, top: str, n_levels: int, reverse: bool) -> str | None:
    """`{top}.{down|up}.L.{block|attn}.M.rest` / `.downsample` / `.upsample` -> our `conv_blocks` names."""
    m = re.fullmatch(rf"{top}\.(?:down|up)\.(\d+)\.(block|attn|downsample|upsample)(?:\.(\d+))?\.(.+)", key)
    if not m:
        return None
    level = int(m.group(1))
    level = n_levels - 1 - level if reverse else level
    kind = {"block": "res", "attn": "attn"}.get(m.group(2), m.group(2))
    index = f".{m.group(3)}" if m.group(3) is not None else ""
    return f"{top}.conv_blocks.{level}.{kind}{index}.{m.group(4)}"


def taming_to_ours(tensors: dict[str, torch.Tensor], decoder_from_highest: bool) -> dict[str, torch.Tensor]:
    """Taming / transformers VQ-GAN names -> ours. Taming counts decoder levels from the highest
    resolution (`decoder_from_highest=True`); transformers' Janus VQ from the lowest. Training-only
    entries (`loss.*`, the discriminator) are dropped."""
    n_dec = len({int(m.group(1)) for k in tensors if (m := re.match(r"decoder\.up\.(\d+)\.", k))})
    n_enc = len({int(m.group(1)) for k in tensors if (m := re.match(r"encoder\.down\.(\d+)\.", k))})
    out = {}
    mids = {"block_1": "0", "attn_1": "1", "block_2": "2"}
    for key, value in tensors.items():
        if key.startswith("loss."):
            continue
        new = (_map_resnet_levels(key, "encoder", n_enc, False)
               or _map_resnet_levels(key, "decoder", n_dec, decoder_from_highest))
        if new is None and (m := re.fullmatch(r"(encoder|decoder)\.mid\.(block_1|attn_1|block_2)\.(.+)", key)):
            new = f"{m.group(1)}.mid.{mids[m.group(2)]}.{m.group(3)}"
        out[new or key] = value
    return out

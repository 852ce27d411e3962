"""A tiny random Lumina-mGPT 2.0 folder as Alpha-VLLM's release lays it out: transformers' Chameleon model
(QK-norm, MHA) saved by `save_pretrained`, its config.json marked as the ChameleonXLLMX training code writes it
(architectures, z_loss_weight) with a `vocabulary_map` naming the image tokens `<MOVQGAN...>`, QK-norm parameters
stored one row per model-parallel shard ((1, head_dim), shared by every head, as its ChameleonLayerNorm repeats
them), tokenizer.json (word-level, with Lumina's special tokens and the image-token block) and a
tokenizer_config.json whose BOS is null (the official wrapper then starts prompts with the EOS), and a tiny
MoVQGAN written as `movqgan_270M.ckpt` (a flat float32 state dict, as ai-forever publishes it).

The reference model keeps its per-head QK-norm rows equal, so transformers' layer computes what the release's
shared rows compute."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tiny_families import WORDS, _randomise, write_tokenizer

MOVQGAN = dict(n_embed=40, embed_dim=4, ddconfig={"double_z": False, "z_channels": 4, "resolution": 32,
                                                  "in_channels": 3, "out_ch": 3, "ch": 32, "ch_mult": [1, 2, 2],
                                                  "num_res_blocks": 1, "attn_resolutions": [8], "dropout": 0.0})
CODES = MOVQGAN["n_embed"]
SPECIALS = ["<racm3:break>", "<eoss>", "<reserved08706>", "<reserved08799>",
            *(f"<reserved{8800 + n:05d}>" for n in range(33))]


def lumina2_vocab() -> dict[str, int]:
    """<pad>, </s>, <unk>, the words, Lumina's special tokens, then the image tokens as one block."""
    names = ["<pad>", "</s>", "<unk>", *WORDS, *SPECIALS, *(f"<MOVQGAN_{c:05d}>" for c in range(CODES))]
    return {name: i for i, name in enumerate(names)}


def reference_movqgan(seed: int = 3) -> torch.nn.Module:
    """MoVQGAN's decoder as its code builds it (tests/reference_movqgan.py), float64, random norms."""
    from reference_movqgan import MoVQGAN

    torch.manual_seed(seed)
    model = MoVQGAN(**MOVQGAN).double().eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.GroupNorm):
                module.weight.copy_(1 + 0.3 * torch.randn(module.weight.shape, generator=generator,
                                                          dtype=torch.float64))
                module.bias.copy_(0.3 * torch.randn(module.bias.shape, generator=generator, dtype=torch.float64))
    return model


def save_lumina2_folder(folder: Path, seed: int = 5, with_movqgan: bool = True):
    """The folder (see the module docstring); returns transformers' model (float32, equal QK-norm rows)."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    vocab = lumina2_vocab()
    config = ChameleonConfig(
        vocab_size=len(vocab) + 4, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=512, vocabulary_map=vocab, bos_token_id=None,
        eos_token_id=vocab["</s>"], pad_token_id=vocab["<pad>"],
        vq_config=dict(embed_dim=16, num_embeddings=8192, latent_channels=32, base_channels=32,
                       channel_multiplier=[1, 2], resolution=32, attn_resolutions=[]))
    model = ChameleonForConditionalGeneration(config).eval()
    _randomise(model, seed)
    with torch.no_grad():  # one row per model-parallel shard (mp = 1): every head shares it
        for layer in model.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                norm.weight.copy_(norm.weight[:1].expand_as(norm.weight))
                norm.bias.copy_(norm.bias[:1].expand_as(norm.bias))
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    shards = sorted(folder.glob("model*.safetensors"))
    for shard in shards:
        tensors = load_file(str(shard))
        tensors = {k: (v[:1].contiguous() if (".q_norm." in k or ".k_norm." in k) else v) for k, v in tensors.items()
                   if not k.startswith("model.vqmodel.")}  # the release deletes the unused VQ before saving
        save_file(tensors, str(shard), metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["ChameleonXLLMXForConditionalGeneration"]
    cfg["z_loss_weight"] = 1e-5
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    write_tokenizer(folder / "tokenizer.json", vocab, [n for n in vocab if n.startswith("<")])
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": None, "eos_token": "</s>",
                                                              "pad_token": "<pad>"}))
    if with_movqgan:
        state = {k: v.float() for k, v in reference_movqgan().state_dict().items()}
        torch.save(state, folder / "movqgan_270M.ckpt")
    return model

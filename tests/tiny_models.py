"""Tiny random-weight LlamaGen GPTs (c2i and t2i) and VQ tokenizers shared by the tests.

Weights use a larger std than LlamaGen's init (0.02 with a zero output layer gives near-uniform
attention and zero logits, which would hide RoPE and mask bugs).
"""
from __future__ import annotations

import torch

from lantern_core.config import GPTConfig, VQConfig
from lantern_core.models.gpt import LlamaGenGPT
from lantern_core.models.vq import VQModel

TINY_C2I = GPTConfig(dim=64, n_layer=2, n_head=4, vocab_size=48, model_type="c2i", num_classes=5,
                     cls_token_num=1, grid_size=4)
TINY_T2I = GPTConfig(dim=64, n_layer=2, n_head=4, vocab_size=48, model_type="t2i", caption_dim=24,
                     cls_token_num=6, grid_size=4)
TINY_GQA = GPTConfig(dim=64, n_layer=2, n_head=4, n_kv_head=2, vocab_size=48, model_type="c2i",
                     num_classes=5, cls_token_num=1, grid_size=4)
TINY_VQ = VQConfig(codebook_size=32, codebook_embed_dim=4, ch=32, encoder_ch_mult=(1, 1, 2),
                   decoder_ch_mult=(1, 1, 2), z_channels=32, num_res_blocks=1)


def random_gpt(config: GPTConfig, seed: int = 0, std: float = 0.3) -> LlamaGenGPT:
    model = LlamaGenGPT(config)
    g = torch.Generator().manual_seed(seed)
    model.init_weights(g, std=std)
    with torch.no_grad():
        model.output.weight.normal_(0.0, std, generator=g)
        for layer in model.layers:
            for norm in (layer.attention_norm, layer.ffn_norm):
                norm.weight.uniform_(0.5, 1.5, generator=g)
    return model.eval()


def random_vq(config: VQConfig = TINY_VQ, seed: int = 0) -> VQModel:
    model = VQModel(config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


def random_drafter(target: LlamaGenGPT, seed: int = 1, std: float = 0.1):
    """A random EAGLE drafter that fits `target` (rarely accepted: exercises every rejection path)."""
    from lantern_core.config import DrafterConfig
    from lantern_core.models.drafter import EagleDrafter

    drafter = EagleDrafter(DrafterConfig.for_target(target.config, ffn_dim=96))
    drafter.init_from_target(target, torch.Generator().manual_seed(seed), std=std)
    with torch.no_grad():
        drafter.layers[0].ffn_norm.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(seed))
    return drafter.eval()

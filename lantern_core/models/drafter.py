"""The EAGLE-style feature drafter LANTERN pairs with its targets (one decoder layer on [embedding; feature]).

Given the target's last hidden state f_s and the embedding of the next token x_{s+1}, it predicts the
next feature: h = fc([emb(x_{s+1}); f_s]) + b (the embedding times `embed_scale` where a drafter
declares one, as LANTERN's Lumina-mGPT drafter), then one decoder block, no final norm. Logits come from
the target's frozen head. For LlamaGen (`cnets_llamagen`) the block's attention has no input norm and
2-D RoPE; for Chameleon (`cnets_anole`) and Janus it is a full decoder layer of the target's kind
(input norm, QK-norm for Chameleon, 1-D RoPE). The block is the same `TransformerBlock` the target uses
(one attention / KV-cache machinery); `embed_tokens` holds the target's input embedding of every image
code (V, dim), whatever the family's embedding path. Over a prompted family's prompt the drafter sees
the target's embeddings of the next prompt tokens (passed in as `embeddings`). The released
checkpoints' names are mapped onto it by `drafter_io.py`. Drafting policy (trees, sampling) is elsewhere.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..config import DrafterConfig
from .gpt import ROPE_EXTRA_ROWS, ForwardStep, Fp32Rope, TransformerBlock
from .kv_cache import KVCache
from .rope import build_rope_1d, build_rope_2d

ROPE_1D_SPARE = 1024  # 1-D table rows past prefix + image: room for draft trees at the last tokens


class EagleDrafter(Fp32Rope):
    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.config = config
        block = config.block_config()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.dim)
        self.fc = nn.Linear(2 * config.dim, config.dim, bias=config.bias)
        self.layers = nn.ModuleList([TransformerBlock(block)])
        if not config.input_norm:
            self.layers[0].attention_norm = nn.Identity()  # LlamaGen's drafter layer has no input norm
        self.embed_tokens.weight.requires_grad_(False)  # frozen, as in EAGLE / LANTERN
        self.register_buffer("rope_table", self._build_rope(), persistent=False)

    def _build_rope(self) -> torch.Tensor:
        c = self.config
        if c.rope_dims == 1:
            return build_rope_1d(self.max_seq_len + ROPE_1D_SPARE, c.dim // c.n_head, c.rope_base)
        return build_rope_2d(c.grid_size, c.dim // c.n_head, c.rope_base, c.cls_token_num,
                             extra_rows=ROPE_EXTRA_ROWS + 1)

    @property
    def max_seq_len(self) -> int:
        """Prefix plus every image token, an end-of-row token per row included (Lumina-mGPT), plus one."""
        rows, cols = self.config.grid_shape
        return self.config.cls_token_num + rows * (cols + 1) + 1

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, step: ForwardStep,
                embeddings: torch.Tensor | None = None) -> torch.Tensor:
        """features (B, T, dim) target (or drafted) features f_s, tokens (B, T) image codes x_{s+1} ->
        f^_{s+1} (B, T, dim). `embeddings` (B, T, dim), when given, replaces the token embeddings (a
        prompted family's prompt positions)."""
        emb = (self.embed_tokens(tokens) if embeddings is None else embeddings).to(features.dtype)
        if self.config.embed_scale > 1.0:  # LANTERN's embed_upscale: every input embedding, after the cast
            emb = emb * self.config.embed_scale
        h = self.fc(torch.cat([emb, features], dim=-1))  # (B, T, 2*dim) -> (B, T, dim)
        return self.layers[0](h, self.rope_table[step.positions], step.with_additive_mask(h.dtype), 0)

    def allocate_cache(self, batch: int, max_len: int, device=None, dtype=None) -> KVCache:
        weight = self.fc.weight
        c = self.config
        return KVCache.allocate(1, batch, c.n_kv_head, max_len, c.dim // c.n_head,
                                device or weight.device, dtype or weight.dtype)

    @torch.no_grad()
    def init_from_target(self, target: nn.Module, generator: torch.Generator | None = None, std: float = 0.02) -> None:
        """Fresh drafter for `target`: its input embedding of every image code (frozen), N(0, std) linear
        weights, zero fc bias, identity norms."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0.0, std, generator=generator)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        codes = torch.arange(self.config.vocab_size, device=self.embed_tokens.weight.device)
        self.embed_tokens.weight.copy_(target.embed_tokens(codes[None])[0])

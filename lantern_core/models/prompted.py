"""Prompted image language models on the shared trunk: Chameleon (Anole, Lumina-mGPT) and Janus-Pro.

Both are a Llama-style decoder over a text prompt followed by image tokens; they differ only in how an
image code enters and leaves the trunk, which is all this module adds (`ImageTransformer` does the rest,
with `qk_norm` / `swin_norm` / 1-D RoPE from the config):

- Chameleon: image codes are ordinary tokens of the 65,536-entry vocabulary (`token_ids[code]`, read
  from the tokenizer's IMGIMG names); inputs use the shared token embedding and the logits are the
  language-model head's rows for those tokens (only those rows are kept, so the other 57k are never
  computed and sampling can only produce image tokens, as LANTERN's Anole path enforces by masking).
- Janus-Pro: a separate codebook embedding (16,384 x 8) and a two-layer GELU aligner into the trunk,
  and a generation head (linear, GELU, linear) out of it.

`embed_tokens` / `logits` therefore speak image codes 0..V-1 for every family, so AR, trees and Jacobi
decoders run unchanged. Weight-name mapping from the public layouts is in `family_io.py`; prompt
formats and CFG conventions in `prompts.py`. This module does not read files or tokenise text.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..config import GPTConfig
from ..errors import ConfigError
from .gpt import HeadLayerNorm, ImageTransformer, RMSNorm


class ChameleonImageIO(nn.Module):
    """Image codes as vocabulary tokens: `token_ids` (V,) maps code -> token id; `head` holds the
    language-model head's rows of those tokens (V, dim)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.register_buffer("token_ids", torch.arange(config.vocab_size, dtype=torch.long))
        self.head = nn.Linear(config.dim, config.vocab_size, bias=False)

    def embed(self, codes: torch.Tensor, tok_embeddings: nn.Embedding) -> torch.Tensor:
        return tok_embeddings(self.token_ids[codes])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(hidden)


class JanusImageIO(nn.Module):
    """Janus' generation path: codebook embedding -> aligner (fc1, GELU, fc2) -> trunk -> head
    (proj_out, GELU, vision_head). Aligner and head are the trunk's width, as in every Janus-Pro release
    (a checkpoint with other widths fails the strict load with the shapes named)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        V, E, P = config.vocab_size, config.image_embed_dim, config.dim
        self.embedding = nn.Embedding(V, E)
        self.aligner_fc1 = nn.Linear(E, P)
        self.aligner_fc2 = nn.Linear(P, P)
        self.head_proj = nn.Linear(config.dim, P)
        self.head_out = nn.Linear(P, V)

    def embed(self, codes: torch.Tensor, tok_embeddings: nn.Embedding) -> torch.Tensor:
        return self.aligner_fc2(F.gelu(self.aligner_fc1(self.embedding(codes))))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head_out(F.gelu(self.head_proj(hidden)))


IMAGE_IO = {"chameleon": ChameleonImageIO, "janus": JanusImageIO}


class PromptedImageLM(ImageTransformer):
    """A text-prompted image LM. `tok_embeddings` embeds prompt tokens; `image` adapts image codes."""

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        if config.model_type != "prompt" or config.family not in IMAGE_IO:
            raise ConfigError("GPTConfig.family", f"one of {sorted(IMAGE_IO)} with model_type 'prompt'",
                              f"{config.family!r} / {config.model_type!r}")
        self.tok_embeddings = nn.Embedding(config.text_vocab_size, config.dim)
        self._build_trunk()
        self.image = IMAGE_IO[config.family](config)
        self.register_buffer("rope_table", self._build_rope(), persistent=False)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None, std: float = 0.02) -> None:
        """Random weights for tests and benchmarks: N(0, std) linear/embedding weights, zero biases,
        unit norms; image codes map to distinct tokens 4..V+3 for Chameleon (its layout)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, std, generator=generator)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (RMSNorm, HeadLayerNorm)):  # unit norms (also after `to_empty`)
                nn.init.ones_(module.weight)
                if isinstance(module, HeadLayerNorm):
                    nn.init.zeros_(module.bias)
        if isinstance(self.image, ChameleonImageIO):
            V = self.config.vocab_size
            if V + 4 > self.config.text_vocab_size:
                raise ConfigError("GPTConfig.text_vocab_size", f"at least vocab_size + 4 = {V + 4}",
                                  self.config.text_vocab_size)
            self.image.token_ids.copy_(torch.arange(4, V + 4))

    def embed_prompt(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Prompt token ids (B, T) -> (B, T, dim)."""
        return self.tok_embeddings(token_ids)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image codes (B, T) in 0..V-1 -> trunk inputs (B, T, dim)."""
        return self.image.embed(tokens, self.tok_embeddings)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states (..., dim) -> float32 logits over the image codes (..., V)."""
        return self.image.logits(hidden).float()

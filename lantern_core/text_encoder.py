"""Caption features for text-conditional LlamaGen: Flan-T5-XL's encoder through transformers, from a
local folder only (never the hub), 120 tokens, left-padded exactly as LlamaGen's sampler does.

It returns a `Condition` ready for `generate`; the unconditional rows come from the GPT's saved
`uncond_embedding` (see `conditioning.py`), not from here. LlamaGen's `clean_caption` (which needs
ftfy and BeautifulSoup) is replaced by whitespace/HTML-entity normalisation.
"""
from __future__ import annotations

import html
import re
from pathlib import Path

import torch

from .conditioning import Condition
from .errors import CheckpointError

T5_MAX_TOKENS = 120
T5_FIX = ("put the google/flan-t5-xl files (config.json, model.safetensors or its shards, "
          "tokenizer.json or spiece.model, tokenizer_config.json) in one folder, e.g. "
          "ComfyUI/models/lantern/text_encoders/flan-t5-xl")


def text_encoder_dtype(gpt_dtype: torch.dtype) -> torch.dtype:
    """T5 runs in fp32 beside an fp32 GPT, else in bf16 (T5 activations overflow fp16)."""
    return torch.float32 if gpt_dtype == torch.float32 else torch.bfloat16


def clean_prompt(text: str) -> str:
    text = html.unescape(html.unescape(text))
    return re.sub(r"\s+", " ", text).strip()


def left_pad(features: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Move each row's valid (right-padded) tokens to the end and zero the rest.

    features (B, T, C), mask (B, T) bool with valid tokens first -> left-padded (features, mask).
    """
    B, T, _ = features.shape
    valid = mask.sum(-1, keepdim=True)  # (B, 1)
    target = torch.arange(T, device=features.device)[None, :]  # (1, T)
    source = target - (T - valid)  # index each output slot reads from; < 0 means padding
    new_mask = source >= 0
    gathered = features.gather(1, source.clamp(min=0)[:, :, None].expand_as(features))
    return gathered * new_mask[:, :, None].to(features.dtype), new_mask


class T5CaptionEncoder:
    """Flan-T5 encoder loaded offline from `folder`. Device and dtype are the caller's."""

    def __init__(self, folder: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 max_tokens: int = T5_MAX_TOKENS):
        folder = Path(folder)
        if not (folder / "config.json").is_file():
            raise CheckpointError(folder, "a T5 encoder folder with config.json", "no config.json there", T5_FIX)
        from transformers import AutoTokenizer, T5EncoderModel

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
            self.model = T5EncoderModel.from_pretrained(str(folder), local_files_only=True, dtype=dtype)
        except (OSError, ValueError) as exc:
            raise CheckpointError(folder, "a complete T5 encoder folder", f"an unusable folder ({exc})", T5_FIX) from exc
        self.model = self.model.to(device).eval()
        self.max_tokens = max_tokens

    @classmethod
    def from_parts(cls, tokenizer, model, max_tokens: int = T5_MAX_TOKENS) -> "T5CaptionEncoder":
        """Wrap an already loaded tokenizer and encoder (e.g. one that a host placed on its device)."""
        encoder = cls.__new__(cls)
        encoder.tokenizer, encoder.model, encoder.max_tokens = tokenizer, model, max_tokens
        return encoder

    @property
    def feature_dim(self) -> int:
        return self.model.config.d_model

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> Condition:
        """prompts -> Condition with left-padded caption (B, max_tokens, d_model) and its mask."""
        batch = self.tokenizer([clean_prompt(p) for p in prompts], max_length=self.max_tokens,
                               padding="max_length", truncation=True, return_tensors="pt")
        device = self.model.device
        ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
        features = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        caption, caption_mask = left_pad(features.float(), mask.bool())
        return Condition(caption=caption, caption_mask=caption_mask)

"""What an image is conditioned on: class labels (c2i) or left-padded caption features (t2i), and
how the model turns that into prefix embeddings plus a key-validity mask, with the unconditional
rows for classifier-free guidance. It does not run text encoders (see `text_encoder.py`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import ConfigError
from .models.gpt import LlamaGenGPT


@dataclass(frozen=True)
class Condition:
    labels: torch.Tensor | None = None  # (B,) long, c2i
    caption: torch.Tensor | None = None  # (B, T_cap, caption_dim), left-padded, t2i
    caption_mask: torch.Tensor | None = None  # (B, T_cap) bool, True on real (not padded) tokens

    def __post_init__(self) -> None:
        if (self.labels is None) == (self.caption is None):
            raise ConfigError("condition", "exactly one of labels (c2i) or caption (t2i)",
                              "both" if self.labels is not None else "neither")

    @classmethod
    def classes(cls, labels, device=None) -> "Condition":
        return cls(labels=torch.as_tensor(labels, dtype=torch.long, device=device).reshape(-1))

    def row(self, i: int) -> "Condition":
        """The condition of sample i alone (speculative decoders draw one image at a time)."""
        if self.labels is not None:
            return Condition(labels=self.labels[i:i + 1])
        mask = None if self.caption_mask is None else self.caption_mask[i:i + 1]
        return Condition(caption=self.caption[i:i + 1], caption_mask=mask)

    @property
    def batch(self) -> int:
        return (self.labels if self.labels is not None else self.caption).shape[0]


@dataclass
class Prefix:
    embeddings: torch.Tensor  # (rows, T, dim): [cond; uncond] rows when guided
    key_valid: torch.Tensor  # (rows, T) bool
    padded: bool  # whether any prefix key is masked


def build_prefix(model: LlamaGenGPT, condition: Condition, guided: bool) -> Prefix:
    """Prefix embeddings for `condition`, with unconditional rows appended when `guided`."""
    config = model.config
    device = model.tok_embeddings.weight.device
    if config.model_type == "c2i":
        if condition.labels is None:
            raise ConfigError("condition", "class labels for a class-conditional (c2i) model", "a caption")
        labels = condition.labels.to(device)
        if labels.numel() and (labels.min() < 0 or labels.max() >= config.num_classes):
            raise ConfigError("class label", f"an integer in 0..{config.num_classes - 1}", labels.tolist())
        if guided:
            labels = torch.cat([labels, torch.full_like(labels, config.num_classes)])
        emb = model.embed_condition(labels)
        return Prefix(emb, torch.ones(emb.shape[:2], dtype=torch.bool, device=device), padded=False)
    if condition.caption is None:
        raise ConfigError("condition", "caption features for a text-conditional (t2i) model", "class labels")
    caption = condition.caption.to(device=device, dtype=model.tok_embeddings.weight.dtype)
    if caption.shape[1:] != (config.cls_token_num, config.caption_dim):
        raise ConfigError("caption features", f"shape (B, {config.cls_token_num}, {config.caption_dim})",
                          tuple(caption.shape), "encode prompts with lantern_core.text_encoder")
    mask = condition.caption_mask
    mask = torch.ones(caption.shape[:2], dtype=torch.bool, device=device) if mask is None else mask.to(device).bool()
    if guided:  # LlamaGen: the unconditional rows are `uncond_embedding` under the same key mask
        uncond = model.cls_embedding.uncond_embedding.to(caption.dtype)
        caption = torch.cat([caption, uncond[None].expand_as(caption)])
        mask = torch.cat([mask, mask])
    return Prefix(model.embed_condition(caption), mask, padded=not bool(mask.all()))

"""What an image is conditioned on: class labels (c2i), left-padded caption features (t2i) or left-padded
prompt token ids with their unconditional counterparts (prompted families: Chameleon, Janus-Pro), and
how the model turns that into prefix embeddings plus a key-validity mask, with the unconditional
rows for classifier-free guidance. It does not run text encoders or tokenisers (see `text_encoder.py`,
`prompts.py`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import GPTConfig
from .errors import ConfigError
from .models.gpt import ImageTransformer


@dataclass(frozen=True)
class Condition:
    labels: torch.Tensor | None = None  # (B,) long, c2i
    caption: torch.Tensor | None = None  # (B, T_cap, caption_dim), left-padded, t2i
    caption_mask: torch.Tensor | None = None  # (B, T_cap) bool, True on real (not padded) tokens
    prompt_ids: torch.Tensor | None = None  # (B, T) long, left-padded prompt tokens (prompted families)
    prompt_mask: torch.Tensor | None = None  # (B, T) bool, True on real tokens
    uncond_ids: torch.Tensor | None = None  # (B, T_u) long, the family's unconditional (CFG) prompt
    uncond_mask: torch.Tensor | None = None  # (B, T_u) bool

    def __post_init__(self) -> None:
        given = [name for name in ("labels", "caption", "prompt_ids") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ConfigError("condition", "exactly one of labels (c2i), caption (t2i) or prompt_ids (prompted "
                              "families)", ", ".join(given) or "none")
        if self.prompt_ids is not None:
            for ids, mask, name in ((self.prompt_ids, self.prompt_mask, "prompt"),
                                    (self.uncond_ids, self.uncond_mask, "uncond")):
                if ids is None or mask is None or ids.dim() != 2 or ids.shape != mask.shape:
                    raise ConfigError(f"condition.{name}_ids", "(B, T) token ids with a (B, T) mask",
                                      None if ids is None else tuple(ids.shape))

    @classmethod
    def classes(cls, labels, device=None) -> "Condition":
        return cls(labels=torch.as_tensor(labels, dtype=torch.long, device=device).reshape(-1))

    def row(self, i: int) -> "Condition":
        """The condition of sample i alone."""
        if self.labels is not None:
            return Condition(labels=self.labels[i:i + 1])
        if self.prompt_ids is not None:
            return Condition(prompt_ids=self.prompt_ids[i:i + 1], prompt_mask=self.prompt_mask[i:i + 1],
                             uncond_ids=self.uncond_ids[i:i + 1], uncond_mask=self.uncond_mask[i:i + 1])
        mask = None if self.caption_mask is None else self.caption_mask[i:i + 1]
        return Condition(caption=self.caption[i:i + 1], caption_mask=mask)

    def first(self, n: int) -> "Condition":
        """The condition of the first `n` samples."""
        return Condition(**{f: None if getattr(self, f) is None else getattr(self, f)[:n]
                            for f in self.__dataclass_fields__})

    def repeated(self, times: int) -> "Condition":
        """Every sample repeated `times` times in a row (a batch of copies, e.g. a calibration batch)."""
        return Condition(**{f: None if getattr(self, f) is None else getattr(self, f).repeat_interleave(times, 0)
                            for f in self.__dataclass_fields__})

    def to(self, device: torch.device | str) -> "Condition":
        """The same condition with every tensor on `device`."""
        return Condition(**{f: None if getattr(self, f) is None else getattr(self, f).to(device)
                            for f in self.__dataclass_fields__})

    @property
    def batch(self) -> int:
        for value in (self.labels, self.caption, self.prompt_ids):
            if value is not None:
                return value.shape[0]


@dataclass
class Prefix:
    embeddings: torch.Tensor  # (rows, T, dim): [cond; uncond] rows when guided
    key_valid: torch.Tensor  # (rows, T) bool
    padded: bool  # whether any prefix key is masked
    token_ids: torch.Tensor | None = None  # (rows, T) prompt token ids (prompted families), else None


@dataclass(frozen=True)
class PrefixShape:
    rows: int  # [cond; uncond] rows when guided
    length: int  # T: prefix positions per row
    padded: bool  # whether any prefix key is masked
    prompted: bool  # whether the prefix carries prompt token ids (prompted families)


def prefix_shape(config: GPTConfig, condition: Condition, guided: bool) -> PrefixShape:
    """Rows, length and padding of the prefix `build_prefix` makes for `condition` on a model of `config`, read
    from the condition's shapes and masks alone (where the caller made them, usually the host): the one rule the
    prefix builders and the memory planner's meta-device prefix share. Refuses a condition of the wrong kind for
    the model, naming what the model needs."""
    rows = condition.batch * (2 if guided else 1)
    if config.model_type == "prompt":
        if condition.prompt_ids is None:
            raise ConfigError("condition", f"prompt token ids for a {config.family} model",
                              "class labels" if condition.labels is not None else "caption features",
                              "encode the prompt with lantern_core.prompts.PromptEncoder")
        length = condition.prompt_ids.shape[1]
        padded = not bool(condition.prompt_mask.all())
        if guided:  # both halves are left-padded to the longer one
            uncond = condition.uncond_ids.shape[1]
            padded = padded or uncond != length or not bool(condition.uncond_mask.all())
            length = max(length, uncond)
        return PrefixShape(rows, length, padded, prompted=True)
    if config.model_type == "c2i":
        if condition.labels is None:
            raise ConfigError("condition", "class labels for a class-conditional (c2i) model", "a caption")
        return PrefixShape(rows, config.cls_token_num, padded=False, prompted=False)
    if condition.caption is None:
        raise ConfigError("condition", "caption features for a text-conditional (t2i) model", "class labels")
    mask = condition.caption_mask  # the unconditional rows share it
    return PrefixShape(rows, condition.caption.shape[1], mask is not None and not bool(mask.all()), prompted=False)


def left_pad(ids: torch.Tensor, mask: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (B, T) and mask (B, T) padded on the left to `length` (pad id 0, masked out)."""
    pad = length - ids.shape[1]
    if pad == 0:
        return ids, mask
    return (torch.cat([ids.new_zeros(ids.shape[0], pad), ids], 1),
            torch.cat([mask.new_zeros(mask.shape[0], pad), mask], 1))


def build_prompt_prefix(model: ImageTransformer, condition: Condition, guided: bool) -> Prefix:
    """Prompted families: token embeddings of [cond; uncond] rows, left-padded to one length with the
    padding masked out of attention (RoPE is relative, so the offset padding adds changes nothing)."""
    config = model.config
    device = model.tok_embeddings.weight.device
    shape = prefix_shape(config, condition, guided)
    ids, mask = condition.prompt_ids.to(device), condition.prompt_mask.to(device).bool()
    if guided:
        ids, mask = left_pad(ids, mask, shape.length)
        u_ids, u_mask = left_pad(condition.uncond_ids.to(device), condition.uncond_mask.to(device).bool(), shape.length)
        ids, mask = torch.cat([ids, u_ids]), torch.cat([mask, u_mask])
    if ids.shape[1] > config.cls_token_num:
        raise ConfigError("prompt", f"at most {config.cls_token_num} tokens (the model's max_prompt_tokens)",
                          f"{ids.shape[1]} tokens", "shorten the prompt or load the model with a larger "
                          "max_prompt_tokens")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= config.text_vocab_size):
        raise ConfigError("prompt token ids", f"ids in 0..{config.text_vocab_size - 1}",
                          (int(ids.min()), int(ids.max())), "use the tokenizer shipped with the model")
    return Prefix(model.embed_prompt(ids), mask, padded=shape.padded, token_ids=ids)


def build_prefix(model: ImageTransformer, condition: Condition, guided: bool) -> Prefix:
    """Prefix embeddings for `condition`, with unconditional rows appended when `guided`."""
    config = model.config
    device = model.tok_embeddings.weight.device
    if config.model_type == "prompt":
        return build_prompt_prefix(model, condition, guided)
    shape = prefix_shape(config, condition, guided)
    if config.model_type == "c2i":
        labels = condition.labels  # checked where it was made (the host): no device sync before capture
        if labels.numel() and (labels.min() < 0 or labels.max() >= config.num_classes):
            raise ConfigError("class label", f"an integer in 0..{config.num_classes - 1}", labels.tolist())
        labels = labels.to(device)
        if guided:
            labels = torch.cat([labels, torch.full_like(labels, config.num_classes)])
        emb = model.embed_condition(labels)
        return Prefix(emb, torch.ones(emb.shape[:2], dtype=torch.bool, device=device), padded=shape.padded)
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
    return Prefix(model.embed_condition(caption), mask, padded=shape.padded)

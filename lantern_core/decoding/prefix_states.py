"""The target features a drafter reads over the prefix, and the keys it may attend to there, in the
convention the drafter was trained with (`DrafterConfig.prefix_states`).

Two conventions differ on a left-padded prefix (LlamaGen-T2I captions, batched prompts):

* "native": LlamaGen's own forward. A padded caption row attends only to itself, and the drafter masks
  padded keys as the target does. Drafters trained here and LANTERN's Anole drafter expect it.
* "hf_port": LANTERN's HF port of LlamaGen-T2I, whose hidden states its released t2i drafters
  (`jadohu/llamagen_drafter`, `llamagen2_drafter`) were trained on. Its additive mask puts the same
  finite `finfo.min` on every key of a padded row (its earlier keys are padding, its later ones are in
  the future), so the row attends uniformly over every position of the prefill (the caption only),
  later valid caption rows included. Its drafter attends causally to every earlier position, padded
  ones included. (LANTERN's training-data script ran the port over caption + image tokens at once, so
  there a padded row also averaged over the image tokens; we follow its generator, with which its
  speed-ups were measured, and train `--prefix-states hf_port` drafters on exactly what we decode with.)

Every valid query masks padded keys in both, so the valid rows, the target's KV cache and every image
logit are the same. The hf_port states therefore come from a second, cache-free forward over the
prefix; only its padded rows are used, and only in the features handed to the drafter (valid rows
stay bit-identical to the prefill's). Uniform means the scores are all equal: on LlamaGen's prefix
q = k = 0 (zero RoPE rows), so every score is exactly `finfo.min` in any dtype, as in the HF port.

This module builds those features and masks; it does not decode or train.
"""
from __future__ import annotations

import torch

from ..models.gpt import ForwardStep, ImageTransformer


def hf_port_mask(key_valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The HF port's 4-D additive mask over a prefix: key_valid (rows, T) bool -> (rows, 1, T, T) of `dtype`,
    0 where the key is earlier-or-same and valid, `finfo(dtype).min` elsewhere (no diagonal exception, so a
    padded row has every key at the same finite minimum)."""
    T = key_valid.shape[1]
    pos = torch.arange(T, device=key_valid.device)
    allowed = (pos[None, :] <= pos[:, None])[None] & key_valid[:, None, :]  # (rows, T queries, T keys)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=key_valid.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]


def hf_port_states(model: ImageTransformer, embeddings: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
    """The HF port's final hidden states over a prefix: embeddings (rows, T, dim), key_valid (rows, T) ->
    (rows, T, dim). Writes no cache."""
    positions = torch.arange(embeddings.shape[1], device=embeddings.device)
    return model(embeddings, ForwardStep(positions, mask=hf_port_mask(key_valid, embeddings.dtype)))


def drafter_features(model: ImageTransformer, embeddings: torch.Tensor, key_valid: torch.Tensor,
                     hidden: torch.Tensor, convention: str) -> torch.Tensor:
    """The features a drafter of `convention` reads over a prefix: `hidden` (rows, T, dim), the prefill's
    states of the prefix `embeddings` (rows, T, dim) with `key_valid` (rows, T), its padded rows replaced
    by the HF port's under "hf_port". Unpadded prefixes and "native" return `hidden` itself."""
    if convention == "native" or bool(key_valid.all()):
        return hidden
    port = hf_port_states(model, embeddings, key_valid)
    return torch.where(key_valid[..., None], hidden, port)  # valid rows: the prefill's own bits


def drafter_key_valid(convention: str, key_valid: torch.Tensor) -> torch.Tensor:
    """The drafter's key mask (rows, slots): the target's own tensor ("native", shared so the prefill's
    writes reach it), or a tensor marking every key valid ("hf_port")."""
    return key_valid if convention == "native" else torch.ones_like(key_valid)

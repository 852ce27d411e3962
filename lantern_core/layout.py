"""Image-token layouts with forced tokens: Lumina-mGPT ends every image row with an end-of-row token.

For a model with `config.row_end`, image token i (0-based, over grid_size rows of cols + 1 tokens)
is the end-of-row token when (i + 1) % (cols + 1) == 0; it is image code `vocab_size - 1` (the
Chameleon head keeps that vocabulary row too). `constrain` applies Lumina's rule to CFG-combined logits,
as its reference generator does before top-k: at end-of-row positions every other token is impossible
(the forced token has probability 1, so every decoder accepts it), elsewhere the end-of-row token is.
Every decoder calls it through `ImageTransformer.constrain_logits`, so AR, trees and Jacobi windows keep
the layout without knowing about it. `image_codes` drops the end-of-row cells for the VQ decoder;
`draftable_codes` counts the codes a draft can choose between.
Models without forced tokens pass through untouched. This module does not sample or decode.
"""
from __future__ import annotations

import torch

from .config import GPTConfig


def row_end_positions(config: GPTConfig, index: torch.Tensor) -> torch.Tensor:
    """Bool tensor shaped like `index` (image-token indices): True where the token is forced end-of-row."""
    return (index + 1) % config.row_stride == 0


def constrain(config: GPTConfig, logits: torch.Tensor, index: torch.Tensor | int) -> torch.Tensor:
    """Combined logits (..., T, V) for image-token indices `index` ((T,), (G, T) or an int for (B, V)
    logits) -> logits with the row layout enforced (unchanged without `row_end`)."""
    if not config.row_end:
        return logits
    index = torch.as_tensor(index, device=logits.device)
    forced = row_end_positions(config, index).expand(logits.shape[:-1])[..., None]  # (..., T, 1)
    code = logits.shape[-1] - 1
    is_code = torch.arange(logits.shape[-1], device=logits.device) == code  # (V,)
    # built by kernels only (no host-to-device copy), so the step functions stay capturable
    only_row_end = torch.zeros(logits.shape[-1], dtype=logits.dtype, device=logits.device).masked_fill(
        ~is_code, float("-inf"))
    return torch.where(forced, only_row_end, logits.masked_fill(is_code, float("-inf")))


def image_codes(config: GPTConfig, tokens: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
    """Generated tokens (B, num_image_tokens) -> VQ codes (B, rows * cols) and the (rows, cols) grid."""
    rows, cols = config.grid_shape
    if not config.row_end:
        return tokens, (rows, cols)
    return tokens.reshape(tokens.shape[0], rows, config.row_stride)[:, :, :cols].reshape(tokens.shape[0], -1), \
        (rows, cols)


def extend_neighbors(config: GPTConfig, neighbors: torch.Tensor | None) -> torch.Tensor | None:
    """A (codebook, k) latent-neighbour table -> (vocab_size, k): the end-of-row code is its own only
    neighbour, so relaxation never moves mass onto or off it."""
    if neighbors is None or not config.row_end or neighbors.shape[0] == config.vocab_size:
        return neighbors
    code = config.vocab_size - 1
    own = torch.full((1, neighbors.shape[1]), code, dtype=neighbors.dtype, device=neighbors.device)
    return torch.cat([neighbors, own])


def draftable_codes(config) -> int:
    """The image codes a draft can choose between at one position: the vocabulary, less Lumina-mGPT's
    end-of-row code (`config.row_end`, the last code), which is forced at the end of every row and refused
    everywhere else (`layout.constrain`), so no node has more than vocab_size - 1 children worth drafting."""
    return config.vocab_size - int(config.row_end)

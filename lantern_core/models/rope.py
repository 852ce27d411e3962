"""Rotary position embeddings: LlamaGen's 2-D grid table and Llama's 1-D table.

Builds the (rows, head_dim/2, 2) table of (cos, sin) and applies it to interleaved (2j, 2j+1) pairs.
Rows 0..prefix_len-1 are all zeros (LlamaGen's quirk: q and k vanish on the conditioning prefix);
row prefix_len + r*G + c rotates the first half of the pairs by the grid row r and the second half by
the column c. Extra zero rows past the grid absorb speculative positions that overrun the image.
This module does not know about models or caches.
"""
from __future__ import annotations

import torch


def build_rope_2d(grid_size: int, head_dim: int, base: float = 10000.0, prefix_len: int = 1,
                  extra_rows: int = 0) -> torch.Tensor:
    """Return the float32 table of shape (prefix_len + grid_size**2 + extra_rows, head_dim // 2, 2)."""
    half = head_dim // 2
    # D/4 frequencies: omega_i = base ** (-2i / half), i = 0 .. half/2 - 1
    exponents = torch.arange(0, half, 2, dtype=torch.float64)[: half // 2] / half
    freqs = 1.0 / (base ** exponents)  # (half/2,)
    t = torch.arange(grid_size, dtype=torch.float64)
    angles_1d = torch.outer(t, freqs)  # (G, half/2)
    rows = angles_1d[:, None, :].expand(grid_size, grid_size, -1)  # angle by row r, (G, G, half/2)
    cols = angles_1d[None, :, :].expand(grid_size, grid_size, -1)  # angle by column c
    angles = torch.cat([rows, cols], dim=-1).reshape(grid_size * grid_size, half)  # (G*G, half)
    grid_table = torch.stack([torch.cos(angles), torch.sin(angles)], dim=-1).float()  # (G*G, half, 2)
    prefix = torch.zeros(prefix_len, half, 2)
    tail = torch.zeros(extra_rows, half, 2)
    return torch.cat([prefix, grid_table, tail], dim=0)


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate x of shape (B, T, H, D) by table rows of shape (T, D/2, 2) or (B, T, D/2, 2); fp32 maths.
    One complex multiply per pair (few kernels eagerly); under torch.compile the same products written in
    reals, which Inductor fuses (it generates no code for complex numbers)."""
    if torch.compiler.is_compiling():
        xs = x.float().reshape(*x.shape[:-1], -1, 2)  # (B, T, H, D/2, 2)
        t = (table if table.dim() == 4 else table[None])[:, :, None]  # (B|1, T, 1, D/2, 2) as (cos, sin)
        real = xs[..., 0] * t[..., 0] - xs[..., 1] * t[..., 1]
        imag = xs[..., 0] * t[..., 1] + xs[..., 1] * t[..., 0]
        return torch.stack([real, imag], dim=-1).flatten(3).type_as(x)
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))  # (B, T, H, D/2) complex
    rot = torch.view_as_complex(table if table.dim() == 4 else table[None])  # (B|1, T, D/2)
    return torch.view_as_real(pairs * rot[:, :, None]).flatten(3).type_as(x)


def build_rope_1d(rows: int, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """Llama's 1-D RoPE as a (rows, head_dim/2, 2) table for interleaved pairs: row t rotates pair j by
    t * base ** (-2j / head_dim). Checkpoints that rotate halves (HF's rotate_half) are loaded with their
    q/k projections permuted to interleaved pairs (`permute_rotate_half`), so one `apply_rope` serves all."""
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))  # (D/2,)
    angles = torch.outer(torch.arange(rows, dtype=torch.float64), freqs)  # (rows, D/2)
    return torch.stack([torch.cos(angles), torch.sin(angles)], dim=-1).float()


def permute_rotate_half(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Reorder each head's channels from rotate-half pairs (j, j + D/2) to interleaved pairs (2j, 2j + 1).
    weight: (heads * D, in) projection rows, (heads * D,) biases or (heads, D) per-head norm parameters."""
    shape = weight.shape
    per_head = weight.numel() // heads  # D * in, D or D
    head_dim = shape[1] if (weight.dim() == 2 and shape[0] == heads) else shape[0] // heads
    rest = per_head // head_dim
    # (H, 2, D/2, rest) -> (H, D/2, 2, rest): channels j and j + D/2 become neighbours
    return weight.reshape(heads, 2, head_dim // 2, rest).transpose(1, 2).reshape(shape)


def unpermute_rotate_half(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Inverse of `permute_rotate_half`: interleaved pairs back to rotate-half order (for writing files in
    the HF / LANTERN convention)."""
    shape = weight.shape
    per_head = weight.numel() // heads
    head_dim = shape[1] if (weight.dim() == 2 and shape[0] == heads) else shape[0] // heads
    rest = per_head // head_dim
    # (H, D/2, 2, rest) -> (H, 2, D/2, rest)
    return weight.reshape(heads, head_dim // 2, 2, rest).transpose(1, 2).reshape(shape)


def interleave_head_norm(value: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """Chameleon's QK-norm parameter in the rotate-half convention -> interleaved pairs: (heads, D) as
    transformers stores it, one (D,) vector shared by the heads (older conversions), or (mp, D), one row
    per model-parallel shard, each shared by heads / mp consecutive heads (Alpha-VLLM's and LANTERN's
    `ChameleonLayerNorm`, which repeat-interleaves its rows; mp = 1 in their released configs). Other
    shapes are returned as they are (the strict load then names them)."""
    if value.dim() == 1:
        value = value[None].expand(heads, -1).contiguous()
    elif value.dim() == 2 and value.shape[1] == head_dim and value.shape[0] < heads and heads % value.shape[0] == 0:
        value = value.repeat_interleave(heads // value.shape[0], dim=0)
    if value.shape != (heads, head_dim):
        return value
    return permute_rotate_half(value, heads)

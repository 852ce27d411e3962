"""One target forward over a whole draft tree against the static KV cache, and compaction of the accepted
path. Shared by every model family and decoder: it only needs the GPT's ForwardStep interface.

Layout: the cache holds `length` valid slots. Tree node i (node 0 = the root, the last accepted token,
not yet in the cache) is written at slot length + i and rotated by RoPE row length + depth(i), so
siblings share a grid position. Each node attends to every valid prefix slot and to its tree ancestors.
"""
from __future__ import annotations

import torch

from ...models.gpt import ForwardStep, LlamaGenGPT
from ...models.kv_cache import KVCache, window_mask


def tree_mask(key_valid: torch.Tensor, length: int, buffers, window: int | None = None) -> torch.Tensor:
    """(rows, 1, n+1, window) bool: prefix keys by validity, tree keys by ancestry (`window` defaults to
    length + n+1, the exact extent). The ancestry mask is (n+1, n+1) shared by every row, or (G, n+1, n+1)
    per tree (rows = [cond trees; uncond trees])."""
    n1 = buffers.mask.shape[-1]
    return window_mask(key_valid, length, buffers.mask, length + n1 if window is None else window)


def forward_tree(model: LlamaGenGPT, cache: KVCache, key_valid: torch.Tensor, length: int | torch.Tensor,
                 tokens: torch.Tensor, buffers, window: int | None = None) -> torch.Tensor:
    """tokens (rows, n+1) in tree order -> final hidden states (rows, n+1, dim); writes their K/V.
    `buffers` is a TreeBuffers or DraftTree: depths (n+1,) or per tree (G, n+1), and the ancestry mask.
    `length` may be a () device tensor, or (rows,) per row, with a static `window` (>= length + n+1) of keys
    to attend over."""
    device = tokens.device
    rows, n1 = tokens.shape
    if window is None:
        window = length + n1
    depths = buffers.depths.to(device)
    if depths.dim() == 2:
        depths = depths.repeat(rows // depths.shape[0], 1)  # (rows, n+1)
    per_row = isinstance(length, torch.Tensor) and length.dim() == 1
    base = length[:, None] if per_row else length
    positions = (base + depths).clamp(max=model.rope_table.shape[0] - 1)  # siblings share a RoPE row
    if per_row and positions.dim() == 1:
        positions = positions.expand(rows, -1)
    slots = (base + torch.arange(n1, device=device))  # (n+1,) or (rows, n+1)
    step = ForwardStep(positions, cache, kv_len=window, mask=tree_mask(key_valid, length, buffers, window), slots=slots)
    return model(model.embed_tokens(tokens), step)


def commit_path(cache: KVCache, length: int, path: torch.Tensor) -> int:
    """Move the K/V of the accepted tree nodes `path` (node ids, root first) to slots length.. and
    return the new valid length. Slots past it are stale and are overwritten by the next forward."""
    cache.compact(length + path, length)
    return length + path.numel()


def commit_padded_path(cache: KVCache, length: torch.Tensor, path: torch.Tensor) -> None:
    """`commit_path` for a fixed-size path (depth+1,) padded with -1 after the accepted nodes, with the
    length a () device tensor, or per row: path (rows, depth+1) and length (rows,). Every entry is copied
    (padding copies the root past the new length, where it is stale and overwritten later), and `length` is
    not advanced here (the caller adds the count)."""
    source = (length[:, None] if path.dim() == 2 else length) + path.clamp(min=0)
    cache.compact(source, length)

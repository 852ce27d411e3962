"""One target forward over a whole draft tree against the static KV cache, and compaction of the accepted
path. Shared by every model family and decoder: it only needs the GPT's ForwardStep interface.

Layout: the cache holds `length` valid slots. Tree node i (node 0 = the root, the last accepted token,
not yet in the cache) is written at slot length + i and rotated by RoPE row length + depth(i), so
siblings share a grid position. Each node attends to every valid prefix slot and to its tree ancestors.
"""
from __future__ import annotations

import torch

from ..models.gpt import ForwardStep, LlamaGenGPT
from ..models.kv_cache import KVCache


def tree_mask(key_valid: torch.Tensor, length: int, buffers) -> torch.Tensor:
    """(rows, 1, n+1, length + n+1) bool: prefix keys by validity, tree keys by ancestry. The ancestry
    mask is (n+1, n+1) shared by every row, or (G, n+1, n+1) per tree (rows = [cond trees; uncond trees])."""
    rows, n1 = key_valid.shape[0], buffers.mask.shape[-1]
    prefix = key_valid[:, None, :length].expand(rows, n1, length)
    m = buffers.mask.to(key_valid.device)
    tree = m[None].expand(rows, n1, n1) if m.dim() == 2 else m.repeat(rows // m.shape[0], 1, 1)
    return torch.cat([prefix, tree], dim=-1)[:, None]


def forward_tree(model: LlamaGenGPT, cache: KVCache, key_valid: torch.Tensor, length: int,
                 tokens: torch.Tensor, buffers) -> torch.Tensor:
    """tokens (rows, n+1) in tree order -> final hidden states (rows, n+1, dim); writes their K/V.
    `buffers` is a TreeBuffers or DraftTree: depths (n+1,) or per tree (G, n+1), and the ancestry mask."""
    device = tokens.device
    rows, n1 = tokens.shape
    depths = buffers.depths.to(device)
    if depths.dim() == 2:
        depths = depths.repeat(rows // depths.shape[0], 1)  # (rows, n+1)
    positions = (length + depths).clamp(max=model.rope_table.shape[0] - 1)  # siblings share a RoPE row
    slots = length + torch.arange(n1, device=device)
    step = ForwardStep(positions, cache, kv_len=length + n1, mask=tree_mask(key_valid, length, buffers), slots=slots)
    return model(model.embed_tokens(tokens), step)


def commit_path(cache: KVCache, length: int, path: torch.Tensor) -> int:
    """Move the K/V of the accepted tree nodes `path` (node ids, root first) to slots length.. and
    return the new valid length. Slots past it are stale and are overwritten by the next forward."""
    cache.compact(length + path, length)
    return length + path.numel()

"""Static, preallocated key/value cache shared by every model and decoder.

One pair of tensors of shape (n_layer, B, n_kv_head, max_len, head_dim) allocated once per run, with each
layer's (B, n_kv_head, max_len, head_dim) view made once beside it; forward passes write new keys/values at
explicit slots of a layer's view and attend over a prefix of it. Writing through views made outside a
compiled step keeps Inductor's writes in place: a view taken inside the step of the 5-D tensor (a graph
input) is written out of place, a copy of the whole layer, and copied back. Compaction (copying an accepted
speculative path into place) also lives here. It does not decide what is valid: masks come from
`attention_mask` (queries at explicit slots) and `window_mask` (queries after a committed length, seeing
their tree ancestors or window predecessors: the tree and Jacobi decoders' forwards).

An 8-bit cache (`allocate(..., int8=True)`) holds keys and values as int8 with one scale per (row, head, slot)
in the compute dtype (symmetric, round to nearest: each entry within half its scale of the value written) and
hands attention the dequantized first kv_len slots of the layer it serves (one layer's worth of compute-dtype
keys and values at a time). It halves the cache (a 128-wide head: 128 + 2 bytes per entry instead of 256) for
a small change in the target's law; every decoder reads and writes it through the same calls, so exact modes
sample the law of AR with that cache.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


INT8_MAX = 127.0
SCALE_DIVISOR = 126.0  # max |x| maps a little inside 127, so a scale rounded down to bf16 never clips a code


@dataclass
class KVCache:
    keys: torch.Tensor  # (L, B, H_kv, S_max, D), int8 in an 8-bit cache
    values: torch.Tensor  # (L, B, H_kv, S_max, D)
    key_scales: torch.Tensor | None = None  # (L, B, H_kv, S_max, 1) in the compute dtype: 8-bit caches only
    value_scales: torch.Tensor | None = None
    layer_keys: tuple[torch.Tensor, ...] = field(init=False, repr=False)  # L views (B, H_kv, S_max, D)
    layer_values: tuple[torch.Tensor, ...] = field(init=False, repr=False)  # L views (B, H_kv, S_max, D)
    layer_scales: tuple[tuple[torch.Tensor, torch.Tensor], ...] = field(init=False, repr=False)  # L (key, value)
    rows: torch.Tensor = field(init=False, repr=False)  # (B, 1) long 0..B-1: the row index of per-row writes

    def __post_init__(self) -> None:
        # detached: autograd sees no view to rebase (an autograd view made once could not be written in place
        # under grad mode after another layer's write); they share the 5-D tensors' storage all the same
        self.layer_keys = tuple(layer.detach() for layer in self.keys)
        self.layer_values = tuple(layer.detach() for layer in self.values)
        self.layer_scales = () if self.key_scales is None else tuple(
            (k.detach(), v.detach()) for k, v in zip(self.key_scales, self.value_scales))
        self.rows = torch.arange(self.keys.shape[1], device=self.keys.device)[:, None]

    @classmethod
    def allocate(cls, n_layer: int, batch: int, n_kv_head: int, max_len: int, head_dim: int,
                 device: torch.device | str, dtype: torch.dtype, int8: bool = False) -> "KVCache":
        """A zeroed cache in `dtype`, or (`int8`) in int8 with per-entry scales in `dtype`."""
        shape = (n_layer, batch, n_kv_head, max_len, head_dim)
        if not int8:
            return cls(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))
        scales = shape[:-1] + (1,)
        return cls(torch.zeros(shape, device=device, dtype=torch.int8), torch.zeros(shape, device=device,
                                                                                      dtype=torch.int8),
                   torch.zeros(scales, device=device, dtype=dtype), torch.zeros(scales, device=device, dtype=dtype))

    @property
    def int8(self) -> bool:
        return self.key_scales is not None

    def buffers(self) -> tuple[torch.Tensor, ...]:
        """Every 5-D buffer (keys, values and, in an 8-bit cache, their scales): what compaction moves."""
        return (self.keys, self.values) + ((self.key_scales, self.value_scales) if self.int8 else ())

    @property
    def max_len(self) -> int:
        return self.keys.shape[3]

    @property
    def batch(self) -> int:
        return self.keys.shape[1]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers())

    def update(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_len: int):
        """Write k, v (B, H_kv, T, D) at `slots`, (T,) shared by every row or (B, T) per row (rows of a
        batch at different lengths), and return the first kv_len slots (views; in an 8-bit cache, their
        dequantized values in k's dtype)."""
        keys, values = self.layer_keys[layer], self.layer_values[layer]  # (B, H_kv, S_max, D)
        if not self.int8:
            write_slots(self, keys, slots, k)
            write_slots(self, values, slots, v)
            return keys[:, :, :kv_len], values[:, :, :kv_len]
        key_scales, value_scales = self.layer_scales[layer]  # (B, H_kv, S_max, 1)
        out = []
        for store, scales, x in ((keys, key_scales, k), (values, value_scales, v)):
            codes, scale = quantize_int8(x, scales.dtype)
            write_slots(self, store, slots, codes)
            write_slots(self, scales, slots, scale)
            out.append(store[:, :, :kv_len].to(x.dtype) * scales[:, :, :kv_len].to(x.dtype))
        return out[0], out[1]

    def keep_rows(self, rows: list[int]) -> "KVCache":
        """The cache of batch rows `rows` (ascending) only, made in place: those rows move to the front of
        these buffers one at a time and the result views the first len(rows). Nothing the size of the cache is
        allocated (a copy would hold the old and the new cache at once); this object must not be read after."""
        return KVCache(*(keep_rows(t, rows, dim=1) for t in self.buffers()))

    def release(self) -> None:
        """Drop the buffers and their views (the object stays valid but empty); used in `finally` after a run."""
        self.keys = self.values = torch.empty(0)
        self.key_scales = self.value_scales = None
        self.layer_keys = self.layer_values = self.layer_scales = ()

    def compact(self, source_slots: torch.Tensor, dest_start: int | torch.Tensor) -> None:
        """Copy the entries at `source_slots` (n,) to dest_start .. dest_start+n-1 in every layer
        (`dest_start` an int or a () device tensor); per row, source_slots (B, n) go to dest_start (B,) ..
        (every row gathers all n entries before any is written). Eagerly two kernels per buffer over all
        layers; compiled, per layer view (the 5-D tensor beside the views would make Inductor copy it)."""
        n = source_slots.shape[-1]
        if torch.compiler.is_compiling():
            compact_layers(self, source_slots, dest_start)
            return
        if source_slots.dim() == 1:
            dest = dest_start + torch.arange(n, device=source_slots.device)
            for buf in self.buffers():
                picked = buf.index_select(3, source_slots)  # (L, B, H, n, D)
                buf.index_copy_(3, dest, picked)
            return
        dest = dest_start[:, None] + torch.arange(n, device=source_slots.device)  # (B, n)
        for buf in self.buffers():
            L, B, H, _, D = buf.shape  # D is 1 for the scales of an 8-bit cache
            picked = buf.gather(3, source_slots[None, :, None, :, None].expand(L, B, H, n, D))  # (L, B, H, n, D)
            buf.scatter_(3, dest[None, :, None, :, None].expand(L, B, H, n, D), picked)


def compact_layers(cache: KVCache, source_slots: torch.Tensor, dest_start: int | torch.Tensor) -> None:
    """`KVCache.compact` one layer view at a time, each written with an op Inductor does in place."""
    n = source_slots.shape[-1]
    per_row = source_slots.dim() == 2
    start = dest_start[:, None] if per_row else dest_start
    dest = start + torch.arange(n, device=source_slots.device)  # (B, n) per row, else (n,)
    scales = [t for pair in cache.layer_scales for t in pair]  # (B, H, S_max, 1) each, 8-bit caches only
    for buf in (*cache.layer_keys, *cache.layer_values, *scales):  # (B, H, S_max, D)
        if not per_row:
            buf.index_copy_(2, dest, buf.index_select(2, source_slots))
        else:
            B, H, _, D = buf.shape
            picked = buf.gather(2, source_slots[:, None, :, None].expand(B, H, n, D))  # (B, H, n, D)
            buf[cache.rows, :, dest] = picked.transpose(1, 2)  # (B, n, H, D) at (row, slot)


def write_slots(cache: KVCache, store: torch.Tensor, slots: torch.Tensor, x: torch.Tensor) -> None:
    """x (B, H_kv, T, D) into a layer's `store` (B, H_kv, S_max, D) at `slots` (T,) or per row (B, T)."""
    if slots.dim() == 1:
        store.index_copy_(2, slots, x)
    else:  # index_put_, not scatter_: Inductor lowers scatter_ out of place (a copy of the layer)
        store[cache.rows, :, slots] = x.transpose(1, 2)  # (B, T, H_kv, D) at (row, slot)


def quantize_int8(x: torch.Tensor, scale_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., D) -> int8 codes (..., D) and scales (..., 1) in `scale_dtype`: scale = max |x| / 126 over D, rounded
    to `scale_dtype` first, codes = round(x / scale) (within +-127 even after the rounding); each code * scale is
    within scale / 2 of x (an all-zero vector keeps scale 0 and codes 0)."""
    scale = (x.float().abs().amax(-1, keepdim=True) / SCALE_DIVISOR).to(scale_dtype)
    safe = scale.float().masked_fill(scale == 0, 1.0)
    codes = (x.float() / safe).round_().clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return codes, scale


def keep_rows(t: torch.Tensor, rows: list[int], dim: int = 0) -> torch.Tensor:
    """In place: entries `rows` (ascending indices along `dim`) of `t` moved to the front, one at a time, and
    the view of the first len(rows) returned. Ascending order makes it safe: entry i is written only after
    every entry that comes from it was read. Allocates nothing; `t` itself must not be read as before."""
    if any(b <= a for a, b in zip(rows, rows[1:])):
        raise ValueError(f"rows to keep must ascend, got {rows}")
    for i, r in enumerate(rows):
        if r != i:
            t.select(dim, i).copy_(t.select(dim, r))
    return t.narrow(dim, 0, len(rows))


def attention_mask(key_valid: torch.Tensor, query_slots: torch.Tensor, kv_len: int) -> torch.Tensor:
    """Causal mask over cache slots, with invalid (padded) keys removed and the diagonal kept.

    key_valid: (B, S_max) bool, False for padded prefix slots. query_slots: (T,) slot of each query, or
    (B, T) per row. Returns (B, 1, T, kv_len) bool, True where a query may attend.
    """
    keys = torch.arange(kv_len, device=key_valid.device)
    queries = query_slots[..., :, None]  # (T, 1) or (B, T, 1)
    causal, diagonal = keys <= queries, keys == queries  # (T | B x T, kv_len)
    if query_slots.dim() == 1:
        causal, diagonal = causal[None], diagonal[None]
    mask = causal & key_valid[:, None, :kv_len]  # (B, T, kv_len)
    return (mask | diagonal)[:, None]


def window_mask(key_valid: torch.Tensor, length: int | torch.Tensor, ancestry: torch.Tensor,
                window: int) -> torch.Tensor:
    """(rows, 1, T, window) bool for T queries written after `length` committed slots: every valid slot below
    `length`, plus the slots length + j (j < n) where `ancestry` (T, n), or per tree (G, T, n), is True.
    `length` may be a () device tensor, or (rows,) per row (a batch whose rows advance independently); the
    mask then never reads the host. Slots from length + n to `window` are hidden, so one window serves every
    length up to window - n."""
    rows, n = key_valid.shape[0], ancestry.shape[-1]
    keys = torch.arange(window, device=key_valid.device)
    ancestry = ancestry.to(key_valid.device)
    if isinstance(length, torch.Tensor) and length.dim() == 1:  # per row
        rel = keys - length[:, None]  # (rows, window) offset of each key from the row's first tree slot
        prefix = key_valid[:, :window] & (rel < 0)
        per_tree = ancestry if ancestry.dim() == 3 else ancestry[None]
        per_tree = per_tree.expand(rows, -1, -1) if per_tree.shape[0] == 1 else per_tree.repeat(
            rows // per_tree.shape[0], 1, 1)  # (rows, T, n)
        index = rel.clamp(0, n - 1)[:, None, :].expand(-1, per_tree.shape[1], -1)  # (rows, T, window)
        tree = per_tree.gather(2, index) & ((rel >= 0) & (rel < n))[:, None, :]
        return (prefix[:, None, :] | tree)[:, None]
    prefix = key_valid[:, :window] & (keys < length)  # (rows, window)
    rel = keys - length  # (window,) offset of each key from the first tree slot
    tree = ancestry.index_select(-1, rel.clamp(0, n - 1)) & ((rel >= 0) & (rel < n))
    tree = tree[None] if tree.dim() == 2 else tree.repeat(rows // tree.shape[0], 1, 1)  # (1|rows, T, window)
    return (prefix[:, None, :] | tree)[:, None]

"""Plain autoregressive generation with a static KV cache (the baseline every speculative decoder
is measured against).

One entry point, `generate`, returns tokens plus stats. CFG runs as [cond; uncond] rows in one
batch; the cache is preallocated for prefix + image tokens; sampling randomness comes only from the
caller's generators. Device and dtype are the model's; this module never picks them. Decoding tokens
to pixels is the VQ tokenizer's job.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from .conditioning import Condition, build_prefix
from .config import SamplingConfig
from .models.gpt import ForwardStep, ImageTransformer
from .models.kv_cache import KVCache, attention_mask
from .sampling import Generators, combine_cfg, pick_tokens

# (tokens done per sample, total per sample, the (B, N) token buffer filled up to `done`)
StepCallback = Callable[[int, int, torch.Tensor], None]


@dataclass
class GenerationStats:
    batch: int
    image_tokens: int  # per sample
    forward_passes: int
    wall_time_s: float
    prefill_time_s: float
    kv_cache_bytes: int

    @property
    def tokens_per_s(self) -> float:
        return self.batch * self.image_tokens / max(self.wall_time_s, 1e-9)

    @property
    def ms_per_step(self) -> float:
        return 1000.0 * self.wall_time_s / max(self.forward_passes, 1)

    @property
    def mean_accepted_length(self) -> float:
        return self.image_tokens / max(self.forward_passes, 1)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(tokens_per_s=self.tokens_per_s, ms_per_step=self.ms_per_step,
                   mean_accepted_length=self.mean_accepted_length)
        return out

    def summary(self) -> str:
        return (f"{self.batch}x{self.image_tokens} tokens in {self.wall_time_s:.2f} s "
                f"({self.tokens_per_s:.1f} tok/s, {self.forward_passes} forward passes, "
                f"{self.ms_per_step:.1f} ms/step, mean accepted length {self.mean_accepted_length:.2f})")


@dataclass
class GenerationResult:
    tokens: torch.Tensor  # (B, N) long, raster order
    stats: GenerationStats
    accepted_per_cell: torch.Tensor  # (B, N) int: tokens accepted by the forward that produced each cell

    def acceptance_grid(self, sample: int = 0) -> list[list[int]]:
        """The heat map of one sample as rows of the token grid (1 everywhere for plain AR)."""
        side = int(round(self.tokens.shape[1] ** 0.5))
        return self.accepted_per_cell[sample].reshape(side, -1).tolist()


def _logits_for_step(model: ImageTransformer, logits: torch.Tensor, sampling: SamplingConfig, guided: bool,
                     step: int) -> torch.Tensor:
    """Raw logits (rows, V) of image token `step` -> CFG-combined logits (B, V) with the model's layout."""
    if not guided:
        combined = logits
    elif sampling.cfg_active(step):
        combined = combine_cfg(logits, sampling.cfg_scale)
    else:
        combined = logits.chunk(2, dim=0)[0]
    return model.constrain_logits(combined, step)


def estimate_run_bytes(config, batch: int, guided: bool, dtype: torch.dtype) -> int:
    """Transient memory of one `generate` call: the KV cache plus prefill activations and logits."""
    rows = batch * (2 if guided else 1)
    element = torch.tensor([], dtype=dtype).element_size()
    cache = 2 * config.n_layer * rows * config.n_kv_head * config.max_seq_len * config.head_dim * element
    prefill = rows * config.cls_token_num * max(config.ffn_dim, 3 * config.dim) * 4 * element
    logits = rows * config.vocab_size * 4 * 4
    return cache + prefill + logits


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels so wall times are real (CUDA and MPS run asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


@dataclass
class DecodeState:
    """A static KV cache with one image's condition prefilled, for the speculative decoders: `length` slots
    are committed; a decoder writes drafts after them and rolls a rejected tail back by the length alone
    (stale slots are overwritten)."""

    cache: KVCache
    key_valid: torch.Tensor  # (rows, max_len), False for padded prefix slots
    length: int
    prefix_ids: torch.Tensor | None = None  # (rows, length) prompt token ids of prompted families

    def release(self) -> int:
        """Free the cache; returns the bytes it held."""
        nbytes = self.cache.nbytes
        self.cache.release()
        return nbytes


def prefill_state(model: ImageTransformer, condition: Condition, guided: bool, spare: int) -> tuple[DecodeState, torch.Tensor]:
    """Prefill the condition (rows = [cond; uncond] when guided) into a cache with room for the image plus
    `spare` slots. Returns the state and the prefix's hidden states (rows, T, dim)."""
    prefix = build_prefix(model, condition, guided)
    rows, T = prefix.key_valid.shape
    device = prefix.embeddings.device
    max_len = T + model.config.num_image_tokens + spare
    cache = model.allocate_cache(rows, max_len)
    key_valid = torch.ones(rows, max_len, dtype=torch.bool, device=device)
    key_valid[:, :T] = prefix.key_valid
    pos = torch.arange(T, device=device)
    hidden = model(prefix.embeddings, ForwardStep(pos, cache, kv_len=T, mask=attention_mask(key_valid, pos, T)))
    return DecodeState(cache, key_valid, T, prefix.token_ids), hidden


@torch.no_grad()
def generate(model: ImageTransformer, condition: Condition, sampling: SamplingConfig,
             generator: Generators = None, on_step: StepCallback | None = None) -> GenerationResult:
    """Sample `condition.batch` images' tokens autoregressively. Returns tokens (B, N) and stats."""
    config = model.config
    guided = sampling.uses_cfg
    n_tokens = config.num_image_tokens
    start = time.perf_counter()
    prefix = build_prefix(model, condition, guided)
    rows, T = prefix.key_valid.shape
    device = prefix.embeddings.device
    cache = model.allocate_cache(rows, T + n_tokens)
    key_valid = torch.ones(rows, cache.max_len, dtype=torch.bool, device=device)
    key_valid[:, :T] = prefix.key_valid

    try:
        positions = torch.arange(T, device=device)
        prefill = ForwardStep(positions, cache, kv_len=T, mask=attention_mask(key_valid, positions, T))
        hidden = model(prefix.embeddings, prefill)
        logits = model.logits(hidden[:, -1])  # (rows, V)
        tokens = torch.empty(condition.batch, n_tokens, dtype=torch.long, device=device)
        tokens[:, 0] = pick_tokens(_logits_for_step(model, logits, sampling, guided, 0), sampling, generator)
        prefill_time = time.perf_counter() - start
        if on_step is not None:
            on_step(1, n_tokens, tokens)

        decode_mask = key_valid[:, None, None, :] if prefix.padded else None  # (rows, 1, 1, S_max)
        for i in range(1, n_tokens):
            pos = T + i - 1  # slot of the token fed now (image token i - 1)
            fed = tokens[:, i - 1 : i]
            fed = torch.cat([fed, fed]) if guided else fed  # (rows, 1)
            step = ForwardStep(positions.new_tensor([pos]), cache, kv_len=pos + 1,
                               mask=None if decode_mask is None else decode_mask[..., : pos + 1])
            logits = model.logits(model(model.embed_tokens(fed), step)[:, -1])
            tokens[:, i] = pick_tokens(_logits_for_step(model, logits, sampling, guided, i), sampling, generator)
            if on_step is not None:
                on_step(i + 1, n_tokens, tokens)
    finally:
        cache_bytes = cache.nbytes
        cache.release()  # frees the buffers now, even when a callback interrupts the run
    synchronize(device)
    stats = GenerationStats(batch=condition.batch, image_tokens=n_tokens, forward_passes=n_tokens,
                            wall_time_s=time.perf_counter() - start, prefill_time_s=prefill_time,
                            kv_cache_bytes=cache_bytes)
    return GenerationResult(tokens, stats, torch.ones_like(tokens, dtype=torch.int32))

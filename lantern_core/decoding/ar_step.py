"""The static-shape AR step: one forward and one sampled token per call, with every value that changes
from step to step held in device tensors.

`ARBuffers` are the tensors a step reads and writes (the KV cache over a fixed number of slots, the
key-validity mask, the token buffer, each image's position noise, the image-token index and the prefix
length). Token i of image g is the race of its filtered law with the noise of (g's seed, position i)
(`acceptance/position_noise.py`), hashed inside the step, so every lossless decoder can reproduce it.
`ar_step` advances the index by one without a host read, an allocation that
depends on the step, or a Python branch on a tensor value, so the same call runs eagerly, under
`torch.compile(fullgraph=True)` and replayed from a CUDA graph (`step_graphs.py`), and all three give the
same tokens. For a captured step, attention covers a window of slots with a mask (`keys <= slot`), as gpt-fast
does, so the shapes change only at window boundaries; an eager step on a device that never captures may
instead slice the cache exactly to the fed slot (`exact_window`) and skip the mask when no prefix key is
padded, which is what the bare forward costs. Prefill, which depends on the prompt's length, stays outside
(`generate.py`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import SamplingConfig
from ..models.gpt import ForwardStep, ImageTransformer
from ..models.kv_cache import KVCache
from .acceptance.position_noise import PositionNoise
from .sampling import combine_cfg, sample_at
from .step_graphs import SLOT_BUCKET, band_window


@dataclass(frozen=True)
class ARShape:
    """What fixes a step's tensor shapes and its code: rows (= batch, x2 with CFG), cache slots, image tokens,
    and the sampling settings the step bakes in."""

    batch: int
    slots: int
    image_tokens: int
    sampling: SamplingConfig

    @property
    def guided(self) -> bool:
        return self.sampling.uses_cfg

    @property
    def rows(self) -> int:
        return self.batch * (2 if self.guided else 1)


def window_for(slot: int, slots: int) -> int:
    """Keys a step attends over when it feeds the token at cache slot `slot`: the slots up to it rounded up to
    `SLOT_BUCKET` (capped by the cache), so attention grows with the image in a few fixed shapes instead of
    one shape per token or the whole cache every step."""
    return band_window(slot, 0, slots)


def exact_window(slot: int, slots: int) -> int:
    """The keys up to and including `slot`: one shape per token, so for eager steps only."""
    return min(slots, slot + 1)


def windows(slots: int) -> list[int]:
    """Every attention window a cache of `slots` slots can use (one captured graph each)."""
    return sorted({window_for(s, slots) for s in range(0, slots, SLOT_BUCKET)} | {slots})


def slots_for(prefix_len: int, image_tokens: int, bucket: int = 1) -> int:
    """Cache slots for a prefix of `prefix_len` tokens plus the image, rounded up to a multiple of `bucket`."""
    need = prefix_len + image_tokens
    return -(-need // bucket) * bucket


@dataclass
class ARBuffers:
    """The static tensors of one AR run shape. Allocated once per `ARShape` and reused across images."""

    cache: KVCache  # (L, rows, H_kv, slots, D) keys and values
    key_valid: torch.Tensor  # (rows, slots) bool: False on padded prefix slots
    tokens: torch.Tensor  # (B, N) long: image tokens, filled up to `index`
    noise: PositionNoise  # each image's position noise (bases (B, N), filled per run from the seeds)
    index: torch.Tensor  # () long: the image token the next step produces (1 .. N-1)
    prefix_len: torch.Tensor  # () long: T, the slot of image token 0's input is T

    @classmethod
    def allocate(cls, model: ImageTransformer, shape: ARShape) -> "ARBuffers":
        device = model.tok_embeddings.weight.device
        return cls(
            cache=model.allocate_cache(shape.rows, shape.slots),
            key_valid=torch.ones(shape.rows, shape.slots, dtype=torch.bool, device=device),
            tokens=torch.zeros(shape.batch, shape.image_tokens, dtype=torch.long, device=device),
            noise=PositionNoise.allocate(shape.batch, shape.image_tokens, model.config.vocab_size, device),
            index=torch.ones((), dtype=torch.long, device=device),
            prefix_len=torch.ones((), dtype=torch.long, device=device),
        )

    def release(self) -> None:
        self.cache.release()

    @property
    def nbytes(self) -> int:
        return self.cache.nbytes + self.noise.nbytes + sum(t.numel() * t.element_size()
                                                           for t in (self.key_valid, self.tokens))


def sample_step_tokens(model: ImageTransformer, logits: torch.Tensor, sampling: SamplingConfig,
                       index: torch.Tensor, noise: PositionNoise) -> torch.Tensor:
    """Raw logits (rows, V) of image token `index` (() long tensor) -> tokens (B,): CFG (with its interval,
    as a tensor select), the model's forced-token layout, then argmax, or the race of the filtered law with
    the images' position noise at `index`."""
    if sampling.uses_cfg:
        guided = combine_cfg(logits, sampling.cfg_scale)
        if sampling.cfg_interval >= 0:
            guided = torch.where(index <= sampling.cfg_interval + 1, guided, logits.chunk(2, dim=0)[0])
        logits = guided
    logits = model.constrain_logits(logits, index)
    if sampling.greedy:
        return logits.argmax(-1)
    return sample_at(logits, sampling, noise, index.view(1))[:, 0]


def ar_step(model: ImageTransformer, shape: ARShape, buffers: ARBuffers, window: int, masked: bool = True) -> None:
    """Feed image token `index - 1`, sample token `index` into `buffers.tokens`, advance `index`, attending
    over the first `window` cache slots (`window_for` of the fed slot; the caller knows it from its loop
    counter). Shapes depend on `shape` and `window` only; nothing reads the host. `masked` False is for
    eager steps whose window ends exactly at the fed slot over a prefix without padded keys: every key in
    the window is visible, so the mask is left out."""
    i = buffers.index
    slot = buffers.prefix_len + i - 1  # () cache slot of the fed token
    fed = buffers.tokens.index_select(1, (i - 1).view(1))  # (B, 1)
    if shape.guided:
        fed = torch.cat([fed, fed])  # (rows, 1): cond rows then uncond rows
    mask = None
    if masked:
        keys = torch.arange(window, device=fed.device)
        mask = ((keys <= slot) & buffers.key_valid[:, :window] | (keys == slot))[:, None, None, :]  # (rows, 1, 1, window)
    step = ForwardStep(slot.view(1), buffers.cache, kv_len=window, mask=mask)
    logits = model.logits(model(model.embed_tokens(fed), step)[:, -1])  # (rows, V)
    token = sample_step_tokens(model, logits, shape.sampling, i, buffers.noise)
    buffers.tokens.index_copy_(1, i.view(1), token[:, None])
    buffers.index.add_(1)

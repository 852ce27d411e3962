"""Counter-based noise keyed by image position: the randomness that decides image token i of image g is a
function of (the image's key, i, the vocabulary index) alone.

An image's key comes from its generator's seed (`image_keys`: `generator.initial_seed()`, never its stream
state), so a seed names one picture whatever the device, the batch the image rides in, the decoder or how many
iterations it takes. The numbers are SplitMix64 (Steele, Lea and Flood 2014) in int64 tensor arithmetic
(products wrap modulo 2**64, right shifts are made logical with a mask), so CPU, CUDA and MPS compute the same
bits inside a captured or compiled step, with no generator state:

    base[g, i] = mix(key_g + (i + 1) * GOLDEN)        once per run: `PositionNoise.fill`, (G, positions)
    bits[g, i, v] = mix(base[g, i] + (v + 1) * GOLDEN)  inside the step: `PositionNoise.exp_at`

Uniforms carry the low 24 bits and are never 0 or 1. Sampling is a race (`race_tokens`): the token that
maximises filtered logit - log E, E = -log u ~ Exp(1) (a Gumbel race), draws from softmax(filtered logits),
and a drafter racing with the same E agrees with the target as often as a coupling can. Which position a
decoder races where is its business; this module only makes the numbers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64's increment
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_LOG_2_24 = 24 * math.log(2.0)


def _signed(x: int) -> int:
    """A 64-bit pattern as the int64 value torch stores."""
    x &= 2**64 - 1
    return x - 2**64 if x >= 2**63 else x


def _low_bits(k: int) -> int:
    return (1 << (64 - k)) - 1  # what a logical right shift by k keeps


def mix64(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finalizer on int64 tensors (bit patterns of uint64; multiplication wraps modulo 2**64)."""
    z = (z ^ ((z >> 30) & _low_bits(30))) * _signed(_M1)
    z = (z ^ ((z >> 27) & _low_bits(27))) * _signed(_M2)
    return z ^ ((z >> 31) & _low_bits(31))


def splitmix64(seed: int, n: int) -> list[int]:
    """The first n outputs of SplitMix64 seeded with `seed`, in pure Python (the reference `mix64` matches)."""
    out, state = [], seed % 2**64
    for _ in range(n):
        state = (state + GOLDEN) % 2**64
        z = state
        z = ((z ^ (z >> 30)) * _M1) % 2**64
        z = ((z ^ (z >> 27)) * _M2) % 2**64
        out.append(z ^ (z >> 31))
    return out


def image_keys(generators, batch: int) -> list[int]:
    """One 64-bit key per image: each image's generator's seed (a list, one per image), a shared generator's
    seed plus the image's place in the batch (also when the same generator object fills several places of a
    list), or, with no generator, random keys drawn from torch's default generator (an unseeded run is a
    random picture)."""
    if generators is None:
        seed = int(torch.randint(0, 2**62, (1,)).item())
        return [(seed + i) % 2**64 for i in range(batch)]
    if isinstance(generators, torch.Generator):
        return [(generators.initial_seed() + i) % 2**64 for i in range(batch)]
    generators = list(generators)
    if len(generators) != batch:
        raise ValueError(f"got {len(generators)} generators for a batch of {batch}; pass one per sample")
    fresh = image_keys(None, batch) if any(g is None for g in generators) else None
    shared = {id(g) for g in generators if g is not None and sum(h is g for h in generators) > 1}
    # one generator object at several places (a shared generator handed to each image) is seed + place
    return [fresh[i] if g is None else (g.initial_seed() + (i if id(g) in shared else 0)) % 2**64
            for i, g in enumerate(generators)]


def key_tensor(generators, batch: int, device: torch.device | str) -> torch.Tensor:
    """(batch,) int64 key bit patterns on `device` (`image_keys`)."""
    return torch.tensor([_signed(k) for k in image_keys(generators, batch)], dtype=torch.long, device=device)


@dataclass
class PositionNoise:
    """The noise of G images over `positions` image positions and a vocabulary of V: per-position bases
    filled once per run, vocabulary offsets made once per allocation; `exp_at` is all a step computes."""

    bases: torch.Tensor  # (G, positions) int64: mix(key + (i + 1) GOLDEN)
    offsets: torch.Tensor  # (V,) int64: (v + 1) GOLDEN

    @classmethod
    def allocate(cls, images: int, positions: int, vocab: int, device: torch.device | str) -> "PositionNoise":
        offsets = (torch.arange(1, vocab + 1, dtype=torch.long, device=device) * _signed(GOLDEN))
        return cls(torch.zeros(images, positions, dtype=torch.long, device=device), offsets)

    @classmethod
    def of(cls, generators, images: int, positions: int, vocab: int, device: torch.device | str) -> "PositionNoise":
        noise = cls.allocate(images, positions, vocab, device)
        noise.fill(generators)
        return noise

    def fill(self, generators: Sequence | torch.Generator | None) -> None:
        """The images' bases from their generators' seeds (outside any captured region)."""
        G, P = self.bases.shape
        keys = key_tensor(generators, G, self.bases.device)
        steps = torch.arange(1, P + 1, dtype=torch.long, device=self.bases.device) * _signed(GOLDEN)
        self.bases.copy_(mix64(keys[:, None] + steps))

    def keep_rows(self, images: torch.Tensor) -> "PositionNoise":
        return PositionNoise(self.bases.index_select(0, images), self.offsets)

    @property
    def nbytes(self) -> int:
        return (self.bases.numel() + self.offsets.numel()) * 8

    def bits_at(self, positions: torch.Tensor) -> torch.Tensor:
        """positions (P,) or (G, P) image-token indices inside the table (callers size it: no clamp, one kernel
        less per step) -> (G, P, V) 64-bit patterns."""
        index = positions.expand(self.bases.shape[0], -1)  # (G, P)
        return mix64(self.bases.gather(1, index)[..., None] + self.offsets)

    def exp_at(self, positions: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(G, P, V) Exp(1) values -log u = log 2**24 - log(b + 1/2), b the low 24 bits: 18 kernels in all."""
        low = self.bits_at(positions) & 0xFFFFFF
        return torch.rsub((low.to(dtype) + 0.5).log_(), _LOG_2_24)

    def uniforms_at(self, positions: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(G, P, V) the uniforms behind `exp_at`, (b + 1/2) / 2**24 (for tests and relaxed rules)."""
        low = self.bits_at(positions) & 0xFFFFFF
        return (low.to(dtype) + 0.5) * 2.0**-24


def race_dtype(logits: torch.Tensor) -> torch.dtype:
    """float64 logits race in float64 (the exactness references), everything else in float32."""
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def race_tokens(filtered: torch.Tensor, exp: torch.Tensor) -> torch.Tensor:
    """argmax(filtered logits - log E) on the last dim, E ~ Exp(1) (`exp_at`): a sample of softmax(filtered);
    -inf holes never win."""
    return (filtered.to(exp.dtype) - exp.log()).argmax(-1)

"""Turning logits into tokens: classifier-free guidance, temperature -> top-k -> top-p (LlamaGen's
order), the Gumbel race with position noise that decides every image token (`sample_at`), and inverse-CDF
sampling from explicit uniforms drawn from caller-owned generators (what relaxed rules still use).

Nothing here mutates its inputs or touches global RNG state. Image g's token i depends on g's key (its
generator's seed) and i alone, so a batch of N reproduces N single runs exactly.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..config import SamplingConfig
from .acceptance.position_noise import PositionNoise, race_dtype, race_tokens

Generators = torch.Generator | Sequence[torch.Generator] | None


def combine_cfg(logits: torch.Tensor, scale: float) -> torch.Tensor:
    """Rows are [cond; uncond] (2B, ..., V) -> uncond + scale * (cond - uncond), (B, ..., V)."""
    cond, uncond = logits.chunk(2, dim=0)
    return uncond + scale * (cond - uncond)


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Temperature, then top-k, then top-p, on the last dim: fp32 logits with -inf holes (the input itself when
    it is fp32 and nothing applies; never modify the result in place)."""
    out = logits.float()
    if temperature != 1.0:  # (at 1 the division is a kernel that changes nothing)
        out = out / max(temperature, 1e-5)
    vocab = out.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(out, top_k, dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        remove = cumulative > top_p
        remove[..., 1:] = remove[..., :-1].clone()  # keep the first token that crosses the threshold
        remove[..., 0] = False
        out = out.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
    return out


def probs_from_logits(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """The sampling distribution (fp32, sums to 1 on the last dim) for already CFG-combined logits."""
    return filter_logits(logits, config.temperature, config.top_k, config.top_p).softmax(-1)


def draw_uniforms(generator: Generators, batch: int, device: torch.device) -> torch.Tensor:
    """(batch,) uniforms in [0, 1): one stream for all rows, or one generator per row."""
    if generator is None or isinstance(generator, torch.Generator):
        return torch.rand(batch, generator=generator, device=device)
    if len(generator) != batch:
        raise ValueError(f"got {len(generator)} generators for a batch of {batch}; pass one per sample")
    return torch.cat([torch.rand(1, generator=g, device=device) for g in generator])


def fill_per_image(table: torch.Tensor, generators: Sequence[torch.Generator | None]) -> None:
    """Fill table[g] (a per-image table of uniforms drawn before decoding starts) from `generators[g]`, so image
    g of a batch draws what a single run of it draws."""
    for g, generator in enumerate(generators):
        table[g].uniform_(0.0, 1.0, generator=generator)


def generator_for(generator: Generators, i: int) -> torch.Generator | None:
    """The generator of sample i: the shared one, or the i-th of a per-sample list."""
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    return generator[i]


def cdf_dtype(device: torch.device) -> torch.dtype:
    """float64 wherever the device has it (MPS has not: float32 there)."""
    return torch.float32 if device.type == "mps" else torch.float64


def sample_from_probs(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: probs (B, V), uniforms (B,) -> tokens (B,). Never picks a zero-prob token.

    The cumulative sum runs in float64: CUDA's scan is not bitwise reproducible run to run, and in float32 its
    rounding (about 1e-7 of the total at each of V cells) can decide a draw whose uniform falls that close to a
    cell's edge, so the same seed could give another image on the next run; float64 shrinks that margin to
    about 1e-16, a chance of the order of V x 1e-16 per token."""
    cdf = probs.to(cdf_dtype(probs.device)).cumsum(-1)
    threshold = uniforms[:, None].to(cdf.dtype) * cdf[:, -1:]
    return (cdf <= threshold).sum(-1).clamp_(max=probs.shape[-1] - 1)


def sample_at(logits: torch.Tensor, sampling: SamplingConfig, noise: PositionNoise, positions: torch.Tensor) -> torch.Tensor:
    """CFG-combined logits (B, P, V), or (B, V) for P = 1, of image positions `positions` ((P,) or (B, P))
    -> (B, P) tokens: the race of the filtered law with each position's noise. What AR draws, and what every
    exact decoder's verification draws."""
    logits = logits if logits.dim() == 3 else logits[:, None]  # (B, P, V)
    return race(logits, sampling, noise.exp_at(positions, race_dtype(logits)))


def race(logits: torch.Tensor, sampling: SamplingConfig, exp: torch.Tensor) -> torch.Tensor:
    """CFG-combined logits (..., V) and their positions' Exp(1) values (same shape) -> the tokens the
    filtered laws draw (...): the one arithmetic AR and every exact verification share."""
    return race_tokens(filter_logits(logits, sampling.temperature, sampling.top_k, sampling.top_p), exp)


def pick_tokens(logits: torch.Tensor, config: SamplingConfig, generator: Generators, position: int = 0) -> torch.Tensor:
    """CFG-combined logits (B, V) of image token `position` -> tokens (B,): argmax when greedy, else AR's
    draw (`sample_at` with the keys of `generator`, `position_noise.image_keys`)."""
    if config.greedy:
        return logits.argmax(-1)
    noise = PositionNoise.of(generator, logits.shape[0], position + 1, logits.shape[-1], logits.device)
    return sample_at(logits, config, noise, torch.tensor([position], device=logits.device))[:, 0]


def make_generators(seed: int, batch: int, device: torch.device | str = "cpu") -> list[torch.Generator]:
    """One generator per sample, seeded seed, seed+1, ... (mod 2**64): sample i equals a single run with seed+i."""
    return [torch.Generator(device=device).manual_seed((seed + i) % 2**64) for i in range(batch)]


class NodeDistributions:
    """CFG + filters for one run, per tree node: logits (rows, T, V), image-token index (T,) -> (G, T, V)
    where rows = G trees, or [cond trees; uncond trees] with CFG. Greedy runs get softmax(logits).
    `constrain` (the model's `constrain_logits`) applies a forced-token layout after CFG."""

    def __init__(self, sampling: SamplingConfig, guided: bool, constrain=None):
        self.sampling = sampling
        self.guided = guided
        self.constrain = constrain

    def combine(self, logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        mixed = self._cfg(logits, index)
        return mixed if self.constrain is None else self.constrain(mixed, index)

    def _cfg(self, logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        if not self.guided:
            return logits.float()
        cond, uncond = logits.float().chunk(2, dim=0)
        s = self.sampling
        mixed = uncond + s.cfg_scale * (cond - uncond)  # exactly as AR's combine_cfg (same rounding)
        if s.cfg_interval < 0:
            return mixed
        active = (index <= s.cfg_interval + 1) if s.cfg_interval >= 0 else torch.ones_like(index, dtype=torch.bool)
        active = active[..., None] if index.dim() == 2 else active[None, :, None]  # (G|1, T, 1)
        return torch.where(active, mixed, cond)

    def __call__(self, logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return self._filtered(logits, index).softmax(-1)

    def log_probs(self, logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """log of `__call__` computed as a log-softmax: finite wherever the filters keep a token, even
        where the probability itself underflows float32 (what drafting without replacement needs)."""
        return self._filtered(logits, index).log_softmax(-1)

    def filtered(self, logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """CFG, layout and filters without the normalisation: what a race ranks (CFG-combined logits when greedy)."""
        return self._filtered(logits, index)

    def _filtered(self, logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        combined = self.combine(logits, index)
        if self.sampling.greedy:
            return combined
        s = self.sampling
        return filter_logits(combined, s.temperature, s.top_k, s.top_p)

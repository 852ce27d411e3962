"""Training-free speculative Jacobi decoding (SJD, arXiv 2410.01699) and its coupled variant (SCD,
arXiv 2510.24211) on the static KV cache: no drafter, any target.

A window of W draft tokens rides along with the last accepted token in one causal forward. Draft j was
sampled from a known distribution q_j (uniform for fresh initialisation, the model's own prediction from
the previous iteration otherwise), so the standard speculative test min(1, p_j(d_j) / q_j(d_j)) keeps the
output distributed exactly as AR; the first rejected position is resampled from max(0, p - q), and the
later positions keep the tokens they were just re-sampled from p (the Jacobi update) as next drafts.
Coupled SJD draws every draft by Gumbel-max from one noise table indexed by absolute position (derived
from the run's generator), so a position whose distribution barely changed re-draws the same token and
is accepted. Rollback is free: accepted tokens already sit in consecutive cache slots; slots past the new
length are stale and overwritten. One image at a time (rows = [cond; uncond] with CFG). Relaxed and
grouped acceptance, the auto window and the nodes come later (issue 5).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .conditioning import Condition, build_prefix
from .config import SamplingConfig
from .errors import ConfigError
from .generate import GenerationResult, StepCallback, synchronize
from .models.gpt import ForwardStep, LlamaGenGPT
from .models.kv_cache import attention_mask
from .sampling import Generators, generator_for, pick_tokens, sample_from_probs
from .speculative import NodeDistributions, SpeculativeStats


@dataclass(frozen=True)
class JacobiConfig:
    window: int = 8  # draft tokens verified per forward, besides the last accepted one
    coupled: bool = False  # SCD: Gumbel-max drafts from a per-position noise table

    def __post_init__(self) -> None:
        if not isinstance(self.window, int) or not 1 <= self.window <= 256:
            raise ConfigError("jacobi window", "an integer in 1..256", self.window)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Where a rejected draft's position is resampled from: normalise(max(0, p - q)) (p if that is empty)."""
    residual = (p - q).clamp(min=0)
    total = residual.sum(-1, keepdim=True)
    return torch.where(total > 0, residual / total.clamp(min=torch.finfo(p.dtype).tiny), p)


def _draw(probs: torch.Tensor, positions: torch.Tensor, gumbel: torch.Tensor | None, greedy: bool,
          generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of probs (W, V): argmax when greedy, Gumbel-max with the position's noise when
    coupled, else inverse-CDF sampling with fresh uniforms."""
    if greedy:
        return probs.argmax(-1)
    if gumbel is not None:
        return (probs.clamp(min=0).log() + gumbel[positions]).argmax(-1)
    return sample_from_probs(probs, torch.rand(probs.shape[0], generator=generator, device=probs.device))


@torch.no_grad()
def jacobi_generate(model: LlamaGenGPT, condition: Condition, sampling: SamplingConfig, config: JacobiConfig,
                    generator: Generators = None, on_step: StepCallback | None = None) -> GenerationResult:
    """Sample `condition.batch` images with (coupled) speculative Jacobi decoding; image i uses generator[i]."""
    start = time.perf_counter()
    N = model.config.num_image_tokens
    B = condition.batch
    device = model.tok_embeddings.weight.device
    tokens = torch.empty(B, N, dtype=torch.long, device=device)
    per_cell = torch.ones(B, N, dtype=torch.int32, device=device)
    histogram: list[int] = []
    cache_bytes, prefill_s = 0, 0.0
    for i in range(B):
        report = (lambda done, _i=i: on_step(_i * N + done, B * N, tokens[_i:_i + 1])) if on_step else (lambda d: None)
        nbytes, prefill = _decode_one(model, condition.row(i), sampling, config, generator_for(generator, i),
                                      tokens[i], per_cell[i], histogram, report)
        cache_bytes, prefill_s = max(cache_bytes, nbytes), prefill_s + prefill
    synchronize(device)
    iterations = sum(histogram)
    stats = SpeculativeStats(batch=B, image_tokens=N, forward_passes=B + iterations,
                             wall_time_s=time.perf_counter() - start, prefill_time_s=prefill_s, kv_cache_bytes=cache_bytes,
                             iterations=iterations, accepted_histogram=histogram,
                             tree=f"{'coupled ' if config.coupled else ''}jacobi window {config.window}")
    return GenerationResult(tokens, stats, per_cell)


def _decode_one(model, condition, sampling, config, generator, out, per_cell, histogram, report) -> tuple[int, float]:
    """Decode one image into `out`; returns (KV cache bytes, prefill seconds)."""
    t0 = time.perf_counter()
    N, V = model.config.num_image_tokens, model.config.vocab_size
    W = config.window
    guided = sampling.uses_cfg
    dist = NodeDistributions(sampling, guided)
    prefix = build_prefix(model, condition, guided)
    rows, T = prefix.key_valid.shape
    device = prefix.embeddings.device
    max_len = T + N + W + 1
    cache = model.allocate_cache(rows, max_len)
    key_valid = torch.ones(rows, max_len, dtype=torch.bool, device=device)
    key_valid[:, :T] = prefix.key_valid
    gumbel = None
    if config.coupled and not sampling.greedy:  # one noise row per absolute image position
        u = torch.rand(N + W + 1, V, generator=generator, device=device).clamp_(min=1e-20, max=1 - 1e-7)
        gumbel = -(-u.log()).log()
    try:
        pos = torch.arange(T, device=device)
        hidden = model(prefix.embeddings, ForwardStep(pos, cache, kv_len=T, mask=attention_mask(key_valid, pos, T)))
        out[0] = pick_tokens(dist.combine(model.logits(hidden[:, -1:]), pos.new_zeros(1))[:, 0], sampling, generator)[0]
        prefill_s = time.perf_counter() - t0
        report(1)
        length, done = T, 1
        uniform = torch.full((W, V), 1.0 / V, device=device)
        drafts = _draw(uniform, torch.arange(1, W + 1, device=device), gumbel, False, generator)  # fresh: uniform
        q = uniform.clone()
        while done < N:
            w = min(W, N - done)  # never draft past the last image token
            feed = torch.cat([out[done - 1:done], drafts[:w]])  # (w + 1,)
            slots = torch.arange(length, length + w + 1, device=device)
            step = ForwardStep(slots, cache, kv_len=length + w + 1,
                               mask=attention_mask(key_valid, slots, length + w + 1))
            logits = model.logits(model(model.embed_tokens(feed[None].expand(rows, -1)), step))  # (rows, w+1, V)
            index = done + torch.arange(w + 1, device=device)  # image position each row predicts
            if sampling.greedy:
                p = dist.combine(logits, index)[0].softmax(-1)
                ok = drafts[:w] == p[:w].argmax(-1)
            else:
                p = dist(logits, index)[0]  # (w + 1, V)
                d = drafts[:w, None]
                ratio = p[:w].gather(1, d)[:, 0] / q[:w].gather(1, d)[:, 0].clamp(min=torch.finfo(p.dtype).tiny)
                ok = torch.rand(w, generator=generator, device=device) < ratio
            a = int(ok.long().cumprod(0).sum())  # accepted drafts: the leading run (one host read)
            if a < w and not sampling.greedy:
                new = sample_from_probs(residual_distribution(p[a:a + 1], q[a:a + 1]),
                                        torch.rand(1, generator=generator, device=device))
            else:
                new = p[a:a + 1].argmax(-1) if sampling.greedy else \
                    sample_from_probs(p[a:a + 1], torch.rand(1, generator=generator, device=device))
            emitted = torch.cat([drafts[:a], new])
            take = min(emitted.numel(), N - done)
            out[done:done + take] = emitted[:take]
            per_cell[done:done + take] = emitted.numel()
            length += a + 1  # root + accepted drafts stay; later slots are rolled back by the length alone
            done += take
            while len(histogram) <= a:
                histogram.append(0)
            histogram[a] += 1
            report(done)
            # Jacobi update: later window positions re-draw from what the model just predicted for them
            keep = torch.arange(min(a + 1, w), w, device=device)
            nxt_q = torch.cat([p[keep], uniform[: W - keep.numel()]])
            fresh_pos = done + keep.numel() + torch.arange(W - keep.numel(), device=device)
            drafts = torch.cat([_draw(p[keep], done + torch.arange(keep.numel(), device=device), gumbel,
                                      sampling.greedy, generator),
                                _draw(uniform[: W - keep.numel()], fresh_pos.clamp(max=N + W), gumbel, False, generator)])
            q = nxt_q
    finally:
        nbytes = cache.nbytes
        cache.release()
    return nbytes, prefill_s

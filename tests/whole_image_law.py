"""The exact law of whole images for tiny models, and a pooled chi-square against it.

`image_law` enumerates every image of a tiny grid (V ** N of them) and computes its probability under
the sampler's own distribution (CFG mix, temperature, top-k / top-p) from full teacher-forced forwards,
independently of the KV cache, trees and acceptance code under test. `pooled_pvalue` is Pearson's
chi-square over whole images, with cells sorted by expected count and pooled until each bin expects >= 5.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from scipy.stats import chi2

from lantern_core.config import SamplingConfig
from lantern_core.models.gpt import LlamaGenGPT
from lantern_core.decoding.sampling import NodeDistributions


@dataclass(frozen=True)
class ImageLaw:
    images: torch.Tensor  # (V ** N, N) every image, in base-V order (image i has code i)
    probs: torch.Tensor  # (V ** N,) float64
    vocab: int

    def codes(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, N) sampled images -> (B,) their row in `images`."""
        N = tokens.shape[1]
        weights = self.vocab ** torch.arange(N - 1, -1, -1)
        return (tokens.long().cpu() * weights).sum(1)


@torch.no_grad()
def image_law(model: LlamaGenGPT, label: int, sampling: SamplingConfig) -> ImageLaw:
    config = model.config
    V, N = config.vocab_size, config.num_image_tokens
    images = torch.tensor(list(itertools.product(range(V), repeat=N)))  # (V**N, N)
    labels = torch.full((len(images),), label)
    dist = NodeDistributions(sampling, sampling.uses_cfg)
    if sampling.uses_cfg:  # conditional rows first, then the null class, as the decoders lay them out
        labels = torch.cat([labels, torch.full_like(labels, config.num_classes)])
        tokens = torch.cat([images, images])
    else:
        tokens = images
    logits = model.training_logits(labels, tokens)  # (rows, N, V), row i's position t predicts token t
    log_p = torch.zeros(len(images), dtype=torch.float64)
    rows = torch.arange(len(images))
    for t in range(N):
        step = dist.log_probs(logits[:, t:t + 1], torch.tensor([t]))[:, 0]  # (V**N, V)
        log_p += step[rows, images[:, t]].double()
    return ImageLaw(images, log_p.exp(), V)  # not renormalised: it sums to 1 when the steps line up


def pooled_pvalue(law: ImageLaw, tokens: torch.Tensor) -> float:
    """Pearson chi-square p-value of sampled images (B, N) against `law`, pooling sparse cells.
    An image the law gives probability 0 is an immediate failure (p = 0)."""
    counts = torch.bincount(law.codes(tokens), minlength=len(law.probs)).double()
    expected = law.probs * counts.sum()
    if bool((counts[expected == 0] > 0).any()):
        return 0.0
    bins: list[list[float]] = []  # [observed, expected] per pooled bin
    seen = want = 0.0
    for i in torch.argsort(expected).tolist():
        seen += float(counts[i])
        want += float(expected[i])
        if want >= 5.0:
            bins.append([seen, want])
            seen = want = 0.0
    if want > 0 and bins:  # cells left over after the last full bin join it
        bins[-1][0] += seen
        bins[-1][1] += want
    stat = sum((o - e) ** 2 / e for o, e in bins)
    return float(chi2.sf(stat, max(len(bins) - 1, 1)))

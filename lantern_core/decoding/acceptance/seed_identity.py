"""Whether a decoder's image for a seed is plain AR's: the rule the sampler's stats state ("same image as ar for
this seed") and the `auto` choices obey (a choice the image does not follow may differ per batch size; one it
follows is made once per model, machine and image shape). It decodes nothing."""
from __future__ import annotations

import torch

from ...config import SamplingConfig
from .relaxation import relaxes


def uses_same_as_ar(spec, sampling: SamplingConfig) -> bool:
    """A sampled tree decoder whose rule is lossless (no relaxation, or one that relaxes nothing) and whose
    `exact_rule` (a `SpeculativeConfig` or `TreeShape`) is "same_as_ar" verifies with `walk_same_as_ar`."""
    return (not sampling.greedy and not relaxes(spec.relaxation)
            and getattr(spec, "exact_rule", "same_as_ar") == "same_as_ar")


def same_image_as_ar(spec, sampling: SamplingConfig, dtype: torch.dtype = torch.float32) -> bool:
    """Whether a run of `spec` (None for plain AR, a `SpeculativeConfig` or a `JacobiConfig`) gives plain AR's
    image for every seed: lossless trees and Jacobi windows (continuation and proactive drafting included) with
    the AR-identical rule, and every lossless mode when greedy; in float32 or float64 only: in bf16 / fp16 a
    forward over a tree or window rounds its logits unlike AR's one-token step, so races flip and the images part
    after a few dozen tokens (`benchmarks/same_seed.py` measures it; each is still an exact sample of AR's law)."""
    if spec is None:
        return True
    if dtype not in (torch.float32, torch.float64):  # half-precision verification rounds unlike AR's step
        return False
    if hasattr(spec, "row_commit"):  # a JacobiConfig (duck-typed: the decoders' packages import this module)
        lossless = not relaxes(spec.relaxation) and not relaxes(spec.grouping) and not spec.row_commit
        return (sampling.greedy and lossless) or spec.same_as_ar
    return uses_same_as_ar(spec, sampling) or (sampling.greedy and not relaxes(spec.relaxation))


def image_follows_choice(spec, sampling: SamplingConfig, dtype: torch.dtype) -> bool:
    """Whether an `auto` tree, window or geometry can change the image of a seed under `spec` (relaxed rules, the
    residual rules, and every mode in half precision): such a choice is made for one image, whatever the batch,
    so image i of a batch stays its single run."""
    return not same_image_as_ar(spec, sampling, dtype)

"""Tolerances for comparing a floating-point run of a model with a float64 reference of the same math.

Why not a fixed 1e-5: two float32 runs of one network that take different kernel paths (transformers'
layer vs ours, cached vs uncached, batched vs single, an explicit mask vs `is_causal`) round differently,
and by how much depends on the BLAS / oneDNN kernels the CPU picks (block sizes, FMA, summation order).
A tolerance measured on one machine fails on another (an Intel Xeon gave 1.47e-4 where 1e-4 was allowed).
So these tests compute the reference in float64, whose rounding (~1e-16) is negligible, and bound only
the error of the run under test, from its dtype's machine epsilon and the computation's size:

- a dot product of inner size K rounds K times; the roundings are nearly independent, so its error
  relative to the magnitudes that enter it grows like eps * sqrt(K) (a random walk);
- the errors of sequential reductions add: `depth` of them (2 per transformer layer, attention and MLP,
  plus 1 for a head; the conv and linear layers of a VQ decoder);
- SAFETY covers the tail: the largest of ~1e4 entries of a random walk lies ~4 standard deviations out.
  (Norms and softmax amplify little on these models: where these tests were written the largest errors
  came to 1/20 .. 1/8 of the bound before SAFETY, so other kernels have a 30x+ margin.)

The bound is relative to the values' scale: an entry's rounding error grows with the magnitudes summed
into it, not with the entry itself (which may cancel to near zero), so `assert_close_to_reference` uses
rtol = tol and atol = tol * max |reference|. For float32 on the tiny test models tol is 5e-6 (a one-layer
T5) to 3e-4 (a ~30-conv VQ decoder), 2e-5 .. 5e-5 for the 2-layer transformers: far below the O(0.1 .. 10)
differences that a wrong mask, position, weight layout or cache slot produces (where a test also checks
that a wrong variant differs, it asks for more than 100x the tolerance).
"""
from __future__ import annotations

import copy
import math

import torch

SAFETY = 4.0  # the tail: the largest of ~1e4 entries of a random walk lies ~4 standard deviations out


def float_tolerance(dtype: torch.dtype, inner: int, depth: int = 1, safety: float = SAFETY) -> float:
    """Relative error bound of a `dtype` computation made of `depth` sequential reductions of inner size
    at most `inner`, against an exact (float64) reference: safety * depth * eps(dtype) * sqrt(inner)."""
    return safety * depth * torch.finfo(dtype).eps * math.sqrt(inner)


def transformer_tolerance(dtype: torch.dtype, inner: int, layers: int, extra: int = 1) -> float:
    """`float_tolerance` of a transformer: 2 sequential reductions per layer (attention, MLP) plus `extra`
    outside the layers (1: an output head; more for input projections or a multi-layer head); `inner` the
    largest of width, MLP width and attention length."""
    return float_tolerance(dtype, inner, 2 * layers + extra)


def model_tolerance(dtype: torch.dtype, config, extra: int = 1, length: int = 0) -> float:
    """`transformer_tolerance` for a target's GPTConfig (dim, ffn_dim, n_layer); `length` the longest
    attention row, where it exceeds both widths."""
    return transformer_tolerance(dtype, max(config.dim, config.ffn_dim, length), config.n_layer, extra)


def vq_decode_tolerance(dtype: torch.dtype, vq: torch.nn.Module) -> float:
    """`float_tolerance` of a VQ decode (codebook lookup, post-quant conv, decoder): every conv counted as
    one sequential reduction (an upper bound: shortcut convs run beside the main path), inner size the
    largest in_channels * kernel area; mid-block attention rows (h * w keys) are shorter than that."""
    convs = [m for m in vq.modules() if isinstance(m, torch.nn.Conv2d)]
    decoding = [m for name, m in vq.named_modules() if isinstance(m, torch.nn.Conv2d)
                and (name.startswith("decoder.") or name == "post_quant_conv")]
    assert decoding and len(decoding) < len(convs), "expected our VQModel (decoder.*, post_quant_conv)"
    inner = max(m.in_channels // m.groups * m.kernel_size[0] * m.kernel_size[1] for m in decoding)
    return float_tolerance(dtype, inner, len(decoding))


ROUNDINGS_PER_LAYER = 12  # outputs rounded to the run dtype in sequence: norms, projections, RoPE, attention, MLP, residuals


def rounded_tolerance(dtype: torch.dtype, config) -> float:
    """A whole run in `dtype` (half precision included) against the float64 reference, on O(1) values:
    each layer rounds about ROUNDINGS_PER_LAYER outputs to the run dtype (eps each: in bf16 / fp16 this
    dominates) and accumulates two chains of dot products of inner size K in float32 (eps32 * sqrt(K);
    CPUs and GPUs accumulate half-precision GEMMs in float32). `config`: dim, ffn_dim, n_layer. On the tiny
    t2i model: float32 1.1e-5, bf16 0.19. `float_tolerance` instead assumes every op in `dtype`, which for
    half precision overstates the error by sqrt(K)."""
    inner = max(config.dim, config.ffn_dim)
    per_layer = ROUNDINGS_PER_LAYER * torch.finfo(dtype).eps + 2 * torch.finfo(torch.float32).eps * math.sqrt(inner)
    return config.n_layer * per_layer


def float64_copy(module: torch.nn.Module) -> torch.nn.Module:
    """The module's float64 twin (its float32 original untouched), for computing references. Our targets'
    `logits` round to float32 (what sampling reads): the twin's return its head's float64 output instead."""
    from lantern_core.models.gpt import LlamaGenGPT
    from lantern_core.models.prompted import PromptedImageLM

    twin = copy.deepcopy(module).double()
    if isinstance(twin, LlamaGenGPT):
        twin.logits = lambda hidden: twin.output(hidden)
    elif isinstance(twin, PromptedImageLM):
        twin.logits = lambda hidden: twin.image.logits(hidden)
    return twin


def assert_close_to_reference(actual: torch.Tensor, reference: torch.Tensor, tol: float) -> None:
    """actual (any float dtype) within tol of the float64 reference: |actual - ref| <= tol * (|ref| +
    max |ref|); see the module docstring for why the scale is the reference's largest magnitude."""
    assert reference.dtype == torch.float64, "compute the reference in float64"
    scale = reference.abs().max().item()
    assert scale > 0, "a reference of zeros tells nothing apart"
    torch.testing.assert_close(actual.double(), reference, rtol=tol, atol=tol * scale)

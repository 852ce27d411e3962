"""Reading already-quantized GPT weights strictly, and casting a state dict for a load.

A quantized file (LlamaGen / gpt-fast key names) holds, for a block's linear layer, `<layer>.weight` in int8
or float8_e4m3fn (out, in) and its per-output-channel scale `<layer>.scale` (gpt-fast spells it `scales`),
floating point, (out,). Only the blocks' linear layers (`layers.N.attention.wqkv|wo`,
`layers.N.feed_forward.w1|w2|w3`) may be quantized; w1 and w3 must share a format (they are held as one
matrix). Anything else (a quantized weight without its scale, a scale without its weight, a scale next to a
full-precision weight, a quantized embedding) is a `CheckpointError` naming the tensor. Shapes and the scale's
kind of dtype are checked by the strict load itself. This module does not quantize (`models/quantized.py`).
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from ..errors import CheckpointError
from ..models.quantized import Scheme, scheme_of

LINEAR = re.compile(r"^layers\.\d+\.(attention\.(wqkv|wo)|feed_forward\.(w1|w2|w3))$")
FIX = ("use a quantized model's saved state_dict (docs/quantization.md) or gpt-fast's int8 file (weight int8 / "
       "float8_e4m3fn plus a per-row scale), or load the released full-precision file and choose int8 or fp8 in "
       "weights")


def rename_scales(path: Path, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """gpt-fast's `<layer>.scales` -> our `<layer>.scale` (a file with both spellings is refused)."""
    out = {}
    for key, value in tensors.items():
        if key.endswith(".scales"):
            key = key[:-len("scales")] + "scale"
            if key in tensors:
                raise CheckpointError(path, "one scale per layer", f"both {key} and {key}s", FIX)
        out[key] = value
    return out


def quantized_layers(path: Path, tensors: dict[str, torch.Tensor]) -> dict[str, Scheme]:
    """{module prefix (e.g. "layers.0.feed_forward.w13"): scheme} of every quantized linear in `tensors` (our
    key names, scales already renamed); {} for a full-precision file. Raises CheckpointError as above."""
    schemes: dict[str, Scheme] = {}
    for key, value in tensors.items():
        prefix, _, leaf = key.rpartition(".")
        scheme = scheme_of(value.dtype)
        if leaf == "scale":
            weight = tensors.get(prefix + ".weight")
            if weight is None or scheme_of(weight.dtype) is None:
                found = "no such tensor" if weight is None else f"a {weight.dtype} weight"
                raise CheckpointError(path, f"{prefix}.weight in int8 or float8_e4m3fn next to the scale {key}",
                                      found, FIX)
        elif scheme is not None:
            if prefix + ".scale" not in tensors:
                raise CheckpointError(path, f"the per-row scale {prefix}.scale of the {value.dtype} tensor {key}",
                                      "no such tensor", FIX)
            if leaf != "weight" or not LINEAR.match(prefix):
                raise CheckpointError(path, "quantized weights only in the blocks' linear layers "
                                      "(attention.wqkv, attention.wo, feed_forward.w1/w2/w3)",
                                      f"{key} in {value.dtype}", FIX)
            module = re.sub(r"\.w[13]$", ".w13", prefix)
            if schemes.get(module, scheme) != scheme:
                raise CheckpointError(path, f"{prefix[:-2]}w1.weight and w3.weight in one format",
                                      f"{schemes[module].storage} and {scheme.storage}", FIX)
            schemes[module] = scheme
    return schemes


def cast_for_load(tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every full-precision floating tensor (scales included) in `dtype`; quantized weights and integer
    buffers as they are."""
    return {k: v.to(dtype) if v.is_floating_point() and scheme_of(v.dtype) is None else v
            for k, v in tensors.items()}


def finite(tensor: torch.Tensor) -> bool:
    """No NaN or Inf (float8 has no isfinite kernel: checked through float32)."""
    if scheme_of(tensor.dtype) is not None and tensor.is_floating_point():
        tensor = tensor.float()
    return bool(torch.isfinite(tensor).all())

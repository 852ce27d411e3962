"""Weight-only quantization of the transformer blocks' linear layers: int8 and fp8 (e4m3).

Each output channel (row of the (out, in) weight) gets one scale, symmetric around zero: int8 holds
round(w / s) with s = max|w_row| / 127, fp8 holds w / s rounded to e4m3 with s = max|w_row| / 448. Scales are
held in the compute dtype (rounded to it before the weights are quantized against them, so the dequantized
weight is q * s with s exactly as stored).

The matmul (docs/quantized_matmul.md). A decode step multiplies a few rows (batch x CFG x tokens) by every
weight, so it is bound by the bytes it reads. Up to `FUSED_ROWS` rows, `fused_matmul` reads each stored
byte once and never forms a dequantized weight: traced inline when Inductor compiles the step (compile
"auto"), and on CUDA otherwise ("graphs", "off") through `run_fused`, the same function compiled by Inductor
once per shape. Elsewhere (CPU, MPS, more rows, or no working Inductor) the forward is
`linear(x, q.to(x.dtype)) * s`: one layer's weight dequantized transiently, two extra kernels per linear.

What is quantized: `wqkv`, `wo`, `w13`, `w2` of every `TransformerBlock` (about 97 % of a 7B target's bytes).
Embeddings, norms, the image head and the drafter stay in the compute dtype. This module does not load
files (`loading/checkpoints.py` reads quantized tensors strictly) and picks no device.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import is_fake

from ..errors import ConfigError

log = logging.getLogger("lantern_core.quantized")

LINEARS = (("attention", "wqkv"), ("attention", "wo"), ("feed_forward", "w13"), ("feed_forward", "w2"))


@dataclass(frozen=True)
class Scheme:
    """One weight format: its name, the dtype the weights are stored in and the largest magnitude it holds."""

    name: str
    storage: torch.dtype
    qmax: float


SCHEMES = {
    "int8": Scheme("int8", torch.int8, 127.0),
    "fp8": Scheme("fp8", torch.float8_e4m3fn, 448.0),
}
WEIGHT_CHOICES = ("none", *SCHEMES)
FUSED_ROWS = 16  # at most this many rows (batch x CFG x tokens) take `fused_matmul`; 0 turns it off
KERNEL_DEVICES = ("cuda",)  # where an uncompiled forward runs the compiled `fused_matmul` (`run_fused`)


def scheme_named(name: str) -> Scheme | None:
    """The scheme for a `weights` choice ("none" -> None); anything else is a ConfigError."""
    if name == "none":
        return None
    if name not in SCHEMES:
        raise ConfigError("weights", f"one of {list(WEIGHT_CHOICES)}", repr(name), "choose none, int8 or fp8")
    return SCHEMES[name]


def scheme_of(dtype: torch.dtype) -> Scheme | None:
    """The scheme whose weights are stored in `dtype`, or None."""
    return next((s for s in SCHEMES.values() if s.storage == dtype), None)


def quantize_weight(weight: torch.Tensor, scheme: Scheme, scale_dtype: torch.dtype) -> tuple[torch.Tensor,
                                                                                                torch.Tensor]:
    """(out, in) weight -> (q (out, in) in the scheme's storage dtype, scale (out,) in `scale_dtype`).
    Arithmetic in float32; the scale is rounded to `scale_dtype` first, so q * scale is the dequantized
    weight the forward uses. An all-zero row gets scale 1 and zeros."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)  # (out,)
    scale = torch.where(amax > 0, amax / scheme.qmax, torch.ones_like(amax)).to(scale_dtype)
    scaled = (w / scale.float()[:, None]).clamp(-scheme.qmax, scheme.qmax)  # (out, in)
    if scheme.storage == torch.int8:
        scaled = scaled.round()
    return scaled.to(scheme.storage), scale


def fused_matmul(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(rows, in) x quantized (out, in) -> (rows, out) in x's dtype: each row's dot products with the stored
    weight, accumulated in float32, times the scale, rounded once. Written for Inductor: the rows' reductions
    share one loop over `in`, which loads and converts each stored weight once (a GEMV over 1-byte weights,
    half of bf16's bytes). Eagerly it would form a float32 weight per row: call it under Inductor only
    (inline in a compiled step, or through `run_fused`)."""
    dots = [(weight.float() * x[row].float()).sum(-1) for row in range(x.shape[0])]
    return (torch.stack(dots) * scale.float()).to(x.dtype)


_kernels: dict[tuple, Callable] = {}  # (shapes, strides, dtypes, device) -> compiled fused_matmul
_failed: set[tuple] = set()  # (device type, weight dtype) where compiling fused_matmul failed once
_compile_lock = threading.Lock()


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def run_fused(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor | None:
    """`fused_matmul(x, weight, scale)` through Inductor, compiled at a shape's first call (seconds; kept for
    the session, and on disk by Inductor's cache) and autotuned by that call. None where it cannot run: while
    a CUDA graph captures a shape not compiled yet (compiling inside a capture would break it; the step runners
    warm every shape up first), or where compiling failed once for this device kind and weight format (no
    Triton, an fp8 conversion the GPU lacks: one warning, then the caller's dequantize + GEMM)."""
    x = x.contiguous()
    key = (tuple(x.shape), tuple(weight.shape), weight.stride(), x.dtype, weight.dtype, scale.dtype, x.device)
    kernel = _kernels.get(key)
    if kernel is not None:
        return kernel(x, weight, scale)
    kind = (x.device.type, weight.dtype)
    if kind in _failed or _capturing(x.device):
        return None
    with _compile_lock:
        if key in _kernels:  # another thread compiled it meanwhile
            return _kernels[key](x, weight, scale)
        try:
            from torch._inductor import compile as inductor_compile
            from torch.fx.experimental.proxy_tensor import make_fx

            log.info("compiling the fused %s matmul for %d rows x %s (once per shape)", weight.dtype, x.shape[0],
                     tuple(weight.shape))
            graph = make_fx(fused_matmul, tracing_mode="fake")(x, weight, scale)
            options = {"coordinate_descent_tuning": True} if x.device.type == "cuda" else {}
            kernel = inductor_compile(graph, [x, weight, scale], options=options)
            out = kernel(x, weight, scale)  # the first call autotunes: never inside a capture
        except Exception as error:  # a missing compiler must not fail an image: dequantize instead
            _failed.add(kind)
            log.warning("Inductor could not compile the fused %s matmul on %s (%s: %s); int8/fp8 linear layers "
                        "dequantize their weight at every call instead (slower)", weight.dtype, x.device.type,
                        type(error).__name__, error)
            return None
        _kernels[key] = kernel
    return out


class QuantizedLinear(nn.Module):
    """A bias-free linear layer over a quantized weight (out, in) and its per-row scale (out,)."""

    def __init__(self, in_features: int, out_features: int, scheme: Scheme, scale_dtype: torch.dtype,
                 device=None):
        super().__init__()
        self.in_features, self.out_features, self.scheme = in_features, out_features, scheme
        self.register_buffer("weight", torch.empty(out_features, in_features, dtype=scheme.storage, device=device))
        self.register_buffer("scale", torch.ones(out_features, dtype=scale_dtype, device=device))

    @classmethod
    def from_linear(cls, linear: nn.Linear, scheme: Scheme) -> "QuantizedLinear":
        if linear.bias is not None:
            raise ConfigError("weights", "bias-free linear layers", "a linear layer with a bias",
                              "choose weights none for this model")
        weight = linear.weight
        module = cls(weight.shape[1], weight.shape[0], scheme, weight.dtype, device=weight.device)
        module.weight, module.scale = quantize_weight(weight, scheme, weight.dtype)
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows, shape = x.numel() // self.in_features, (*x.shape[:-1], self.out_features)
        compiling = torch.compiler.is_compiling()
        if 0 < rows <= FUSED_ROWS and (compiling or (x.device.type in KERNEL_DEVICES and not is_fake(x))):
            x2d = x.reshape(rows, self.in_features)
            out = fused_matmul(x2d, self.weight, self.scale) if compiling else run_fused(x2d, self.weight,
                                                                                         self.scale)
            if out is not None:
                return out.view(shape)
        if compiling:  # scale before the reshape: Inductor rewrites `linear(x, q.to()) * s` on int8 into
            # aten._weight_int8pack_mm, one thread per output on CUDA (far slower than dequantize + GEMM)
            x2d = x.reshape(rows, self.in_features)
            return (torch.mm(x2d, self.weight.to(x.dtype).t()) * self.scale.to(x.dtype)).view(shape)
        return F.linear(x, self.weight.to(x.dtype)) * self.scale.to(x.dtype)

    def _apply(self, fn, recurse=True):
        """`.to(dtype)` casts the scale (it follows the compute dtype) but never the stored weight: fp8 is a
        floating dtype, which `.to(bf16)` would otherwise widen back to two bytes."""
        weight = self.weight
        super()._apply(fn, recurse)
        if self.weight.dtype != weight.dtype:
            self._buffers["weight"] = weight.to(device=self.weight.device)
        return self

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, weights={self.scheme.name}"


def block_linears(model: nn.Module):
    """(block, parent module, attribute name) of every quantizable linear layer of `model`'s blocks."""
    from .gpt import TransformerBlock

    for block in model.modules():
        if isinstance(block, TransformerBlock):
            for parent, name in LINEARS:
                yield block, getattr(block, parent), name


@torch.no_grad()
def quantize_blocks(model: nn.Module, scheme: Scheme | None) -> nn.Module:
    """Replace the blocks' linear layers of `model` by quantized ones, in place, one layer at a time (so
    host memory peaks at the model plus one layer's weight). None leaves the model as it is."""
    if scheme is None:
        return model
    for _, parent, name in list(block_linears(model)):
        linear = getattr(parent, name)
        if isinstance(linear, nn.Linear):
            setattr(parent, name, QuantizedLinear.from_linear(linear, scheme))
    return model


def quantize_at_load(model: nn.Module, scheme: Scheme | None, notes: list[str]) -> nn.Module:
    """`quantize_blocks` for a loader: adds a load note saying so (the loaders log their notes)."""
    if scheme is not None:
        model = quantize_blocks(model, scheme)
        notes.append(f"blocks quantized to {scheme.name} at load ({resident_bytes(model) / 2**20:.1f} MiB of weights)")
    return model


def prepare_quantized(model: nn.Module, schemes: dict[str, Scheme], scale_dtype: torch.dtype) -> None:
    """Before a strict load of already-quantized weights: swap in an empty `QuantizedLinear` for every linear
    named in `schemes` (state-dict prefix such as "layers.3.attention.wqkv" -> its scheme)."""
    for prefix, scheme in schemes.items():
        parent_name, _, name = prefix.rpartition(".")
        parent = model.get_submodule(parent_name)
        linear = getattr(parent, name)
        setattr(parent, name, QuantizedLinear(linear.in_features, linear.out_features, scheme, scale_dtype,
                                              device=linear.weight.device))


def weights_scheme(model: nn.Module) -> str:
    """"int8", "fp8" or "none": how `model`'s block linears are stored ("mixed" if they differ)."""
    names = {getattr(getattr(parent, name), "scheme", None) for _, parent, name in block_linears(model)}
    names = {s.name if s is not None else "none" for s in names}
    return names.pop() if len(names) == 1 else ("none" if not names else "mixed")


def quantizable_bytes(model: nn.Module) -> int:
    """Bytes of the block linears' weights still in the compute dtype: what weight-only int8 / fp8 would store
    in one byte per weight."""
    total = 0
    for _, parent, name in block_linears(model):
        layer = getattr(parent, name)
        if not isinstance(layer, QuantizedLinear):
            total += layer.weight.numel() * layer.weight.element_size()
    return total


def resident_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer `model` holds (tensors shared between modules counted once)."""
    seen, total = set(), 0
    for tensor in [*model.parameters(), *model.buffers()]:
        key = tensor.data_ptr() or id(tensor)  # meta tensors have no storage
        if key not in seen:
            seen.add(key)
            total += tensor.numel() * tensor.element_size()
    return total

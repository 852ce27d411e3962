"""The int8 / fp8 matmul of a decode step reads the stored weight and never forms a dequantized copy of it
(docs/quantized_matmul.md), checked on the CPU from the code Inductor generates: inline in a compiled step
(compile "auto") and as the per-shape kernel an uncompiled step runs on CUDA ("graphs", "off"). Results
against a float64 reference, within the rounding their dtype allows. Two small Inductor compiles in all."""
from __future__ import annotations

import re

import pytest
import torch
from torch._inductor.utils import run_and_get_code
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import lantern_core.models.quantized as quantized
from lantern_core.models.quantized import SCHEMES, QuantizedLinear

DTYPE = torch.bfloat16
FLOATING = {"torch.bfloat16", "torch.float16", "torch.float32", "torch.float64"}


def quantized_linear(fmt: str, in_features: int, out_features: int, seed: int) -> QuantizedLinear:
    linear = torch.nn.Linear(in_features, out_features, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(seed)))
    return QuantizedLinear.from_linear(linear.to(DTYPE), SCHEMES[fmt])


def rows_of(count: int, width: int, seed: int) -> torch.Tensor:
    return torch.randn(count, 1, width, generator=torch.Generator().manual_seed(seed)).to(DTYPE)


def assert_within_rounding(out: torch.Tensor, x: torch.Tensor, layer: QuantizedLinear, roundings: int) -> None:
    """|out - exact| <= roundings * u(DTYPE) * |exact| + (K + 1) * u(float32) * sum_k |x_k q_k s|: `roundings`
    roundings of the result to DTYPE, float32 accumulation over the inner size K (a worst-case bound)."""
    x64 = x.reshape(-1, layer.in_features).double()
    q64, s64 = layer.weight.double(), layer.scale.double()
    exact = (x64 @ q64.t()) * s64
    magnitude = (x64.abs() @ q64.abs().t()) * s64.abs()
    unit, unit32 = torch.finfo(DTYPE).eps / 2, torch.finfo(torch.float32).eps / 2
    bound = roundings * unit * exact.abs() + (layer.in_features + 1) * unit32 * magnitude
    error = (out.reshape(exact.shape).double() - exact).abs()
    assert bool((error <= bound).all()), f"worst error / bound {float((error / bound).max()):.2f}"


def floating_buffers(code: str) -> list[int]:
    """Element counts of the floating buffers the generated wrapper allocates."""
    found = re.findall(r"empty_strided_\w+\(\(([^)]*)\),\s*\([^)]*\),\s*(torch\.\w+)", code)
    sizes = []
    for shape, dtype in found:
        if dtype in FLOATING:
            numel = 1
            for size in filter(None, (s.strip() for s in shape.split(","))):
                numel *= int(size)
            sizes.append(numel)
    return sizes


class Outputs(TorchDispatchMode):
    """(shape, dtype) of every tensor an op dispatched eagerly returns."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[tuple, torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.seen.append((tuple(t.shape), t.dtype))
        return out


@pytest.fixture
def fresh_kernels(monkeypatch):
    monkeypatch.setattr(quantized, "_kernels", {})
    monkeypatch.setattr(quantized, "_failed", set())
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_a_compiled_step_reads_int8_weights_without_dequantizing_them(fresh_kernels):
    """Few rows (a decode step): one fused reduction reads the int8 weight, no weight-sized float buffer.
    Many rows (a prefill): dequantize + GEMM (the control: the detector sees that weight-sized buffer), and not
    aten._weight_int8pack_mm, which Inductor's int8 pattern would pick and which is one thread per output on CUDA."""
    few, many = quantized_linear("int8", 64, 96, seed=0), quantized_linear("int8", 64, 40, seed=1)
    x_few, x_many = rows_of(2, 64, seed=2), rows_of(quantized.FUSED_ROWS + 4, 64, seed=3)

    def step(a, b):
        return few(a), many(b)

    with torch.no_grad():
        (out_few, out_many), codes = run_and_get_code(torch.compile(step, fullgraph=True, dynamic=False),
                                                      x_few, x_many)
    code = "\n".join(codes)
    buffers = floating_buffers(code)
    assert few.weight.numel() not in buffers, buffers
    assert many.weight.numel() in buffers, buffers
    assert "_weight_int8pack_mm" not in code
    assert re.search(r"void\s+kernel\(const int8_t\*", code), "no generated kernel reads the int8 weight itself"
    assert_within_rounding(out_few, x_few, few, roundings=1)  # float32 accumulation, rounded once
    assert_within_rounding(out_many, x_many, many, roundings=2)  # bf16 GEMM output, then the scale


def test_an_uncompiled_step_runs_a_compiled_fused_fp8_kernel(fresh_kernels, monkeypatch):
    """The "graphs" path (an eager step on CUDA; here the CPU stands in): the forward calls `fused_matmul`
    compiled for its shape, whose code forms no weight-sized float buffer, and dispatches no eager op that
    makes one; the plain eager forward, as a control, does."""
    layer, x = quantized_linear("fp8", 64, 96, seed=4), rows_of(4, 64, seed=5)
    weight_shape = (layer.out_features, layer.in_features)
    monkeypatch.setattr(quantized, "KERNEL_DEVICES", ("cpu",))
    with torch.no_grad():
        first, codes = run_and_get_code(layer, x)
        assert len(codes) == 1 and len(quantized._kernels) == 1
        assert layer.weight.numel() not in floating_buffers(codes[0]), floating_buffers(codes[0])
        with Outputs() as fused:
            again = layer(x)
        monkeypatch.setattr(quantized, "KERNEL_DEVICES", ())
        with Outputs() as plain:
            eager = layer(x)
    assert torch.equal(first, again) and len(quantized._kernels) == 1  # compiled once, reused
    assert all(not (shape == weight_shape and dtype.is_floating_point) for shape, dtype in fused.seen), fused.seen
    assert (weight_shape, DTYPE) in plain.seen
    assert_within_rounding(again, x, layer, roundings=1)
    assert_within_rounding(eager, x, layer, roundings=2)


def test_a_failed_compile_falls_back_to_dequantizing_once_per_device_and_format(fresh_kernels, monkeypatch, caplog):
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("no triton")

    monkeypatch.setattr(torch._inductor, "compile", broken)
    monkeypatch.setattr(quantized, "KERNEL_DEVICES", ("cpu",))
    layer, x = quantized_linear("int8", 32, 48, seed=6), rows_of(2, 32, seed=7)
    with torch.no_grad():
        outs = [layer(x), layer(rows_of(3, 32, seed=8))]
        expected = torch.nn.functional.linear(x, layer.weight.to(DTYPE)) * layer.scale
    assert len(calls) == 1 and ("cpu", torch.int8) in quantized._failed
    assert torch.equal(outs[0], expected)
    assert sum("could not compile the fused" in r.getMessage() for r in caplog.records) == 1


def test_fake_and_meta_tensors_take_the_dequantizing_path(fresh_kernels, monkeypatch):
    """The capture audit (fake "cuda" tensors) and the memory plan (meta) run without compiling anything."""
    monkeypatch.setattr(quantized, "run_fused", lambda *a: pytest.fail("compiled a kernel for data-less tensors"))
    layer = quantized_linear("int8", 32, 48, seed=9)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = QuantizedLinear(32, 48, SCHEMES["int8"], DTYPE)
        fake.weight, fake.scale = mode.from_tensor(layer.weight).to("cuda"), mode.from_tensor(layer.scale).to("cuda")
        assert fake(torch.empty(2, 1, 32, dtype=DTYPE, device="cuda")).shape == (2, 1, 48)
    meta = QuantizedLinear(32, 48, SCHEMES["int8"], DTYPE, device="meta")
    assert meta(torch.empty(2, 1, 32, dtype=DTYPE, device="meta")).shape == (2, 1, 48)

"""A GPU's capture rules checked without a GPU: decoders run on fake "cuda" tensors and every captured step is
audited op by op.

`audit_captured_steps(decode)` runs `decode()` (a whole decoder call on a model made by `fake_cuda_model`) under
`torch._subclasses.fake_tensor.FakeTensorMode`, where tensors carry a "cuda" device and shapes but no data. The
decoder builds its step runner as on a GPU; instead of recording CUDA graphs, each variant's step runs under
`CaptureAudit`, which flags what a capture refuses or replays wrongly: a host sync (`.item()`, `.tolist()`,
`nonzero`, boolean-mask indexing), an operand or result on the CPU (a host-to-device copy, a CPU-made tensor) and
a random op (its draws would be frozen into the graph). The run then ends (nothing after capture can run
without data). What a step does outside capture (prefill, noise tables, the host loop) is not audited here.
"""
from __future__ import annotations

import contextlib
import traceback
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from lantern_core.decoding import step_graphs

HOST_SYNCS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
              torch.ops.aten.masked_select.default, torch.ops.aten.is_nonzero.default,
              torch.ops.aten.equal.default}

# A Python number written into a CUDA tensor (`t[:, 0] = 0`) becomes a 0-dim CPU tensor that fill_ reads on the
# host: a constant baked into the graph, no copy. The same value through an index (`t[:, idx] = True`,
# index_put_) is copied to the device first: a blocking host-to-device copy, refused by capture.
HOST_SCALAR_OK = {torch.ops.aten.lift_fresh.default, torch.ops.aten.fill_.Tensor, torch.ops.prim.device.default}


@dataclass(frozen=True)
class Finding:
    kind: str  # "host sync", "cpu tensor" or "random op"
    op: str
    where: str = field(default="", compare=False)  # the innermost lantern_core line that dispatched it


def _caller() -> str:
    frames = [f for f in traceback.extract_stack() if "lantern_core" in f.filename]
    return f"{frames[-1].filename.split('lantern_core')[-1]}:{frames[-1].lineno}" if frames else "?"


@dataclass
class CaptureAudit(TorchDispatchMode):
    """Records every op a step dispatches that a CUDA graph capture on `device_type` would refuse or freeze."""

    findings: list[Finding] = field(default_factory=list)
    ops: int = 0

    def __post_init__(self) -> None:
        super().__init__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += 1
        name = str(func.overloadpacket.__name__)
        if func in HOST_SYNCS:
            self.findings.append(Finding("host sync", name, _caller()))
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.findings.append(Finding("random op", name, _caller()))
        out = func(*args, **kwargs)
        tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
        on_host = [t for t in tensors if t.device.type == "cpu"]
        if on_host and not (func in HOST_SCALAR_OK and all(t.dim() == 0 for t in on_host)):
            self.findings.append(Finding("cpu tensor", name, _caller()))
        return out


class StepsAudited(BaseException):
    """Ends a decoder run once every captured variant was audited (a BaseException: capture's own fallback,
    which catches Exception, must not swallow it)."""


@dataclass
class AuditReport:
    findings: list[Finding] = field(default_factory=list)
    variants: int = 0
    ops: int = 0
    keys: list = field(default_factory=list)  # the runner keys audited


def fake_cuda_model(make: Callable[[], torch.nn.Module], dtype: torch.dtype = torch.bfloat16):
    """`make()`'s module with fake "cuda" parameters of `dtype`, and the fake mode to run it under."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    model = make().to(dtype)
    with mode:
        for module in model.modules():
            for name, p in module._parameters.items():
                if p is not None:
                    module._parameters[name] = torch.nn.Parameter(mode.from_tensor(p).to("cuda"), requires_grad=False)
            for name, b in module._buffers.items():
                if b is not None:
                    module._buffers[name] = mode.from_tensor(b).to("cuda")
    return model, mode


class FakeCuda(TorchDispatchMode):
    """Ops on fake tensors, and factories asked for a "cuda" device, run in the fake mode; the rest (the host's
    own work: tree plans, input checks on CPU tensors) runs for real. A host read of a fake tensor outside
    capture (a prefix's padding flag) gets a stand-in value (False, 1, 1.0: the checks that raise on True
    pass), since fake tensors hold no data, and the run goes on to its capture."""

    def __init__(self, mode: FakeTensorMode) -> None:
        super().__init__()
        self.mode = mode

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if not any(isinstance(t, FakeTensor) for t in tensors) and torch.device(kwargs.get("device") or "cpu").type != "cuda":
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        if func is torch.ops.aten._local_scalar_dense.default:
            dtype = args[0].dtype
            return False if dtype == torch.bool else 1.0 if dtype.is_floating_point else 1
        return func(*args, **kwargs)  # on to the fake mode below


@contextlib.contextmanager
def _audited_capture(monkeypatch_setattr, report: AuditReport, compile_with_inductor: bool):
    def capture_variants(runner, variants, reset, device, pool):
        for variant in variants:  # one step each: warm-up and recording run the same code
            reset(variant)
            audit = CaptureAudit()
            with audit:
                runner.step(variant)
            report.findings.extend(audit.findings)
            report.ops += audit.ops
            report.variants += 1
        raise StepsAudited

    def runner_for(model, key, build, variants, reset, device, also=()):
        report.keys.append(key)
        made = build()
        capture_variants(made, variants, lambda variant: reset(made, variant), device, None)

    monkeypatch_setattr(step_graphs, "runner_for", runner_for)
    monkeypatch_setattr(step_graphs, "uses_inductor", lambda choice, device: compile_with_inductor and choice == "auto")
    monkeypatch_setattr(step_graphs, "compiled_step", lambda step, what: step)  # numerics: tested with Inductor
    yield


def audit_captured_steps(monkeypatch, mode: FakeTensorMode, decode: Callable[[], object],
                         compile_with_inductor: bool = False) -> AuditReport:
    """Run `decode()` under `mode` until its steps are captured; the audit of every captured variant's steps.
    `compile_with_inductor`: the layout of compile "auto" (one whole-cache variant), else that of "graphs"."""
    report = AuditReport()
    with _audited_capture(monkeypatch.setattr, report, compile_with_inductor), mode, FakeCuda(mode):
        try:
            decode()
        except StepsAudited:
            return report
    raise AssertionError("the decoder finished without capturing a step (no CUDA layout on fake cuda?)")

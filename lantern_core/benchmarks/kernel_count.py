"""Counting what decides a decoding step's speed on a GPU, on any device: the kernels a step launches and the
host reads it makes.

At batch 1 a step on a GPU waits on kernel launches, not on bytes (`docs/` and the launch-budget note): each
kernel costs about 2 microseconds even replayed from a CUDA graph, and a host read (`.item()`, `.tolist()`,
`bool(t)`, `nonzero`, a boolean-mask index, a tensor made from a Python list) stalls the queue. Both are
hardware-neutral, so `StepCounter` counts them on the CPU: a `TorchDispatchMode` records every ATen op
(views, aliases and metadata-only ops excluded, since they launch nothing) and a `TorchFunctionMode` sees
what never reaches the dispatcher (`.tolist()`, tensors built from Python data) and flags factory calls
that name no device (on CUDA those tensors are made on the CPU and copied with a blocking sync, which graph
capture refuses). `F.rms_norm` counts as one kernel: it is one fused kernel on CUDA and MPS, a composite of
six on the CPU. Ops are attributed to the outermost tagged part of the code (`tagged`, `module_part`: the
target's head called while drafting is drafting work), so a step's count splits into forward, drafter levels,
distributions, walk / judge and bookkeeping.

This module measures; it changes no decoding code. `decode_counts.py` runs it over every mode.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# ATen ops that launch no kernel: views, aliases, metadata and allocation.
NON_KERNELS = frozenset({
    "aten.detach", "aten.alias", "aten._unsafe_view", "aten._reshape_alias", "aten.lift_fresh", "aten.empty", "aten.empty_strided", "aten.empty_like",
    "aten.sym_size", "aten.sym_stride", "aten.sym_numel", "aten.sym_storage_offset", "aten.resolve_conj",
    "aten.resolve_neg", "aten._conj", "aten._neg_view", "aten.set_", "aten.is_same_size", "aten._has_compatible_shallow_copy_type",
})
# Ops whose output (or validation) reads a device value on the host: each stalls a GPU stream.
SYNC_OPS = frozenset({
    "aten._local_scalar_dense", "aten.nonzero", "aten.nonzero_static", "aten.unique", "aten._unique", "aten._unique2",
    "aten.unique_consecutive", "aten.unique_dim", "aten.masked_select", "aten.bincount", "aten.is_nonzero",
    "aten.equal", "aten.histc",
})
# Random draws: an iteration should consume noise drawn up front, not launch generator kernels.
RNG_OPS = frozenset({"uniform_", "exponential_", "normal_", "random_", "bernoulli_", "rand", "randn", "randint",
                     "multinomial", "randperm", "rand_like", "randn_like"})
# Tensor methods that read device values into Python (they never reach the dispatcher).
HOST_READ_METHODS = frozenset({"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy"})
# Factory functions: inside a step each must name the step's device.
FACTORIES = frozenset({"arange", "zeros", "ones", "full", "empty", "rand", "randn", "randint", "eye", "linspace",
                       "randperm", "empty_strided", "tril_indices", "triu_indices"})
# Composite ops counted as the one kernel they are on CUDA and MPS.
FUSED_COMPOSITES = {F.rms_norm: "aten.rms_norm", torch.rms_norm: "aten.rms_norm"}


def op_name(func) -> str:
    """'aten.mul.Tensor' -> 'aten.mul' (the overload says nothing about cost)."""
    name = str(func)
    return name.rsplit(".", 1)[0] if name.count(".") >= 2 else name


def kind_of(name: str) -> str:
    """A coarse kind for the per-layer breakdown."""
    base = name.split(".", 1)[-1]
    if base in ("mm", "addmm", "bmm", "baddbmm", "linear", "matmul", "_int_mm", "_scaled_mm", "_weight_int8pack_mm"):
        return "gemm"
    if "scaled_dot_product" in base or base.startswith("_flash_attention") or base.startswith("_efficient_attention"):
        return "attention"
    if base in ("_to_copy", "to"):
        return "cast"
    if base in ("index_copy_", "index_copy", "scatter_", "scatter", "index_put_", "index_put", "copy_", "clone",
                "scatter_add_", "index_add_", "_unsafe_index_put", "masked_scatter_", "fill_", "zero_"):
        return "write/copy"
    if base in ("sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "logsumexp", "cumsum", "cumprod",
                "_softmax", "_log_softmax", "softmax", "log_softmax", "any", "all", "topk", "sort", "prod", "norm",
                "linalg_vector_norm", "var_mean"):
        return "reduction"
    if base in ("rms_norm", "native_layer_norm", "layer_norm"):
        return "norm"
    if base in RNG_OPS:
        return "rng"
    if base in ("index_select", "gather", "index", "embedding", "take_along_dim", "select_scatter", "slice_scatter"):
        return "gather"
    return "pointwise"


@dataclass
class OpCount:
    """What one recorded region launched. `kernels` by part and kind; `host_reads`, `uploads` (tensors made from
    host data) and `stray_factories` (factories that named no device) by op."""

    kernels: int = 0
    by_part: Counter = field(default_factory=Counter)
    by_kind: Counter = field(default_factory=Counter)
    by_op: Counter = field(default_factory=Counter)
    by_part_op: Counter = field(default_factory=Counter)  # (part, op): where a part's kernels go
    host_reads: Counter = field(default_factory=Counter)
    uploads: int = 0
    stray_factories: Counter = field(default_factory=Counter)

    @property
    def syncs(self) -> int:
        return sum(self.host_reads.values()) + self.uploads

    def add(self, other: "OpCount") -> None:
        self.kernels += other.kernels
        self.uploads += other.uploads
        for mine, theirs in ((self.by_part, other.by_part), (self.by_kind, other.by_kind), (self.by_op, other.by_op),
                             (self.by_part_op, other.by_part_op), (self.host_reads, other.host_reads),
                             (self.stray_factories, other.stray_factories)):
            mine.update(theirs)


class _Dispatch(TorchDispatchMode):
    def __init__(self, counter: "StepCounter") -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counter._dispatched(func, args, kwargs or {})
        return func(*args, **(kwargs or {}))


class _Function(TorchFunctionMode):
    def __init__(self, counter: "StepCounter") -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        counter = self.counter
        fused = FUSED_COMPOSITES.get(func)
        if fused is not None and counter._fused is None:
            counter._fused = fused
            try:
                return func(*args, **kwargs)
            finally:
                counter._fused = None
                counter._kernel(fused)
        name = getattr(func, "__name__", "")
        if name in HOST_READ_METHODS and args and isinstance(args[0], torch.Tensor):
            counter._host_read(f"Tensor.{name}")
        elif name in ("tensor", "as_tensor") and args and not isinstance(args[0], torch.Tensor):
            counter._upload(name)
        elif name in FACTORIES and getattr(func, "__module__", None) in (None, "torch") and kwargs.get("device") is None:
            counter._stray(name)
        return func(*args, **kwargs)


class StepCounter:
    """Record the kernels and host reads of everything run inside `with counter.recording():`. Counts
    accumulate into `counter.total`; `part(name)` (or `tagged`) attributes what runs inside to a part."""

    def __init__(self, untagged: str = "other") -> None:
        self.total = OpCount()
        self._parts: list[str] = [untagged]  # the bottom entry names what no part claims
        self._fused: str | None = None
        self._on = False

    @contextlib.contextmanager
    def recording(self) -> Iterator["StepCounter"]:
        self._on = True
        try:
            with _Function(self), _Dispatch(self):
                yield self
        finally:
            self._on = False

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Count what runs inside towards `name`, unless an enclosing part already claims it."""
        self._enter(name)
        try:
            yield
        finally:
            self._leave()

    def _enter(self, name: str) -> None:
        self._parts.append(name if len(self._parts) == 1 else self._parts[-1])  # the outermost part wins

    def _leave(self, *_) -> None:
        self._parts.pop()

    def snapshot(self) -> OpCount:
        copy = OpCount()
        copy.add(self.total)
        return copy

    # -- called by the modes
    def _kernel(self, name: str) -> None:
        if not self._on:
            return
        t = self.total
        t.kernels += 1
        t.by_part[self._parts[-1]] += 1
        t.by_kind[kind_of(name)] += 1
        t.by_op[name] += 1
        t.by_part_op[(self._parts[-1], name)] += 1

    def _host_read(self, name: str) -> None:
        if self._on:
            self.total.host_reads[name] += 1

    def _upload(self, name: str) -> None:
        if self._on:
            self.total.uploads += 1

    def _stray(self, name: str) -> None:
        if self._on:
            self.total.stray_factories[f"torch.{name}"] += 1

    def _dispatched(self, func, args, kwargs) -> None:
        if self._fused is not None:
            return
        name = op_name(func)
        if name in SYNC_OPS or _bool_mask_index(name, args):
            self._host_read(name if name in SYNC_OPS else f"{name} (boolean mask)")
        if name in NON_KERNELS or getattr(func, "is_view", False):
            return
        if name == "aten._to_copy" and _cross_device(args, kwargs):
            self._host_read("aten._to_copy (cross-device)")
        self._kernel(name)


def _bool_mask_index(name: str, args) -> bool:
    """x[mask] / x[mask] = y: the result's size depends on the mask's values."""
    if name not in ("aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_") or len(args) < 2:
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ()))


def _cross_device(args, kwargs) -> bool:
    device = kwargs.get("device")
    return device is not None and bool(args) and isinstance(args[0], torch.Tensor) and args[0].device != torch.device(device)


@contextlib.contextmanager
def replaced(owner, attribute: str, value) -> Iterator[None]:
    """`owner.attribute` is `value` within the context (a module's function, a class's method, an instance's)."""
    own = vars(owner).get(attribute, _INHERITED) if hasattr(owner, "__dict__") else getattr(owner, attribute)
    setattr(owner, attribute, value)
    try:
        yield
    finally:
        if own is _INHERITED:
            delattr(owner, attribute)  # back to the base class's
        else:
            setattr(owner, attribute, own)


_INHERITED = object()


@contextlib.contextmanager
def tagged(counter: StepCounter, targets: list[tuple[object, str, str]]) -> Iterator[None]:
    """Within the context, calls to `getattr(owner, attribute)` count towards `part`, for each (owner, attribute,
    part). Owners are modules whose functions a decoder calls by name, or classes (their methods get `self`
    through `*args`)."""
    with contextlib.ExitStack() as stack:
        for owner, attribute, part in targets:
            def wrapper(*args, __original=getattr(owner, attribute), __part=part, **kwargs):
                with counter.part(__part):
                    return __original(*args, **kwargs)

            stack.enter_context(replaced(owner, attribute, wrapper))
        yield


@contextlib.contextmanager
def module_part(counter: StepCounter, modules, part: str) -> Iterator[None]:
    """Within the context, everything the forward of each of `modules` runs counts towards `part`."""
    handles = []
    for module in modules:
        handles.append(module.register_forward_pre_hook(lambda *_: counter._enter(part)))
        handles.append(module.register_forward_hook(counter._leave))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def count_call(fn: Callable[[], object], counter: StepCounter | None = None) -> OpCount:
    """The kernels and host reads of one call of `fn`."""
    counter = counter or StepCounter()
    before = counter.snapshot()
    with counter.recording():
        fn()
    after = counter.snapshot()
    return difference(after, before)


def difference(after: OpCount, before: OpCount) -> OpCount:
    out = OpCount(kernels=after.kernels - before.kernels, uploads=after.uploads - before.uploads)
    for name in ("by_part", "by_kind", "by_op", "by_part_op", "host_reads", "stray_factories"):
        counter = Counter(getattr(after, name))
        counter.subtract(getattr(before, name))
        setattr(out, name, Counter({k: v for k, v in counter.items() if v}))
    return out

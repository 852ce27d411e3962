"""Running static-shape step functions fast: eagerly, or captured once in CUDA graphs and replayed.

A `StepRunner` owns one step shape's static buffers and, on CUDA, one graph per variant of the step (for
AR, the attention window). `runner_for` keeps one runner per (model, device, dtype, step shape) and reuses
it across images, seeds and prompts; it captures again when the model's weights moved or were replaced
(ComfyUI unloaded and reloaded them, or patched them), because a graph replays fixed addresses. `release`
frees every runner of a model (the nodes call it when ComfyUI unloads the model or frees its caches). A
capture that fails falls back to eager with one log line; eager and replayed steps run the same code on
the same buffers, so they give the same tokens.

Why our own capture rather than `torch.compile(mode="reduce-overhead")`: at batch 1 a step is bound by kernel
launches and Python, which a graph removes entirely; our graphs cover whole iterations (several forwards, the
walk and the bookkeeping), are captured per window band in milliseconds, are released when ComfyUI unloads
the model and cannot recompile in the middle of an image. Compile "auto" on CUDA also fuses each step with
Inductor first (`compiled_step`: `fullgraph=True, dynamic=False`, one variant attending over the whole cache,
so one compile per model and shape, reused for every later image), which cuts the kernels each graph replays;
"graphs" captures without compiling. The `gpu_path` context runs that code path eagerly on any device, for
the kernel counter and the tests. This module does not choose devices; it follows the buffers'.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, Iterator

import torch

from ..errors import ConfigError
from .capture.graph_capture import (WARMUP_STEPS, _reset_graphs, capture, capture_stream, clear_workspaces,  # noqa: F401
                            reserved_bytes, return_memory)
from .capture.compiled_step import CompiledStep, inductor_options  # noqa: F401
from .capture.step_execution import StepExecution

log = logging.getLogger("lantern_core.step_graphs")

COMPILE_CHOICES = ("auto", "graphs", "off")
SLOT_BUCKET = 64  # captured cache lengths and attention windows are multiples of this
COMPILE_BACKEND = "inductor"  # what compile "auto" fuses steps with (the tests swap in cheaper back ends)


def check_compile(choice: str) -> str:
    if choice not in COMPILE_CHOICES:
        raise ConfigError("compile", f"one of {list(COMPILE_CHOICES)}", choice)
    return choice


_SCOPE = threading.local()  # this thread's settings: on (no early exits), windowed (GPU layout), announce


@contextlib.contextmanager
def _scoped(**settings) -> Iterator[None]:
    """This thread's `settings` within the context, the previous ones after it."""
    before = {name: getattr(_SCOPE, name, None) for name in settings}
    for name, value in settings.items():
        setattr(_SCOPE, name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(_SCOPE, name, value)


def static_only():
    """Within this context no loop reads the host to stop early, on any device (what a captured step does);
    the tests use it to check that a whole step runs without a host read."""
    return _scoped(on=True)


def gpu_path():
    """Within this context every decoder runs, eagerly on any device, the code a capturing device replays: windowed
    attention in `SLOT_BUCKET` bands, fixed-trip loops with no early exit, no shrinking of the batch. The kernel
    counter (`benchmarks/kernel_count.py`) and the capture-legality tests measure this path on the CPU."""
    return _scoped(on=True, windowed=True)


def reporting(announce: Callable[[str], None]):
    """Within this context, what a run wants its user to see while it waits (an Inductor compile) goes to
    `announce(text)` as well as to the log: the ComfyUI sampler shows it as the node's progress text."""
    return _scoped(announce=announce)


def announce(text: str) -> None:
    """Log `text` and hand it to the current `reporting` listener, if any (a failing listener is ignored)."""
    log.info("%s", text)
    listener = getattr(_SCOPE, "announce", None)
    if listener is not None:
        try:
            listener(text)
        except Exception:  # the display must never fail the run
            log.debug("status listener failed", exc_info=True)


def may_read_host(device: torch.device) -> bool:
    """Whether a fixed-trip loop may read a flag to stop early: only on the CPU, where a read costs no device
    sync, and never while torch.compile traces (a read would break the graph) or under `static_only`."""
    return device.type == "cpu" and not torch.compiler.is_compiling() and not getattr(_SCOPE, "on", None)


def uses_graphs(choice: str, device: torch.device) -> bool:
    """'auto' and 'graphs' capture on CUDA and run eagerly elsewhere (CPU, MPS); 'off' always runs eagerly."""
    return check_compile(choice) in ("auto", "graphs") and torch.device(device).type == "cuda"


def uses_inductor(choice: str, device: torch.device) -> bool:
    """'auto' on CUDA also fuses each step with Inductor before capturing it (where Triton is installed). On the
    CPU eager stays: Inductor made the embedded model's step slower on a 2-core CPU (8.3 vs 5.1 ms)."""
    if not (check_compile(choice) == "auto" and torch.device(device).type == "cuda"):
        return False
    try:
        import triton  # noqa: F401  (Inductor's CUDA code generator)
    except ImportError:
        return False
    return True


def band_window(position: int, extent: int, slots: int) -> int:
    """Keys a captured forward attends over when it writes `extent` slots from cache slot `position` on: rounded
    up so that one value serves every position of a `SLOT_BUCKET`-wide band (a few graphs per image instead
    of one per step), capped by the cache's `slots`."""
    return min(slots, position // SLOT_BUCKET * SLOT_BUCKET + SLOT_BUCKET + extent)


def band_starts(last: int) -> range:
    """The first position of every band up to position `last` (one captured variant each)."""
    return range(0, last + 1, SLOT_BUCKET)


@dataclass(frozen=True)
class RunLayout:
    """How a decoder lays one run out on its device: `graphs` when its steps are captured (compile "auto" on
    CUDA); `exact` on a device that never captures, where each forward sees exactly the keys it needs (the
    step-by-step decoders' shapes and cost); otherwise windows grow in bands, with compile "off" too, so
    "off" and "auto" give the same tokens."""

    graphs: bool
    exact: bool
    compiled: bool = False  # steps fused by Inductor: one variant per shape, attending over the whole cache

    @property
    def slot_bucket(self) -> int:
        """Cache lengths round up to this, so one capture serves prompts of similar length."""
        return SLOT_BUCKET if self.graphs else 1


def layout_for(compile: str, device: torch.device) -> RunLayout:
    if getattr(_SCOPE, "windowed", None):  # `gpu_path`: the captured layout, run eagerly
        return RunLayout(graphs=False, exact=False)
    return RunLayout(graphs=uses_graphs(compile, device), exact=not uses_graphs("auto", device),
                     compiled=uses_inductor(compile, device))


def compiled_step(step: Callable[[Hashable], None], what: str) -> CompiledStep:
    """`step` fused by Inductor with `COMPILE_BACKEND` (`compiled_step.py`)."""
    return CompiledStep(step, what, COMPILE_BACKEND, announce)


@dataclass(frozen=True)
class _Watched:
    """A module a runner's graphs read (the model, a drafter) and where its weights were at capture."""

    module: "weakref.ref[torch.nn.Module]"
    signature: tuple

    def moved(self) -> bool:
        module = self.module()
        return module is None or weights_signature(module) != self.signature


_USES = itertools.count()  # a global clock for least-recently-used eviction across a model's grid views


@dataclass
class StepRunner:
    """A step function over static buffers, in variants (for AR, the attention window), each with a CUDA
    graph once captured: `run(variant)` replays that graph, or calls the step eagerly. A registered runner
    (`shared`) owns its graphs' memory pool; `release` resets the graphs and frees the buffers."""

    step: Callable[[Hashable], None]
    buffers: Any
    graphs: dict = field(default_factory=dict)
    shared: bool = False  # held by the registry across runs: the caller must not release it
    watched: tuple = ()  # `_Watched` modules: the runner is stale once one of them moved
    device: torch.device | None = None  # the device its graphs were captured on
    requested: bool = False  # graphs were asked for (a registered runner)
    capture_error: str = ""  # why capture failed ("" when it did not)
    pool_bytes: int = 0  # what its captures added to the device's reserved memory (its pool, measured)
    static_bytes: int = 0  # its static buffers
    last_use: int = 0
    replayed: int = 0  # this run's steps from a graph (`begin_run` zeroes both)
    eager: int = 0  # this run's steps run as Python
    warned: bool = False  # said once that a variant had no graph

    @property
    def captured(self) -> bool:
        return bool(self.graphs)

    @property
    def held_bytes(self) -> int:
        return self.static_bytes + self.pool_bytes

    def begin_run(self) -> None:
        self.replayed = self.eager = 0
        self.last_use = next(_USES)

    def run(self, variant: Hashable = None) -> None:
        graph = self.graphs.get(variant)
        if graph is not None:
            graph.replay()
            self.replayed += 1
            return
        if self.requested and not self.warned:  # graphs were asked for: say so once, never silently
            self.warned = True
            log.warning("CAPTURE FALLBACK: no captured CUDA graph for step variant %r (captured: %d variants%s); "
                        "running it eagerly", variant, len(self.graphs),
                        f"; capture failed: {self.capture_error}" if self.capture_error else "")
        self.eager += 1
        self.step(variant)

    def execution(self) -> StepExecution:
        """How this run's steps (since `begin_run`) ran."""
        status = getattr(self.step, "status", "off")
        compile = {"inductor": "inductor", "failed": "failed"}.get(status, "off")
        return StepExecution(self.requested, self.replayed, self.eager, compile, self.capture_error)

    def stale(self) -> bool:
        """Whether a module its graphs read moved or was freed since capture (its own modules only)."""
        return any(w.moved() for w in self.watched)

    def watches(self, module: torch.nn.Module) -> bool:
        return any(w.module() is module for w in self.watched)

    def release(self) -> None:
        """Reset every graph (its pool's use count drops; `return_memory` then frees the pool) and free the
        static buffers."""
        graphs, self.graphs = self.graphs, {}
        _reset_graphs(graphs.values())
        release = getattr(self.buffers, "release", None)
        if release is not None:
            release()


def weights_signature(model: torch.nn.Module) -> tuple:
    """Device, dtype and addresses of every parameter and buffer: a graph is valid only while they hold."""
    tensors = [*model.parameters(), *model.buffers()]
    first = tensors[0] if tensors else torch.empty(0)
    return (str(first.device), str(first.dtype), hash(tuple(t.data_ptr() for t in tensors)))


def capture_variants(runner: StepRunner, variants: Iterable[Hashable], reset: Callable[[Hashable | None], None],
                     device: torch.device) -> None:
    """One graph per variant, all in a memory pool of the runner's own, with `reset(variant)` before each
    warm-up step and the recording, and `reset(None)` after the last. On any failure: one warning naming it,
    the graphs made so far reset and their memory returned, and the runner steps eagerly on the same buffers
    (reported as a fallback by every run's `StepExecution`)."""
    try:
        before = reserved_bytes(device)
        pool = torch.cuda.graph_pool_handle()  # never shared and never reused after release
        for variant in variants:
            runner.graphs[variant] = capture(lambda: runner.step(variant), device, pool, lambda: reset(variant))
        runner.pool_bytes = max(0, reserved_bytes(device) - before)
    except Exception as error:  # a capture failure must never fail the image
        graphs, runner.graphs = runner.graphs, {}
        _reset_graphs(graphs.values())
        runner.capture_error = f"{type(error).__name__}: {str(error)[:300]}"
        log.warning("CAPTURE FALLBACK: CUDA graph capture failed (%s); decoding eagerly", runner.capture_error)
        return_memory([device])
    reset(None)


# --- The registry: runners live on their model, never keep it alive, and stay within a byte budget ------------

RUNNERS_ATTRIBUTE = "_lantern_step_runners"
BUDGET_MIN_BYTES = 1 << 30  # every model may keep this much in captured steps...
BUDGET_WEIGHTS_SHARE = 1.0  # ...or as much as its weights, whichever is more
BUDGET_BYTES: int | None = None  # a fixed budget instead (tests)


class _Runners:
    """A model's runners by key, in least-recently-used order. Kept in the model's own `__dict__`, so the
    runners' steps (which reference the model) form a cycle with it that the garbage collector frees once the
    model is dropped; a registry outside the model would keep it alive. Copies of the model hold none."""

    def __init__(self, owner: torch.nn.Module) -> None:
        self.owner_id = id(owner)
        self.by_key: OrderedDict[Hashable, StepRunner] = OrderedDict()

    def __copy__(self) -> "_Runners":
        return _Runners.__new__(_Runners)  # owner_id unset: never matches, so a copy starts empty

    def __deepcopy__(self, memo) -> "_Runners":
        return self.__copy__()


_LOCK = threading.RLock()
_HOLDERS: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()  # models holding runners, for `release`


def _runners(model: torch.nn.Module, create: bool = False) -> "OrderedDict[Hashable, StepRunner]":
    held = model.__dict__.get(RUNNERS_ATTRIBUTE)
    if held is None or getattr(held, "owner_id", None) != id(model):  # none, or a copied model's (grid views)
        if not create:
            return OrderedDict()
        held = _Runners(model)
        model.__dict__[RUNNERS_ATTRIBUTE] = held
        _HOLDERS.add(model)
    return held.by_key


def weights_owner(model: torch.nn.Module) -> torch.nn.Module:
    """The model whose weights `model` uses: itself, or the model a grid view (`with_grid`) views."""
    return model.__dict__.get("grid_base", model)


def _models_of(owner: torch.nn.Module) -> list[torch.nn.Module]:
    """`owner` and its grid views."""
    return [owner, *owner.__dict__.get("_grid_views", {}).values()]


def budget_bytes(model: torch.nn.Module) -> int:
    """Bytes the captured steps of `model` (and its grid views) may keep between runs: `BUDGET_BYTES` when set,
    else the larger of `BUDGET_MIN_BYTES` and `BUDGET_WEIGHTS_SHARE` of its weights."""
    if BUDGET_BYTES is not None:
        return BUDGET_BYTES
    owner = weights_owner(model)
    weights = sum(t.numel() * t.element_size() for t in (*owner.parameters(), *owner.buffers()))
    return max(BUDGET_MIN_BYTES, int(BUDGET_WEIGHTS_SHARE * weights))


def _evict_over_budget(model: torch.nn.Module, keep: StepRunner) -> list[StepRunner]:
    """Remove the least recently used runners of `model`'s weights (not `keep`) until they fit its budget."""
    owner = weights_owner(model)
    held = [(runners, key, r) for m in _models_of(owner) for runners in [_runners(m)] for key, r in runners.items()]
    total, budget, evicted = sum(r.held_bytes for _, _, r in held), budget_bytes(owner), []
    for runners, key, runner in sorted(held, key=lambda entry: entry[2].last_use):
        if total <= budget:
            break
        if runner is keep:
            continue
        runners.pop(key)
        total -= runner.held_bytes
        evicted.append(runner)
    if evicted:
        log.info("released %d captured step shape(s) over the %.0f MiB budget of the model", len(evicted),
                 budget / 2**20)
    return evicted


def _dispose(runners: list[StepRunner]) -> None:
    for runner in runners:
        runner.release()
    return_memory([r.device for r in runners if r.requested])  # graphs were asked for: a capturing device


def runner_for(model: torch.nn.Module, key: Hashable, build: Callable[[], StepRunner], variants: Iterable[Hashable],
               reset: Callable[[StepRunner, Hashable | None], None], device: torch.device,
               also: tuple[torch.nn.Module, ...] = ()) -> StepRunner:
    """The cached CUDA-graph runner of `model` for `key`, or a new one from `build()` with every variant
    captured now (`reset(runner, variant)` readies the buffers for a variant's warm-up). A runner is stale, and
    released, only when a module its own graphs read (`model`, or one in `also`, e.g. the drafter) moved: a
    drafter joining never releases the AR runner. Runners are kept while their bytes fit `budget_bytes`."""
    modules = (model, *also)
    with _LOCK:
        runners = _runners(model, create=True)
        cached = runners.get(key)
        if cached is not None and not cached.stale():
            runners.move_to_end(key)
            cached.begin_run()
            return cached
        stale = [k for k, r in runners.items() if k == key or r.stale()]
        _dispose([runners.pop(k) for k in stale])
        runner = build()
        runner.watched = tuple(_Watched(weakref.ref(m), weights_signature(m)) for m in modules)
        runner.shared, runner.requested, runner.device = True, True, torch.device(device)
        runner.static_bytes = tensor_bytes(runner.buffers)
        capture_variants(runner, variants, lambda variant: reset(runner, variant), device)
        runners[key] = runner  # kept even when capture failed: one warning, then eager on the same buffers
        runner.begin_run()
        _dispose(_evict_over_budget(model, keep=runner))
        return runner


def runner(model: torch.nn.Module, key: Hashable, build: Callable[[], StepRunner],
           variants: Callable[[], Iterable[Hashable]], reset: Callable[[StepRunner, Hashable | None], None],
           layout: RunLayout, device: torch.device, also: tuple[torch.nn.Module, ...] = ()) -> StepRunner:
    """The runner a decoder steps through, its per-run counts zeroed: `runner_for` (cached, every variant
    captured) when `layout` uses graphs, else a fresh eager one from `build()` (the caller releases its
    buffers); its step compiled by Inductor first where `layout.compiled` (then `variants()` must be the one
    full-cache variant)."""
    def built() -> StepRunner:
        made = build()
        if layout.compiled:
            made.step = compiled_step(made.step, str(key[0]) if isinstance(key, tuple) else str(key))
        return made

    if not layout.graphs:
        made = built()
        made.begin_run()
        return made
    return runner_for(model, (key, layout.compiled), built, variants(), reset, device, also)


def release(model: torch.nn.Module) -> int:
    """Free every captured step of `model` and of the grid views of its weights (graphs, their memory pools,
    static buffers), and every captured step of another model that reads `model` too (a drafter's trees), and
    give their memory back to the device. Returns how many."""
    with _LOCK:
        dropped = []
        for held_by in _models_of(weights_owner(model)):
            runners = _runners(held_by)
            dropped.extend(runners.values())
            runners.clear()
        for holder in list(_HOLDERS):
            runners = _runners(holder)
            for key in [k for k, r in runners.items() if r.watches(model)]:
                dropped.append(runners.pop(key))
        _dispose(dropped)
        return len(dropped)


def tensor_bytes(held: Any, seen: set[int] | None = None) -> int:
    """Bytes of the distinct tensors (by storage) reachable from `held` through dataclass fields, objects'
    attributes, lists, tuples and dicts (a runner's static buffers: caches, tables, counters)."""
    seen = set() if seen is None else seen
    if isinstance(held, torch.Tensor):
        storage = held.untyped_storage()
        key = ("storage", held.device, storage.data_ptr())
        if held.device.type == "meta" or key in seen:
            return 0
        seen.add(key)
        return storage.nbytes()
    if ("object", id(held)) in seen or isinstance(held, (torch.nn.Module, str, bytes, int, float, bool, type(None))):
        return 0  # modules are weights, counted by their owner
    seen.add(("object", id(held)))
    if isinstance(held, dict):
        return sum(tensor_bytes(v, seen) for v in held.values())
    if isinstance(held, (list, tuple)):
        return sum(tensor_bytes(v, seen) for v in held)
    fields = getattr(held, "__dict__", None)
    return sum(tensor_bytes(v, seen) for v in fields.values()) if fields else 0


def runners_by_key(model: torch.nn.Module) -> dict[Hashable, StepRunner]:
    """The captured runners `model` itself holds (not its grid views'), by key, least recently used first."""
    with _LOCK:
        return dict(_runners(model))


def runners_of(model: torch.nn.Module) -> list[StepRunner]:
    return list(runners_by_key(model).values())


def held_bytes(model: torch.nn.Module) -> int:
    """Bytes the captured runners of `model` (and of grid views of its weights) keep between runs: static
    buffers and the growth of the device's reserved memory their captures caused (their pools): memory that
    ComfyUI's model accounting does not see."""
    with _LOCK:
        return sum(r.held_bytes for m in _models_of(weights_owner(model)) for r in _runners(m).values())


def cached_runners(model: torch.nn.Module) -> int:
    """How many captured step shapes `model` holds."""
    with _LOCK:
        return len(_runners(model))

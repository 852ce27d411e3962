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

log = logging.getLogger("lantern_core.step_graphs")

COMPILE_CHOICES = ("auto", "graphs", "off")
SLOT_BUCKET = 64  # captured cache lengths and attention windows are multiples of this
MAX_RUNNERS_PER_MODEL = 3  # step shapes kept per model (each holds its own KV cache)
WARMUP_STEPS = 2
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


def inductor_options() -> dict:
    """Inductor's options for our steps: `emulate_precision_casts` rounds every fused intermediate to the
    model dtype where eager rounds it (bf16 after each op), so a compiled step gives eager's tokens; without
    it a bf16 step diverged from eager within a few tokens. Options a torch version lacks are left out."""
    from torch._inductor import config as inductor_config

    wanted = {"emulate_precision_casts": True}
    return {name: value for name, value in wanted.items() if hasattr(inductor_config, name)}


_STEP_CODES = itertools.count()


def _own_code(step: Callable[[Hashable], None]) -> Callable[[Hashable], None]:
    """`step` behind a function with a code object of its own. Dynamo keeps its compiled graphs per code object,
    and every runner's step is a lambda from one source line, so without this every shape of a session would
    count against one code object's recompile limit (8): past it `fullgraph=True` raises and the step would
    fall back to uncompiled. With its own code object each runner shape compiles once, on its own."""
    def forward(variant: Hashable) -> None:
        return step(variant)

    forward.__code__ = forward.__code__.replace(co_name=f"lantern_step_{next(_STEP_CODES)}")
    return forward


def compiled_step(step: Callable[[Hashable], None], what: str) -> Callable[[Hashable], None]:
    """`step` fused by Inductor (`fullgraph=True, dynamic=False`, eager's rounding: `inductor_options`),
    compiled at its first call (a capture's warm-up, so before any graph is recorded) and reused for every later
    image of the shape; with torch's on-disk cache, across restarts too. A step that fails to compile runs as it
    is (eager, or captured as it is): said once in the log and to the `reporting` listener (the node's progress
    text), never silently."""
    options = inductor_options() if COMPILE_BACKEND == "inductor" else None
    compiled = torch.compile(_own_code(step), backend=COMPILE_BACKEND, fullgraph=True, dynamic=False, options=options)
    state = {"compiled": False, "failed": False}

    def run(variant: Hashable) -> None:
        if state["failed"]:
            return step(variant)
        if not state["compiled"]:
            announce(f"compiling the {what} step with Inductor (once per model and shape; a minute or more for "
                     "large models, then every image reuses it)")
        try:
            out = compiled(variant)
        except Exception as error:  # the compiler must never fail an image
            state["failed"] = True
            log.warning("Inductor could not compile the %s step (%s: %s)", what, type(error).__name__,
                        str(error)[:300])
            announce(f"Inductor could not compile the {what} step; running it uncompiled (slower, same tokens)")
            return step(variant)
        state["compiled"] = True
        return out

    return run


@dataclass
class StepRunner:
    """A step function over static buffers, in variants (for AR, the attention window), each with a CUDA
    graph once captured: `run(variant)` replays that graph, or calls the step eagerly."""

    step: Callable[[Hashable], None]
    buffers: Any
    graphs: dict = field(default_factory=dict)
    signature: tuple = ()
    shared: bool = False  # held by the registry across runs: the caller must not release it
    also: tuple = ()  # ids of the other modules the graphs read (e.g. the drafter): releasing one drops them
    warned: bool = False  # said once that a variant had no graph

    @property
    def captured(self) -> bool:
        return bool(self.graphs)

    def run(self, variant: Hashable = None) -> None:
        graph = self.graphs.get(variant)
        if graph is not None:
            graph.replay()
            return
        if self.graphs and not self.warned:  # captured, but not this variant: say so once, never silently
            self.warned = True
            log.warning("no captured CUDA graph for step variant %r (captured: %d variants); running it eagerly",
                        variant, len(self.graphs))
        self.step(variant)

    def release(self) -> None:
        self.graphs = {}
        release = getattr(self.buffers, "release", None)
        if release is not None:
            release()


def weights_signature(model: torch.nn.Module) -> tuple:
    """Device, dtype and addresses of every parameter and buffer: a graph is valid only while they hold."""
    tensors = [*model.parameters(), *model.buffers()]
    first = tensors[0] if tensors else torch.empty(0)
    return (str(first.device), str(first.dtype), hash(tuple(t.data_ptr() for t in tensors)))


def capture(step: Callable[[], None], device: torch.device, pool=None,
            prepare: Callable[[], None] = lambda: None) -> "torch.cuda.CUDAGraph":
    """Warm `step` up on a side stream, then record it, all with `device` current (the graph's own capture
    stream and the streams it waits on belong to the current device, which need not be the model's on a
    machine with several GPUs). Warm-up runs real steps, each after `prepare()` (which puts the buffers in a
    valid state, outside the recording); the caller resets the buffers afterwards. Raises what capture raises."""
    with torch.cuda.device(device):
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_STEPS):
                prepare()
                step()
        torch.cuda.current_stream(device).wait_stream(stream)
        prepare()
        graph = torch.cuda.CUDAGraph()
        # thread-local: another thread of the host (ComfyUI runs several) touching CUDA meanwhile does not break it
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            step()
        torch.cuda.synchronize(device)
    return graph


def capture_variants(runner: StepRunner, variants: Iterable[Hashable], reset: Callable[[Hashable | None], None],
                     device: torch.device, pool: Callable[[], Any]) -> None:
    """One graph per variant (in the memory pool `pool()` returns), with `reset(variant)` before each warm-up
    step and the recording, and `reset(None)` after the last. On any failure: one warning, no graphs, and
    the runner steps eagerly on the same buffers."""
    try:
        pool = pool()
        for variant in variants:
            runner.graphs[variant] = capture(lambda: runner.step(variant), device, pool, lambda: reset(variant))
    except Exception as error:  # a capture failure must never fail the image
        runner.graphs = {}
        log.warning("CUDA graph capture failed (%s: %s); decoding eagerly", type(error).__name__, error)
        if torch.cuda.is_available():
            torch.cuda.synchronize(device)
    reset(None)


class _Registry:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runners: "weakref.WeakKeyDictionary[torch.nn.Module, OrderedDict]" = weakref.WeakKeyDictionary()
        self.pools: "weakref.WeakKeyDictionary[torch.nn.Module, Any]" = weakref.WeakKeyDictionary()


_REGISTRY = _Registry()


def runner_for(model: torch.nn.Module, key: Hashable, build: Callable[[], StepRunner], variants: Iterable[Hashable],
               reset: Callable[[StepRunner, Hashable | None], None], device: torch.device,
               also: tuple[torch.nn.Module, ...] = ()) -> StepRunner:
    """The cached CUDA-graph runner of `model` for `key`, or a new one from `build()` with every variant
    captured now (`reset(runner, variant)` readies the buffers for a variant's warm-up). Stale runners (the
    weights of `model` or of a module in `also`, e.g. the drafter, moved) are released; at most
    MAX_RUNNERS_PER_MODEL are kept."""
    signature = (weights_signature(model), *(weights_signature(m) for m in also))
    with _REGISTRY.lock:
        runners = _REGISTRY.runners.setdefault(model, OrderedDict())
        cached = runners.get(key)
        if cached is not None and cached.signature == signature:
            runners.move_to_end(key)
            return cached
        for old_key in [k for k, r in runners.items() if r.signature != signature or k == key]:
            runners.pop(old_key).release()
        while len(runners) >= MAX_RUNNERS_PER_MODEL:
            runners.popitem(last=False)[1].release()
        runner = build()
        runner.signature, runner.shared, runner.also = signature, True, tuple(id(m) for m in also)
        capture_variants(runner, variants, lambda variant: reset(runner, variant), device, lambda: _pool(model))
        runners[key] = runner  # kept even when capture failed: one warning, then eager on the same buffers
        return runner


def runner(model: torch.nn.Module, key: Hashable, build: Callable[[], StepRunner],
           variants: Callable[[], Iterable[Hashable]], reset: Callable[[StepRunner, Hashable | None], None],
           layout: RunLayout, device: torch.device, also: tuple[torch.nn.Module, ...] = ()) -> StepRunner:
    """The runner a decoder steps through: `runner_for` (cached, every variant captured) when `layout` uses
    graphs, else a fresh eager one from `build()` (the caller releases its buffers); its step compiled by
    Inductor first where `layout.compiled` (then `variants()` must be the one full-cache variant)."""
    def built() -> StepRunner:
        made = build()
        if layout.compiled:
            made.step = compiled_step(made.step, str(key[0]) if isinstance(key, tuple) else str(key))
        return made

    if not layout.graphs:
        return built()
    return runner_for(model, (key, layout.compiled), built, variants(), reset, device, also)


def _pool(model: torch.nn.Module):
    """The memory pool every graph of `model` shares (called with the registry lock held)."""
    pool = _REGISTRY.pools.get(model)
    if pool is None:
        pool = _REGISTRY.pools[model] = torch.cuda.graph_pool_handle()
    return pool


def weights_owner(model: torch.nn.Module) -> torch.nn.Module:
    """The model whose weights `model` uses: itself, or the model a grid view (`with_grid`) views."""
    return model.__dict__.get("grid_base", model)


def _models_of(owner: torch.nn.Module) -> list[torch.nn.Module]:
    """`owner` and its grid views that hold runners (called with the registry lock held)."""
    return [m for m in list(_REGISTRY.runners.keys()) if weights_owner(m) is owner]


def release(model: torch.nn.Module) -> int:
    """Free every captured step of `model` and of the grid views of its weights (graphs, their memory pool,
    static buffers), and every captured step of another model that reads `model` too (a drafter's trees).
    Returns how many."""
    with _REGISTRY.lock:
        runners = []
        for held_by in _models_of(weights_owner(model)):
            runners.extend(_REGISTRY.runners.pop(held_by, OrderedDict()).values())
            _REGISTRY.pools.pop(held_by, None)
        for held in _REGISTRY.runners.values():
            for key in [k for k, r in held.items() if id(model) in r.also]:
                runners.append(held.pop(key))
        for runner in runners:
            runner.release()
        return len(runners)


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


def held_bytes(model: torch.nn.Module) -> int:
    """Bytes the captured runners of `model` (and of grid views of its weights) keep between runs in their static buffers (their graph pools'
    intermediates come on top): memory that ComfyUI's model accounting does not see."""
    with _REGISTRY.lock:
        return sum(tensor_bytes(r.buffers) for m in _models_of(weights_owner(model))
                   for r in _REGISTRY.runners[m].values())


def cached_runners(model: torch.nn.Module) -> int:
    """How many captured step shapes `model` holds."""
    with _REGISTRY.lock:
        return len(_REGISTRY.runners.get(model, ()))

"""What one decoding run will allocate, known before it allocates anything: a dry run on the meta device.

`plan_run_memory` builds meta twins of the target and drafter (the same modules and code; every weight a
meta tensor: a shape and a dtype, no storage) and runs on them what the run's decoder runs before its loop
and in its largest iteration: the run's static state (`ARBuffers`, `TreeState`, `JacobiState`: both KV
caches with their spare slots, noise tables, uniforms, rings of laws), the prefix, the prefill, the
drafter's prefix, one iteration attending over the widest window the run reaches, and, on devices that run
eagerly, the shrink of the state when finished images leave a batch. `memory_track` counts the live bytes
of every storage the ops make; the peak is the reservation. No kernel runs and no weight is read (about a
second for a 7B model on the CPU, in Python bookkeeping; plans are kept per shape). Because it runs the
decoders' own code, a new buffer or a wider forward is counted without anyone updating a formula;
`tests/core/test_reservation.py` holds it to what real runs allocate, one case per distinct path of the plan
(every mode family, one image and a shrinking batch).

Not counted: the weights (placed by the host, which counts them itself), kernels' private scratch and the
allocator's rounding and fragmentation, and on CUDA the graphs' memory pool beyond one iteration's
activations and the runners the step registry keeps between runs (`step_graphs.py`). Choices measured at
run time are bounded from above: tree "auto" by its base tree, window "auto" by the widest window, an auto
row geometry by the largest candidate.
"""
from __future__ import annotations

import copy
import itertools
from collections import OrderedDict
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..conditioning import Condition, Prefix, prefix_shape
from ..config import SamplingConfig
from ..errors import LanternError
from ..layout import extend_neighbors
from ..memory_track import track_allocations
from ..models.gpt import ImageTransformer
from ..models.quantized import weights_scheme
from .acceptance.neighbors import check_neighbors
from .ar_step import (ARBuffers, ARShape, ar_step, exact_window, sample_step_tokens, slots_for,
                      window_for)
from .batching import BatchSink, RunTally
from .generate import prefill
from .jacobi.batch import draw_position_noise
from .jacobi.config import JacobiConfig, candidate_geometries
from .jacobi.iteration import jacobi_iteration
from .jacobi.shape import JacobiShape, jacobi_window
from .jacobi.state import JacobiContext, JacobiState
from .sampling import NodeDistributions, fill_per_image, pick_tokens
from .step_graphs import RunLayout, layout_for
from .trees.config import SpeculativeConfig, check_tree_fits
from .trees.drafting import plan_static_tree, prefix_inputs
from .trees.iteration import TreeContext, TreeShape, TreeState, tree_iteration, tree_windows
from .trees.prefix_states import drafter_features

META = torch.device("meta")


@dataclass(frozen=True)
class RunMemory:
    """Bytes one run allocates beyond the weights: `state` (its static buffers and outputs, alive the whole
    run) and `peak` (the most alive at once: the state plus the largest forward's activations and logits).
    `peak` is what the host must have free."""

    state: int
    peak: int
    batch: int
    mode: str

    def describe(self) -> str:
        return (f"{self.mode}, batch {self.batch}: {mib(self.state)} of caches, tables and outputs and "
                f"{mib(self.peak - self.state)} of activations at peak")


def mib(n: int) -> str:
    """Bytes as a message shows them."""
    return f"{n / 2**20:,.0f} MiB" if n >= 2**24 else f"{n / 2**20:,.1f} MiB"


def meta_twin(*modules: torch.nn.Module) -> tuple[torch.nn.Module, ...]:
    """Copies of `modules` whose parameters and buffers are meta tensors of the same shapes and dtypes (one
    deep copy of them all, so weights they share stay shared). Costs no memory for the weights."""
    memo: dict[int, torch.Tensor] = {}
    for module in modules:
        for t in itertools.chain(module.parameters(), module.buffers()):
            if id(t) not in memo:
                twin = torch.empty_like(t, device=META)
                memo[id(t)] = torch.nn.Parameter(twin, requires_grad=t.requires_grad) if isinstance(
                    t, torch.nn.Parameter) else twin
    return copy.deepcopy(modules, memo)


def meta_prefix(model: ImageTransformer, condition: Condition, guided: bool) -> Prefix:
    """The shapes `conditioning.build_prefix` gives `condition` on `model`, as meta tensors (its range checks
    read values; the run makes them)."""
    shape = prefix_shape(model.config, condition, guided)
    rows, T = shape.rows, shape.length
    token_ids = torch.zeros(rows, T, dtype=torch.long, device=META) if shape.prompted else None
    return Prefix(torch.empty(rows, T, model.config.dim, dtype=model.tok_embeddings.weight.dtype, device=META),
                  torch.ones(rows, T, dtype=torch.bool, device=META), shape.padded, token_ids)


@dataclass(frozen=True)
class PlannedRun:
    """A run as the sampler will start it: the target (placed or not), the images' condition, the sampling,
    the decoder settings (None: plain AR), the drafter of a tree decoder, the relaxation's neighbour table
    (only its shape matters), the compile choice and the device it runs on (default: the model's)."""

    model: ImageTransformer
    condition: Condition
    sampling: SamplingConfig
    spec: SpeculativeConfig | JacobiConfig | None = None
    drafter: torch.nn.Module | None = None
    neighbors: torch.Tensor | None = None
    compile: str = "auto"
    device: torch.device | str | None = None

    @property
    def run_device(self) -> torch.device:
        return torch.device(self.device) if self.device is not None else self.model.tok_embeddings.weight.device


_PLANS: "OrderedDict[tuple, RunMemory]" = OrderedDict()  # the last plans, by everything that fixes their shapes
_PLANS_KEPT = 64


def plan_run_memory(run: PlannedRun) -> RunMemory:
    """The memory `run` will allocate beyond its weights, by a dry run on meta twins: reads no weight and
    allocates nothing on any real device. Settings the decoder would refuse (a tree wider than the
    vocabulary, a neighbour table too narrow) raise its `ConfigError` here, before anything is placed. A dry run costs about a second for a 7B model; the result is kept
    for runs of the same shapes (model, dtypes, prefix, batch, sampling, decoder, device kind)."""
    key = _shape_key(run)
    if key is not None and key in _PLANS:
        _PLANS.move_to_end(key)
        return _PLANS[key]
    memory = _dry_run(run)
    if key is not None:
        _PLANS[key] = memory
        while len(_PLANS) > _PLANS_KEPT:
            _PLANS.popitem(last=False)
    return memory


def _shape_key(run: PlannedRun) -> tuple | None:
    """What decides every shape a dry run sees (None when a setting cannot be a key)."""
    prefix = meta_prefix(run.model, run.condition, run.sampling.uses_cfg)
    dtypes = lambda module: tuple(sorted({str(t.dtype) for t in module.parameters()}))  # noqa: E731
    drafter = None if run.drafter is None else (run.drafter.config, dtypes(run.drafter))
    key = (type(run.model).__name__, run.model.config, dtypes(run.model), weights_scheme(run.model), drafter,
           tuple(prefix.embeddings.shape), prefix.padded, prefix.token_ids is not None, run.sampling, run.spec,
           None if run.neighbors is None else tuple(run.neighbors.shape), run.compile, run.run_device.type)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _dry_run(run: PlannedRun) -> RunMemory:
    model, spec, sampling, condition = run.model, run.spec, run.sampling, run.condition
    layout = layout_for(run.compile, run.run_device)
    if run.drafter is not None:
        target, draft = meta_twin(model, run.drafter)
    else:
        target, draft = meta_twin(model)[0], None
    # the decoders' own checks first: a setting they refuse is refused here with the same error
    if isinstance(spec, SpeculativeConfig):
        check_tree_fits(spec, model.config)
    k = 0 if spec is None else spec.neighbor_k if isinstance(spec, JacobiConfig) else (
        spec.relaxation.k if spec.relaxation else 0)
    table = extend_neighbors(model.config, check_neighbors(k, run.neighbors, META, model.config))
    prefix = lambda: meta_prefix(target, condition, sampling.uses_cfg)  # noqa: E731 -- made inside the tally
    if spec is None:
        dry, mode = lambda: _dry_ar(target, prefix, condition.batch, sampling, layout), "plain AR"
    elif isinstance(spec, JacobiConfig):
        configs = candidate_geometries(spec, model.config.row_stride)
        dry = lambda: max((_dry_jacobi(target, prefix, c, sampling, table, layout) for c in configs),  # noqa: E731
                          key=lambda measured: measured[1])
        mode = spec.describe()
    else:
        dry, mode = lambda: _dry_tree(target, draft, prefix, spec, sampling, table, layout), f"{spec.tree} tree"
    with torch.no_grad():
        state, peak = dry()
    return RunMemory(state, peak, condition.batch, mode)


class RunMemoryError(LanternError, MemoryError):
    """A run needs more free memory than its device has; raised before it allocates anything."""


def check_run_fits(run: PlannedRun, need: RunMemory, free_bytes: int, weights_bytes: int = 0) -> None:
    """Nothing when `need` (`plan_run_memory(run)`) fits in `free_bytes`; else a `RunMemoryError` saying what
    the run needs, what is free, and what would fit: a smaller batch, plain AR, or weight-only int8 / fp8
    when the target has `weights_bytes` of block weights still in the compute dtype (0: none)."""
    if need.peak <= free_bytes:
        return
    options = []
    batch = _largest_batch(run, free_bytes)
    if batch:
        options.append(f"lower batch_size to {batch}")
    if run.spec is not None:
        plain = replace(run, spec=None, drafter=None, neighbors=None)
        batch = _largest_batch(plain, free_bytes, run.condition.batch)
        if batch:
            options.append("decode with mode 'ar'" + (f" at batch_size {batch}" if batch < run.condition.batch else ""))
    element = run.model.tok_embeddings.weight.element_size()
    freed = weights_bytes - weights_bytes // element if weights_bytes else 0
    if freed and free_bytes + freed >= need.peak:
        options.append(f"load the model with weights int8 or fp8 on Lantern: Load Model (frees about {mib(freed)} "
                       "of weights)")
    options.append("free memory on the device (other programs, or fewer models kept loaded)")
    raise RunMemoryError(f"This run needs {mib(need.peak)} free on {run.run_device} ({need.describe()}) but "
                         f"{mib(free_bytes)} is free after loading the model. Fix: " + "; or ".join(options) + ".")


def _largest_batch(run: PlannedRun, free_bytes: int, up_to: int | None = None) -> int:
    """The largest batch below `run`'s (or up to `up_to`) whose plan fits in `free_bytes` (0: none does)."""
    batch = up_to if up_to is not None else run.condition.batch - 1
    while batch >= 1:
        plan = plan_run_memory(replace(run, condition=run.condition.first(batch)))
        if plan.peak <= free_bytes:
            return batch
        batch = batch - 1 if batch <= 4 else batch // 2
    return 0


class _FusedAttention(TorchFunctionMode):
    """Attention as the devices run it: one fused kernel (flash / memory-efficient on CUDA, flash on the CPU)
    that allocates its output, not the (rows, heads, queries, keys) scores the meta device's decomposition
    into matmul and softmax would make."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:
            q, v = args[0], args[2] if len(args) > 2 else kwargs["value"]
            return q.new_empty(*q.shape[:-1], v.shape[-1])
        return func(*args, **(kwargs or {}))


def _measured(dry):
    """Run `dry(tally)` (which returns the bytes of the run's persistent state once it is allocated) under a
    fresh allocation tally; (state bytes, peak bytes)."""
    with track_allocations() as tally, _FusedAttention():
        state = dry(tally)
    return state, tally.peak


def _last_length(T: int, model: ImageTransformer) -> int:
    """Committed length at the last iteration an image can take after a prefix of T: the widest windows a run
    reaches."""
    return T + model.config.num_image_tokens - 2


def _dry_ar(model: ImageTransformer, make_prefix, batch: int, sampling: SamplingConfig,
            layout: RunLayout) -> tuple[int, int]:
    """`generate`: buffers, uniforms, prefill and first token, then the last step's window."""
    N = model.config.num_image_tokens

    def dry(tally) -> int:
        prefix = make_prefix()
        rows, T = prefix.key_valid.shape
        shape = ARShape(batch, slots_for(T, N, layout.slot_bucket), N, sampling)
        buffers = ARBuffers.allocate(model, shape)
        state = tally.live
        logits = model.logits(prefill(model, prefix, buffers.cache, buffers.key_valid)[:, -1])  # (rows, V)
        buffers.tokens[:, 0] = sample_step_tokens(model, logits, sampling, buffers.index, buffers.noise)
        slot = T + N - 2
        window = shape.slots if layout.compiled else (exact_window if layout.exact else window_for)(slot, shape.slots)
        ar_step(model, shape, buffers, window)
        buffers.tokens.clone()  # the result handed back
        return state
    return _measured(dry)


def _dry_tree(model: ImageTransformer, drafter, make_prefix, spec: SpeculativeConfig, sampling: SamplingConfig,
              neighbors: torch.Tensor | None, layout: RunLayout) -> tuple[int, int]:
    """`trees.batch.decode_batch`: sink, state, prefill, first tokens, the drafter's prefix, noise, the last
    iteration's windows, and the state of all images but one (a shrinking batch)."""
    if drafter is None:
        raise ValueError("a tree decoder's reservation needs its drafter")
    N = model.config.num_image_tokens
    guided = sampling.uses_cfg
    plan = None if spec.tree == "dynamic" else plan_static_tree(spec.static_tree, META)  # "auto": its base tree

    def dry(tally) -> int:
        prefix = make_prefix()
        rows, T = prefix.key_valid.shape
        G = rows // 2 if guided else rows
        BatchSink.allocate(G, N, RunTally(META))
        dist = NodeDistributions(sampling, guided, model.constrain_logits)
        shape = TreeShape(rows, slots_for(T, N + spec.cache_spare, layout.slot_bucket), N, sampling,
                          spec.dynamic if plan is None else plan.spec, spec.relaxation, spec.exact_rule)
        state = TreeState.allocate(model, drafter, shape, plan, neighbors)
        persistent = tally.live
        hidden = prefill(model, prefix, state.cache, state.key_valid)
        first = pick_tokens(dist.combine(model.logits(hidden[:, -1:]), torch.zeros(1, dtype=torch.long, device=META))[:, 0],
                            sampling, None)  # (G,)
        state.start_image(T, first)
        if not sampling.greedy:
            fill_per_image(state.uniforms, [None] * G)
        state.session.reset(0)
        fed, embeddings = prefix_inputs(drafter, model, prefix.token_ids, first, rows, T)
        features = drafter_features(model, prefix, hidden, drafter.config.prefix_states)
        state.session.consume(features, fed, embeddings)
        tree_iteration(TreeContext(model, drafter, shape, plan, dist), state,
                       tree_windows(_last_length(T, model), shape, layout.exact, layout.compiled))
        if layout.exact and G > 1:  # images that finish leave the batch: the others' state is copied
            state.select(list(range(G - 1)), guided)
        return persistent
    return _measured(dry)


def _dry_jacobi(model: ImageTransformer, make_prefix, config: JacobiConfig, sampling: SamplingConfig,
                neighbors: torch.Tensor | None, layout: RunLayout) -> tuple[int, int]:
    """`jacobi.batch.decode_batch`: sink, state, prefill, first tokens, position noise, the last iteration's window,
    and the state of all images but one (a shrinking batch)."""
    N = model.config.num_image_tokens
    guided = sampling.uses_cfg

    def dry(tally) -> int:
        prefix = make_prefix()
        rows, T = prefix.key_valid.shape
        shape = JacobiShape(rows, 0, N, sampling, config, model.config.row_stride)
        shape = replace(shape, slots=slots_for(T, N + shape.extent + int(shape.row_commit), layout.slot_bucket))
        G = shape.images
        BatchSink.allocate(G, N, RunTally(META))
        dist = NodeDistributions(sampling, guided, model.constrain_logits)
        state = JacobiState.allocate(model, shape, neighbors)
        persistent = tally.live
        hidden = prefill(model, prefix, state.cache, state.key_valid)
        context = JacobiContext(model, shape, dist)
        first_p = context.target(model.logits(hidden[:, -1:]), torch.zeros(1, dtype=torch.long, device=META))[:, 0]
        state.start_image(T, first_p.argmax(-1), first_p)
        draw_position_noise(state, [None] * G)
        if not sampling.greedy:
            fill_per_image(state.uniforms, [None] * G)
        _, keys = jacobi_window(_last_length(T, model), shape, layout.exact, layout.compiled)
        jacobi_iteration(context, state, keys)
        if layout.exact and G > 1:
            state.select(list(range(G - 1)), guided)
        return persistent
    return _measured(dry)

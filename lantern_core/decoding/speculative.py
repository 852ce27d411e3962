"""Speculative decoding of image tokens with an EAGLE drafter: EAGLE-2 (dynamic tree), static trees
(LANTERN++ / EAGLE-1), each exact or LANTERN-relaxed (delta: absolute TVD budget; lambda: LANTERN++'s
multiplicative bound), with sampling or greedy decoding.

A batch of B images is decoded together (rows = [cond B; uncond B] with CFG): one drafter forward per tree
level drafts all B trees, one target forward verifies them, and each image accepts its own number of
tokens and advances on its own in the static KV cache; image i draws its randomness from generator i only,
so it equals a single run with that generator (seed + i). Per iteration (`tree_step.py`, static shapes,
replayed from a CUDA graph with compile "auto" on CUDA): draft the trees, verify them in one target forward
against the static KV cache, walk them (`tree_walk.py`), compact each accepted path in place, feed the
accepted features to the drafter; this module prefills, chooses the tree and loops until the last image is
done, reading the tokens done of every image once per iteration. The
acceptance test always sees the CFG-combined, temperature/top-k/top-p-filtered distribution, and the
drafter proposes from its own logits under the same CFG and filters. This module does not pick devices
or load files.
"""
from __future__ import annotations

import hashlib
import logging
import time
import weakref
from dataclasses import dataclass, field, replace
from typing import Callable, Literal

import torch

from ..conditioning import Condition, build_prefix
from . import auto_store
from ..config import SamplingConfig
from .ar_step import slots_for
from .done_reader import DoneReader
from .drafting import DynamicShape, StaticPlan, plan_static_tree, prefix_inputs
from .prefix_states import drafter_features
from ..errors import ConfigError
from ..layout import extend_neighbors
from .generate import GenerationResult, GenerationStats, StepCallback, generate, prefill, synchronize
from ..models.drafter import EagleDrafter
from ..models.gpt import ImageTransformer
from .relaxation import Relaxation
from .sampling import Generators, fill_per_image, filter_logits, generator_for, make_generators, pick_tokens
from .step_graphs import RunLayout, StepRunner, layout_for, runner
from .tree import NAIVE_EXTEND_57, TreeSpec
from .tree_select import CostCurve, choose_subtree, measure_costs, node_rates, tree_rate
from .tree_step import TreeContext, TreeShape, TreeState, band_windows, draw_iteration_noise, tree_iteration, tree_windows

log = logging.getLogger("lantern_core.speculative")


@dataclass(frozen=True)
class SpeculativeConfig:
    """How to draft and accept. `tree` "static" uses `static_tree`; "dynamic" is EAGLE-2 with `dynamic`;
    "auto" picks the best sub-tree of `static_tree` for this machine (`tree_select.py`), calibrating on the
    first image of the first run per drafter and sampling setting. `relaxation` None is exact (lossless);
    a Relaxation with delta is LANTERN, with lam LANTERN++."""

    tree: Literal["static", "dynamic", "auto"] = "static"
    static_tree: TreeSpec = NAIVE_EXTEND_57
    dynamic: DynamicShape = DynamicShape()
    relaxation: Relaxation | None = None

    def __post_init__(self) -> None:
        if self.tree not in ("static", "dynamic", "auto"):
            raise ConfigError("tree", "'static', 'dynamic' or 'auto'", self.tree)
        d = self.dynamic
        if not (1 <= d.depth <= 64 and 1 <= d.top_k <= 64 and 1 <= d.nodes <= d.top_k + (d.depth - 1) * d.top_k ** 2):
            raise ConfigError("dynamic tree", "depth 1..64, top_k 1..64 and 1 <= nodes <= top_k + (depth-1)*top_k^2",
                              d)

    @property
    def max_nodes(self) -> int:
        return self.dynamic.nodes if self.tree == "dynamic" else self.static_tree.num_nodes

    @property
    def depth(self) -> int:
        return self.dynamic.depth if self.tree == "dynamic" else self.static_tree.depth

    @property
    def cache_spare(self) -> int:
        """KV slots past the image that a step needs: the verified nodes (+ root), and for EAGLE-2 the
        drafter's depth x top_k expanded candidates, however few of them are kept."""
        drafted = self.dynamic.depth * self.dynamic.top_k if self.tree == "dynamic" else 0
        return max(self.max_nodes, drafted) + 2


@dataclass
class SpeculativeStats(GenerationStats):
    iterations: int = 0  # verification forwards (the prefill is the remaining forward pass)
    drafter_forwards: int = 0
    accepted_histogram: list[int] = field(default_factory=list)  # iterations by drafted tokens accepted
    relaxed_tokens: int = 0  # accepted drafted tokens that used absorbed neighbour mass
    mean_absorbed: float = 0.0  # mean TVD spent per accepted drafted token
    max_absorbed: float = 0.0  # largest TVD spent on one token (<= delta for LANTERN)
    accepted_by_node: list[int] = field(default_factory=list)  # static trees: acceptances per node id
    tree: str = ""  # the tree used, e.g. "naive_extend_57", "eagle2 d5 k10 n58", "auto_9 (of naive_extend_57)"
    batch_forwards: int = 0  # target forwards run for the whole batch (prefill + verifications of all images at once)
    per_image: list[dict] = field(default_factory=list)  # per image: iterations, mean accepted length
    drafter_prefix_states: str = ""  # the drafter's prefix convention (`prefix_states.py`): native or hf_port
    row_commits: list[int] = field(default_factory=list)  # relaxed 2-D: tokens each lower row window committed

    @property
    def mean_accepted_length(self) -> float:
        """Image tokens per target forward (prefill included), LANTERN's step compression."""
        return self.batch * self.image_tokens / max(self.forward_passes, 1)

    @property
    def acceptance_by_depth(self) -> list[float]:
        """P(a draft is accepted at depth d | the walk reached depth d - 1), from the histogram."""
        reached = [sum(self.accepted_histogram[d:]) for d in range(len(self.accepted_histogram))]
        return [reached[d] / reached[d - 1] for d in range(1, len(reached)) if reached[d - 1]]

    def to_dict(self) -> dict:
        return super().to_dict() | {"acceptance_by_depth": self.acceptance_by_depth}

    def summary(self) -> str:
        depth = " ".join(f"{a:.2f}" for a in self.acceptance_by_depth)
        text = (super().summary() + f"; {self.tree}; {self.iterations} verifications, acceptance by depth [{depth}], "
                f"TVD spent mean {self.mean_absorbed:.3f} max {self.max_absorbed:.3f}")
        if self.row_commits:
            share = 100 * sum(self.row_commits) / max(self.batch * self.image_tokens, 1)
            text += f"; {share:.0f}% of tokens committed by lower rows (relaxed 2-D, not lossless)"
        if self.batch > 1:
            lengths = " ".join(f"{p['mean_accepted_length']:.2f}" for p in self.per_image)
            text += f"; batch of {self.batch} in {self.batch_forwards} forwards, accepted length per image [{lengths}]"
        return text


class NodeDistributions:
    """CFG + filters for one run, per tree node: logits (rows, T, V), image-token index (T,) -> (G, T, V)
    where rows = G trees, or [cond trees; uncond trees] with CFG. Greedy runs get softmax(logits).
    `constrain` (the model's `constrain_logits`) applies a forced-token layout after CFG."""

    def __init__(self, sampling: SamplingConfig, guided: bool, constrain=None):
        self.sampling = sampling
        self.guided = guided
        self.constrain = constrain

    def combine(self, logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        mixed = self._cfg(logits, index)
        return mixed if self.constrain is None else self.constrain(mixed, index)

    def _cfg(self, logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        if not self.guided:
            return logits.float()
        cond, uncond = logits.float().chunk(2, dim=0)
        s = self.sampling
        mixed = uncond + s.cfg_scale * (cond - uncond)  # exactly as AR's combine_cfg (same rounding)
        if s.cfg_interval < 0:
            return mixed
        active = (index <= s.cfg_interval + 1) if s.cfg_interval >= 0 else torch.ones_like(index, dtype=torch.bool)
        active = active[..., None] if index.dim() == 2 else active[None, :, None]  # (G|1, T, 1)
        return torch.where(active, mixed, cond)

    def __call__(self, logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return self._filtered(logits, index).softmax(-1)

    def log_probs(self, logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """log of `__call__` computed as a log-softmax: finite wherever the filters keep a token, even
        where the probability itself underflows float32 (what drafting without replacement needs)."""
        return self._filtered(logits, index).log_softmax(-1)

    def _filtered(self, logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        combined = self.combine(logits, index)
        if self.sampling.greedy:
            return combined
        s = self.sampling
        return filter_logits(combined, s.temperature, s.top_k, s.top_p)


# Auto choices are remembered by the weights' digest, not the module object: a model unloaded
# (ComfyUI's /free) and loaded again gets the same tree, so the same seed keeps giving the same image.
_AUTO_CHOICES: dict[tuple, dict] = {}
_COSTS: "weakref.WeakKeyDictionary[EagleDrafter, dict]" = weakref.WeakKeyDictionary()


_DIGESTS: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = weakref.WeakKeyDictionary()


def weights_digest(module: torch.nn.Module) -> tuple:
    """Identity of a module's weights that survives unloading and reloading the same file: its class,
    config, and a hash of every parameter's shape, dtype and first and last 1,024 values (cheap on a 7B;
    computed once per module object)."""
    if module not in _DIGESTS:
        _DIGESTS[module] = _digest(module)
    return _DIGESTS[module]


def _digest(module: torch.nn.Module) -> tuple:
    digest = hashlib.sha256()
    for name, p in module.named_parameters():
        flat = p.detach().reshape(-1)
        sample = torch.cat([flat[:1024], flat[-1024:]]).float().cpu()
        digest.update(f"{name}{tuple(p.shape)}{p.dtype}".encode())
        digest.update(sample.numpy().tobytes())
    return type(module).__name__, getattr(module, "config", None), digest.hexdigest()


def _auto_key(sampling: SamplingConfig, spec: SpeculativeConfig) -> tuple:
    """What the best tree depends on besides the machine: sampling, acceptance rule and base tree."""
    return (sampling.uses_cfg, sampling.greedy, round(sampling.temperature, 3), sampling.top_k,
            round(sampling.top_p, 3), spec.relaxation, spec.static_tree.paths)


def _auto_choice(model: ImageTransformer, drafter: EagleDrafter, sampling: SamplingConfig,
                 spec: SpeculativeConfig, batch: int) -> tuple[TreeSpec, str] | None:
    return _AUTO_CHOICES.get(_pair(model, drafter), {}).get((_auto_key(sampling, spec), batch))


def _stored_key(model: ImageTransformer, drafter: EagleDrafter, sampling: SamplingConfig, spec: SpeculativeConfig,
                batch: int) -> str:
    weight = model.tok_embeddings.weight
    return auto_store.entry_key("tree", weights_digest(model), weights_digest(drafter),
                                auto_store.device_name(weight.device), str(weight.dtype), _auto_key(sampling, spec), batch)


def _auto_tree(model: ImageTransformer, drafter: EagleDrafter, condition: Condition, sampling: SamplingConfig,
               spec: SpeculativeConfig, neighbors: torch.Tensor | None, compile: str) -> tuple[TreeSpec, str, str]:
    """The `auto` tree for this batch size: remembered in this process, else kept in the store by an earlier
    process (`auto_store.py`), else calibrated now (and stored). Returns (tree, note, where it came from)."""
    B = condition.batch
    cached = _auto_choice(model, drafter, sampling, spec, B)
    if cached is not None:
        return (*cached, "")
    key = _stored_key(model, drafter, sampling, spec, B)
    stored = auto_store.recall(key)
    if stored is not None:
        try:
            chosen = (TreeSpec(str(stored["name"]), tuple(tuple(p) for p in stored["paths"])), str(stored["note"]))
        except (KeyError, TypeError, ValueError, ConfigError) as exc:
            log.warning("ignoring a stored auto tree (%s); measuring again", exc)
        else:
            if set(chosen[0].paths) <= set(spec.static_tree.paths):
                _AUTO_CHOICES.setdefault(_pair(model, drafter), {})[(_auto_key(sampling, spec), B)] = chosen
                return (*chosen, "; measured in an earlier run")
    chosen, note = _calibrate(model, drafter, condition.row(0), sampling, spec, neighbors, compile, B)
    auto_store.remember(key, {"name": chosen.name, "paths": [list(p) for p in chosen.paths], "note": note},
                        f"tree for {type(model).__name__} at batch {B}")
    return chosen, note, "; calibrated in this run"


def _pair(model: ImageTransformer, drafter: EagleDrafter) -> tuple:
    weight = model.tok_embeddings.weight
    return weights_digest(model), weights_digest(drafter), str(weight.device), str(weight.dtype)


def _costs(model: ImageTransformer, drafter: EagleDrafter, rows: int) -> CostCurve:
    per_drafter = _COSTS.setdefault(drafter, {})
    key = (id(model), rows, str(model.tok_embeddings.weight.device), str(model.tok_embeddings.weight.dtype))
    if key not in per_drafter:
        per_drafter[key] = measure_costs(model, drafter, rows)
    return per_drafter[key]


def _calibrate(model: ImageTransformer, drafter: EagleDrafter, condition: Condition, sampling: SamplingConfig,
               spec: SpeculativeConfig, neighbors: torch.Tensor | None, compile: str, batch: int) -> tuple[TreeSpec, str]:
    """Decode one scratch batch of `batch` copies of `condition` on the base tree (fixed seeds, output
    discarded) to measure each node's acceptance, measure the cost curve at the batch's rows, choose the
    sub-tree and remember it for that batch size. Seeds of the user's images are untouched, so every image
    of every run of that size uses the same tree: same seed, same image. The same scratch batch is also
    decoded with plain AR, so the stats can say when speculation does not pay on this machine (the
    model-forward cost model is scaled by the base tree's measured speed)."""
    device = model.tok_embeddings.weight.device
    N = model.config.num_image_tokens
    scratch_condition = condition.repeated(batch)
    scratch = RunTally(device, by_node=torch.zeros(spec.static_tree.num_nodes + 1, dtype=torch.long, device=device))
    plan = plan_static_tree(spec.static_tree, device)

    def decode_base(tally: RunTally) -> None:
        request = BatchRequest(scratch_condition, sampling, make_generators(0, batch, device), neighbors, compile)
        _decode_batch(model, drafter, spec, plan, request, BatchSink.allocate(batch, N, tally))

    def decode_ar() -> None:
        generate(model, scratch_condition, sampling, make_generators(0, batch, device), compile=compile)

    if layout_for(compile, device).graphs:  # capture both outside the clock (users replay kept graphs)
        decode_base(RunTally(device, by_node=torch.zeros_like(scratch.by_node)))
        decode_ar()
    start = time.perf_counter()
    decode_base(scratch)
    synchronize(device)
    base_measured = batch * N / (time.perf_counter() - start)
    start = time.perf_counter()
    decode_ar()
    synchronize(device)
    ar_measured = batch * N / (time.perf_counter() - start)
    rows = batch * (2 if sampling.uses_cfg else 1)
    rates = node_rates(spec.static_tree, scratch.by_node.tolist(), scratch.iterations)
    costs = _costs(model, drafter, rows)
    chosen, predicted = choose_subtree(spec.static_tree, rates, costs)
    estimate = predicted * base_measured / tree_rate(spec.static_tree, rates, costs)
    at = f" at batch {batch}" if batch > 1 else ""
    note = (f"about {estimate:.0f} tok/s expected with {chosen.name} vs {ar_measured:.0f} tok/s for plain AR{at} "
            f"on this machine" + ("; plain AR (mode ar) is faster here" if estimate < ar_measured else ""))
    _AUTO_CHOICES.setdefault(_pair(model, drafter), {})[(_auto_key(sampling, spec), batch)] = (chosen, note)
    return chosen, note


@dataclass
class RunTally:
    """Run counters of a speculative decoder (tree or Jacobi), whole batch and per image. The relaxation ones
    stay on the device (read once at the end, never per step)."""

    device: torch.device
    by_node: torch.Tensor | None = None  # (n+1,) acceptances per node of the static tree in use
    drafter_forwards: int = 0
    histogram: list[int] = field(default_factory=list)  # iterations by drafted tokens accepted, all images
    per_image: list[tuple[int, list[int]]] = field(default_factory=list)  # (image, its histogram) as images finish
    batch_iterations: int = 0  # iterations of the batch loop (one target forward each)
    batches: int = 0  # prefills
    prefill_s: float = 0.0
    cache_bytes: int = 0
    row_commits: torch.Tensor | None = None  # relaxed 2-D: (R-1,) tokens committed per lower row window

    def __post_init__(self) -> None:
        self.absorbed_sum = torch.zeros((), device=self.device)
        self.absorbed_max = torch.zeros((), device=self.device)
        self.relaxed = torch.zeros((), dtype=torch.long, device=self.device)

    @property
    def iterations(self) -> int:
        return sum(self.histogram)

    def to_stats(self, batch: int, image_tokens: int, wall_time_s: float, tree: str) -> SpeculativeStats:
        """The run's stats (reads the device counters once)."""
        accepted = sum(k * c for k, c in enumerate(self.histogram))
        per_image = [{"iterations": sum(h), "mean_accepted_length": round(image_tokens / (1 + sum(h)), 4)}
                     for _, h in sorted(self.per_image, key=lambda item: item[0])]
        return SpeculativeStats(
            batch=batch, image_tokens=image_tokens, forward_passes=batch + self.iterations, wall_time_s=wall_time_s,
            prefill_time_s=self.prefill_s, kv_cache_bytes=self.cache_bytes, iterations=self.iterations,
            drafter_forwards=self.drafter_forwards, accepted_histogram=self.histogram,
            relaxed_tokens=int(self.relaxed), mean_absorbed=float(self.absorbed_sum) / max(accepted, 1),
            max_absorbed=float(self.absorbed_max),
            accepted_by_node=[] if self.by_node is None else self.by_node.tolist(), tree=tree,
            batch_forwards=self.batches + self.batch_iterations, per_image=per_image,
            row_commits=[] if self.row_commits is None else self.row_commits.tolist())

    def add_images(self, state, local: list[int], original: list[int]) -> None:
        """Fold the per-image counters of images `local` of a batch state (a `TreeState` or `JacobiState`:
        `histogram` (G, ·)) in, recorded as images `original` of the run; one read of the histograms."""
        rows = state.histogram.tolist()
        for g, image in zip(local, original):
            counts = rows[g]
            while counts and counts[-1] == 0:
                counts.pop()
            self.per_image.append((image, counts))
            for accepted, count in enumerate(counts):
                while len(self.histogram) <= accepted:
                    self.histogram.append(0)
                self.histogram[accepted] += count
            self.drafter_forwards += (1 + sum(counts) * state.forwards_per_iteration) if state.forwards_per_iteration else 0

    def add_totals(self, state) -> None:
        """Fold a batch's run totals in: `absorbed` (sum, max), `relaxed`, and for trees `by_node`."""
        self.absorbed_sum += state.absorbed[0]
        self.absorbed_max = torch.maximum(self.absorbed_max, state.absorbed[1])
        self.relaxed += state.relaxed
        rows = getattr(state, "rows", None)
        if rows is not None:
            self.row_commits = rows.commits.clone() if self.row_commits is None else self.row_commits + rows.commits
        if self.by_node is not None:
            self.by_node += state.by_node[: self.by_node.numel()]


def progress_tokens(out: torch.Tensor, tokens: torch.Tensor, done: torch.Tensor, images: torch.Tensor | None = None) -> None:
    """Copy the decoded cells of every image of a batch state into `out` (B, N) (rows `images`, a device index,
    of it when the state holds only those), -1 where an image has not got that far (so a preview of one image
    can tell its own progress in a batch that advances unevenly). Device work only: no host read or upload."""
    N = out.shape[1]
    cells = torch.arange(N, device=out.device)
    current = torch.where(cells < done[:, None], tokens[:, :N], torch.full_like(tokens[:, :N], -1))
    if images is None:
        out.copy_(current)
    else:
        out.index_copy_(0, images, current)


@dataclass
class BatchRequest:
    """What a batch decode is asked for: the images' condition, the sampling settings, one generator per image,
    the neighbour table of a relaxed rule (or None) and the compile choice."""

    condition: Condition
    sampling: SamplingConfig
    generators: list
    neighbors: torch.Tensor | None = None
    compile: str = "off"


@dataclass
class BatchSink:
    """Where a batch decode writes: tokens (B, N) (-1 past each image's progress while it runs), heat maps
    (B, N), the run's counters and the progress callback (tokens done per image)."""

    tokens: torch.Tensor
    per_cell: torch.Tensor
    tally: RunTally
    report: Callable[[list[int]], None] = lambda done: None

    @classmethod
    def allocate(cls, batch: int, N: int, tally: RunTally, report: Callable[[list[int]], None] | None = None
                 ) -> "BatchSink":
        device = tally.device
        return cls(torch.empty(batch, N, dtype=torch.long, device=device),
                   torch.ones(batch, N, dtype=torch.int32, device=device), tally, report or (lambda done: None))


@dataclass
class BatchProgress:
    """Where a batch loop stands on the host: the run's index of each image still in the state (images that
    are done leave the state on devices that run eagerly), their tokens done, and every image's tokens done."""

    images: list[int]
    done: list[int]
    total: list[int]
    N: int
    index: torch.Tensor | None = None  # `images` on the device once the state holds fewer images than it started with

    @classmethod
    def start(cls, count: int, N: int) -> "BatchProgress":
        return cls(list(range(count)), [1] * count, [1] * count, N)

    @property
    def running(self) -> bool:
        return min(self.done) < self.N

    @property
    def active(self) -> list[bool]:
        return [d < self.N for d in self.done]

    @property
    def furthest(self) -> int:
        """Tokens done by the furthest image still decoding (what the attention windows must cover)."""
        return max(d for d in self.done if d < self.N)

    def furthest_after(self, advance: int) -> int:
        """`furthest` when the counts may be one iteration old (`DoneReader(late=True)`): at most `advance` tokens
        further, never past the last image token."""
        return min(self.furthest + advance, self.N - 1)

    def update(self, done: list[int] | None) -> None:
        if done is None:  # a late reader's first read: nothing newer than the counts already held
            return
        self.done = done
        for image, d in zip(self.images, done):
            self.total[image] = min(d, self.N)

    def finished(self) -> list[int]:
        return [g for g, d in enumerate(self.done) if d >= self.N]

    def keep(self, local: list[int], device: torch.device) -> None:
        self.images = [self.images[g] for g in local]
        self.done = [self.done[g] for g in local]
        self.index = torch.tensor(self.images, dtype=torch.long, device=device)  # once per shrink, not per iteration


def retire_finished(state, progress: BatchProgress, sink: BatchSink, guided: bool):
    """On devices that run eagerly, images that are done leave the batch so they stop costing work: their
    heat maps and counters are recorded, the state of the others is returned (None when nobody is done or
    everybody is) and the old state is released (its cache size counted first); `progress` follows the kept
    images, which are returned as local indices of the old state."""
    finished = progress.finished()
    if not finished or len(finished) == len(progress.done):
        return None, None
    record_images(state, progress, finished, sink)
    keep = [g for g in range(len(progress.done)) if g not in finished]
    smaller = state.select(keep, guided)
    sink.tally.cache_bytes = max(sink.tally.cache_bytes, state.nbytes)
    state.release()
    progress.keep(keep, state.done.device)
    return smaller, keep


def record_images(state, progress: BatchProgress, local: list[int], sink: BatchSink) -> None:
    """Copy the heat maps of images `local` of the state out and fold their counters into the tally."""
    per_cell, tally = sink.per_cell, sink.tally
    N = per_cell.shape[1]
    index = torch.tensor(local, dtype=torch.long, device=per_cell.device)
    images = [progress.images[g] for g in local]
    per_cell.index_copy_(0, torch.tensor(images, dtype=torch.long, device=per_cell.device),
                         state.per_cell.index_select(0, index)[:, :N])
    tally.add_images(state, local, images)


def draftable_codes(config) -> int:
    """The image codes a draft can choose between at one position: the vocabulary, less Lumina-mGPT's
    end-of-row code (`config.row_end`, the last code), which is forced at the end of every row and refused
    everywhere else (`layout.constrain`), so no node has more than vocab_size - 1 children worth drafting."""
    return config.vocab_size - int(config.row_end)


def check_tree_fits(spec: SpeculativeConfig, config) -> None:
    """Refuse, before any forward, a tree that drafts more children under one node than the target `config`
    has codes a draft can pick (children are drawn without replacement from the vocabulary: a static tree's
    widest node, EAGLE-2's top_k per expanded node). The error names the tree, its widest node's child count and the vocabulary size,
    and the fix. Reads settings only, no tensor; trees of at most that many children per node run (children
    a top-k / top-p filter leaves no mass for are drawn last and never accepted)."""
    V = draftable_codes(config)
    codes = f"{V} image codes a draft can pick" + (
        f": {config.vocab_size} less the forced end-of-row code" if config.row_end else "")
    if spec.tree == "dynamic":
        d = spec.dynamic
        if d.top_k > V:
            nodes = min(d.nodes, V + (d.depth - 1) * V ** 2)
            raise ConfigError(f"dynamic tree 'eagle2 d{d.depth} k{d.top_k} n{d.nodes}'",
                              f"a top_k of at most {V} children per node (the vocabulary size, {codes})",
                              f"top_k {d.top_k}: {d.top_k} children under every expanded node",
                              f"lower eagle_top_k (command line: --eagle-top-k) to at most {V}"
                              + ("" if nodes == d.nodes else f" and eagle_nodes (--eagle-nodes) to at most {nodes}")
                              + ", or use a model with a larger vocabulary")
    elif spec.static_tree.widest > V:
        tree = spec.static_tree
        base = " (the base tree of 'auto')" if spec.tree == "auto" else ""
        raise ConfigError(f"tree '{tree.name}'{base}",
                          f"at most {V} children under any node (the vocabulary size, {codes})",
                          f"{tree.widest} children under its widest node",
                          f"choose a narrower tree (at most {V} children per node, e.g. tree 'chain' or a "
                          "'custom' tree) or a model with a larger vocabulary")


def check_neighbors(k: int, neighbors: torch.Tensor | None, device: torch.device, config) -> torch.Tensor | None:
    """The neighbour table on `device` when the acceptance reads k > 0 neighbours, else None. A relaxation
    reading more latent neighbours than the target `config` has other codes is a ConfigError (tree and
    Jacobi decoders alike), before any forward."""
    if k == 0:
        return None
    V = draftable_codes(config)
    if k > V - 1:
        raise ConfigError("lantern_k", f"at most {V - 1} latent neighbours per token (the {V} codes less the "
                          "token itself)", k, f"lower lantern_k (command line: --k) to at most {V - 1}")
    if neighbors is None or neighbors.shape[1] < k:
        raise ConfigError("neighbour table", f"a (V, >= {k}) table for lantern k",
                          None if neighbors is None else tuple(neighbors.shape),
                          "build it with lantern_core.decoding.neighbors.load_or_build_neighbors")
    return neighbors.to(device)


@torch.no_grad()
def speculative_generate(model: ImageTransformer, drafter: EagleDrafter, condition: Condition, sampling: SamplingConfig,
                         spec: SpeculativeConfig, generator: Generators = None, neighbors: torch.Tensor | None = None,
                         on_step: StepCallback | None = None, compile: str = "auto") -> GenerationResult:
    """Speculatively sample `condition.batch` images' tokens, all in one batch; image i draws from
    generator i (`make_generators`: seed + i). `neighbors` (V, >= k) is needed for relaxation. `compile`
    "auto" replays each iteration from a CUDA graph on CUDA (`tree_step.py`); "off" runs eagerly. `on_step`
    gets the tokens done by the whole batch, out of B x N, and the (B, N) tokens (-1 past each image's
    progress). A tree wider than the vocabulary raises ConfigError before any forward (`check_tree_fits`)."""
    check_tree_fits(spec, model.config)
    neighbors = extend_neighbors(model.config, check_neighbors(spec.relaxation.k if spec.relaxation else 0, neighbors,
                                model.tok_embeddings.weight.device, model.config))
    start = time.perf_counter()
    config = model.config
    N = config.num_image_tokens
    B = condition.batch
    device = model.tok_embeddings.weight.device
    tally = RunTally(device)
    tree_name = spec.static_tree.name if spec.tree == "static" else (
        f"eagle2 d{spec.dynamic.depth} k{spec.dynamic.top_k} n{spec.dynamic.nodes}")
    plan = None
    if spec.tree != "dynamic":
        chosen = None
        if spec.tree == "auto":
            chosen, note, origin = _auto_tree(model, drafter, condition, sampling, spec, neighbors, compile)
            tree_name = f"{chosen.name} (auto, of {spec.static_tree.name}{origin}; {note})"
        plan = plan_static_tree(chosen or spec.static_tree, device)
        tally.by_node = torch.zeros(plan.spec.num_nodes + 1, dtype=torch.long, device=device)

    sink = BatchSink.allocate(B, N, tally)
    if on_step is not None:
        sink.report = lambda done: on_step(sum(done), B * N, sink.tokens)
    request = BatchRequest(condition, sampling, [generator_for(generator, i) for i in range(B)], neighbors, compile)
    _decode_batch(model, drafter, spec, plan, request, sink)
    synchronize(device)
    stats = tally.to_stats(B, N, time.perf_counter() - start, tree_name)
    stats.drafter_prefix_states = drafter.config.prefix_states
    return GenerationResult(sink.tokens, stats, sink.per_cell, model.config.grid_size)


def eager_tree_runner(model: ImageTransformer, drafter: EagleDrafter, shape: TreeShape, plan: StaticPlan | None,
                      dist: NodeDistributions, state: TreeState) -> StepRunner:
    """An uncached, never captured runner over an existing state (a batch that shrank)."""
    context = TreeContext(model, drafter, shape, plan, dist)
    return StepRunner(lambda windows: tree_iteration(context, state, windows), state)


def tree_runner(model: ImageTransformer, drafter: EagleDrafter, shape: TreeShape, plan: StaticPlan | None,
                dist: NodeDistributions, neighbors: torch.Tensor | None, layout: RunLayout) -> StepRunner:
    """The iteration runner for `shape`: cached, with one CUDA graph per window band, where `layout` uses
    graphs; else fresh eager buffers (the caller releases them)."""
    def build() -> StepRunner:
        state = TreeState.allocate(model, drafter, shape, plan, neighbors)
        context = TreeContext(model, drafter, shape, plan, dist)
        return StepRunner(lambda windows: tree_iteration(context, state, windows), state)

    variants = (lambda: [tree_windows(0, shape, False, whole=True)]) if layout.compiled else (lambda: band_windows(shape))
    return runner(model, ("tree", shape, id(drafter)), build, variants,
                  lambda r, windows: r.buffers.reset_for_warmup(windows.start if windows else 0), layout,
                  model.tok_embeddings.weight.device, also=(drafter,))


def _decode_batch(model: ImageTransformer, drafter: EagleDrafter, spec: SpeculativeConfig, plan: StaticPlan | None,
                  request: BatchRequest, sink: BatchSink) -> None:
    """A batch of G images: eager prefill and first tokens, then a loop of `tree_iteration`s over all of them
    (captured on CUDA) until the last image is done, reading the tokens done of every image once per
    iteration."""
    condition, sampling, generators, neighbors = request.condition, request.sampling, request.generators, request.neighbors
    out, tally = sink.tokens, sink.tally
    config = model.config
    N = config.num_image_tokens
    guided = sampling.uses_cfg
    dist = NodeDistributions(sampling, guided, model.constrain_logits)
    t0 = time.perf_counter()
    prefix = build_prefix(model, condition, guided)
    rows, T = prefix.key_valid.shape
    device = prefix.embeddings.device
    layout = layout_for(request.compile, device)
    shape = TreeShape(rows, slots_for(T, N + spec.cache_spare, layout.slot_bucket), N, sampling,
                      spec.dynamic if plan is None else plan.spec, spec.relaxation)
    step_runner = tree_runner(model, drafter, shape, plan, dist, neighbors, layout)
    state: TreeState = step_runner.buffers
    try:
        state.reset_counters()
        if state.neighbors is not None:
            state.neighbors.copy_(neighbors)
        hidden = prefill(model, prefix, state.cache, state.key_valid)
        first = pick_tokens(dist.combine(model.logits(hidden[:, -1:]), torch.zeros(1, dtype=torch.long, device=device))[:, 0],
                            sampling, generators)  # (G,)
        state.start_image(T, first)
        if not sampling.greedy:  # every iteration's walk uniforms, per image, before the first one
            fill_per_image(state.uniforms, generators)
        state.session.reset(0)
        fed, embeddings = prefix_inputs(drafter, model, prefix.token_ids, first, rows, T)
        features = drafter_features(model, prefix.embeddings, prefix.key_valid, hidden, drafter.config.prefix_states)
        state.session.consume(features, fed, embeddings)  # pairs (f_s, x_{s+1}) over the prefix; the last holds the first token
        progress_tokens(out, state.tokens, state.done)
        tally.prefill_s += time.perf_counter() - t0
        tally.batches += 1
        progress = BatchProgress.start(shape.trees, N)
        sink.report(progress.total)
        reader = DoneReader(state.done, late=not layout.exact)  # captured loops read one iteration late
        lag = shape.depth + 1 if reader.late else 0  # tokens an image may have gained since the counts were read
        while progress.running:
            draw_iteration_noise(state, generators, progress.active)
            step_runner.run(tree_windows(T + progress.furthest_after(lag) - 1, shape, layout.exact, layout.compiled))
            tally.batch_iterations += 1
            progress.update(reader.read(state.done))  # the one host read per iteration
            progress_tokens(out, state.tokens, state.done, progress.index)
            sink.report(progress.total)
            smaller, keep = retire_finished(state, progress, sink, guided) if layout.exact else (None, None)
            if smaller is not None:
                state, shape = smaller, replace(shape, rows=smaller.length.shape[0])
                step_runner = eager_tree_runner(model, drafter, shape, plan, dist, state)
                generators = [generators[g] for g in keep]
        record_images(state, progress, list(range(len(progress.images))), sink)
        tally.add_totals(state)
    finally:
        tally.cache_bytes = max(tally.cache_bytes, state.nbytes)
        if not step_runner.shared:
            state.release()

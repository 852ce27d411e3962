"""What a speculative decoder's batch loop keeps on the host, for the tree and the Jacobi decoders alike: the
request (`BatchRequest`), where results go (`BatchSink`), where each image stands (`BatchProgress`), the run's
counters and the stats made from them (`RunTally`, `SpeculativeStats`), the retiring of finished images on
eager devices, the rows of a batch ([cond G; uncond G] with CFG: `row_list`, `per_row`), and the one host read
per iteration (`DoneReader`).

The one read: a loop needs the image tokens done per image to stop, to pick the next iteration's attention
band and to report progress. Read at once (`Tensor.tolist`), the host waits for the iteration it has just
queued, so the device idles while the host does its bookkeeping and queues the next one. `DoneReader(late=True)`
instead queues a copy of the counts behind each iteration into pinned memory and hands back the copy queued one
iteration earlier: the host then waits for iteration t - 1 while iteration t runs. The loop works on counts one
iteration old, so it bounds the furthest position by one iteration's largest advance
(`BatchProgress.furthest_after`) and runs one spare iteration after the last image is done (images that are
done ride along without effect). Eager loops on the CPU read at once: there a read costs no device time, and an
image that is done can leave the batch. This module keeps books; the iterations themselves are in `trees/` and
`jacobi/`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..conditioning import Condition, Prefix
from ..config import SamplingConfig
from ..models.gpt import ImageTransformer
from .generate import GenerationStats, prefill
from .step_graphs import StepExecution, StepRunner


class DoneReader:
    """`read(done)` after queuing each iteration, `done` the state's (G,) counts: them as a list, or None when a
    late reader has nothing older than the counts the loop started from. A late reader's batch never shrinks."""

    def __init__(self, done: torch.Tensor, late: bool) -> None:
        self.late = late
        self.turn = 0
        if late:
            pinned = done.device.type == "cuda"
            self.slots = [torch.empty(done.shape, dtype=done.dtype, pin_memory=pinned) for _ in range(2)]
            self.events: list = [None, None]

    def read(self, done: torch.Tensor) -> list[int] | None:
        if not self.late:
            return done.tolist()
        mine, older = self.turn % 2, (self.turn + 1) % 2
        self.slots[mine].copy_(done, non_blocking=True)
        if done.device.type == "cuda":  # behind the copy on the counts' own device (not the current one)
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(done.device))
            self.events[mine] = event
        self.turn += 1
        if self.turn == 1:
            return None
        if self.events[older] is not None:
            self.events[older].synchronize()
        return self.slots[older].tolist()


def row_list(images: list[int], count: int, guided: bool) -> list[int]:
    """Batch rows of images `images` out of `count` ([cond count; uncond count] when `guided`)."""
    return list(images) + ([count + g for g in images] if guided else [])



def per_row(x: torch.Tensor, rows: int) -> torch.Tensor:
    """Per-tree tensor (G, ...) -> per-row (rows, ...): rows are [cond trees; uncond trees] with CFG."""
    return x.repeat(rows // x.shape[0], *([1] * (x.dim() - 1)))


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
    drafter_prefix_states: str = ""  # the drafter's prefix convention (`trees/prefix_states.py`): native or hf_port
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
        text = (self.speed_text() + f"; {self.tree}; {self.iterations} verifications, acceptance by depth [{depth}], "
                f"TVD spent mean {self.mean_absorbed:.3f} max {self.max_absorbed:.3f}")
        if self.row_commits:
            share = 100 * sum(self.row_commits) / max(self.batch * self.image_tokens, 1)
            text += f"; {share:.0f}% of tokens committed by lower rows (relaxed 2-D, not lossless)"
        if self.batch > 1:
            lengths = " ".join(f"{p['mean_accepted_length']:.2f}" for p in self.per_image)
            text += f"; batch of {self.batch} in {self.batch_forwards} forwards, accepted length per image [{lengths}]"
        return text + self.fallback_text()


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
    steps: StepExecution = StepExecution()  # how the iterations ran, over every runner and batch of the run

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
            row_commits=[] if self.row_commits is None else self.row_commits.tolist(), steps=self.steps)

    def add_steps(self, runner: StepRunner) -> None:
        """Fold how `runner`'s steps of this run went (replayed or eager, compiled or not) in: called when a batch
        loop is done with a runner (it switched to a smaller eager one, or the batch ended)."""
        self.steps = self.steps.merged(runner.execution())

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


def prefill_state(model: ImageTransformer, prefix: Prefix, state, neighbors: torch.Tensor | None) -> torch.Tensor:
    """Start a batch state (a `TreeState` or `JacobiState`): zero its run counters, load the neighbour table a
    relaxed rule reads, prefill its cache with `prefix`. Returns the prefill's hidden states (rows, T, dim)."""
    state.reset_counters()
    if state.neighbors is not None:
        state.neighbors.copy_(neighbors)
    return prefill(model, prefix, state.cache, state.key_valid)


def record_batch(state, progress: BatchProgress, sink: BatchSink) -> None:
    """At the end of a batch loop: the heat maps and counters of every image still in the state, and the state's
    run totals, into the sink."""
    record_images(state, progress, list(range(len(progress.images))), sink)
    sink.tally.add_totals(state)


def release_state(state, tally: RunTally, shared: bool) -> None:
    """Count a batch state's cache in the tally and free it, unless a kept runner owns it (`shared`)."""
    tally.cache_bytes = max(tally.cache_bytes, state.nbytes)
    if not shared:
        state.release()

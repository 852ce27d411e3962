"""The device state of a batch of Jacobi decodes, allocated once per shape so a CUDA graph can replay it:
cache, drafts and their laws, kept predictions, noise tables, counters (`JacobiState`, `RowState` for the
lower-row windows, the proactive leaves' buffers), and `JacobiContext`: the model, the shape and the target's
law (CFG, constraint and filters) an iteration computes with.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...models.gpt import ImageTransformer
from ...models.kv_cache import KVCache, keep_rows
from ..batching import row_list
from .proactive import LeafBuffers
from .shape import JacobiShape


@dataclass
class RowState:
    """What `row_commit` adds to a Jacobi state: which cells are committed, the lower drafts' laws, and which
    lower-row keys hold a committed token."""

    fixed: torch.Tensor  # (G, padded) bool committed cells (the frontier's emitted ones and the lower rows')
    q: torch.Tensor  # (G, (R-1) w, V) the law each lower draft was drawn from
    proposed: torch.Tensor  # (G, (R-1) w) bool drawn from the model's own prediction (relaxable)
    ahead_ok: torch.Tensor  # (rows, slots) bool keys past the frontier that hold a committed token
    commits: torch.Tensor  # (R-1,) long tokens committed by each lower window (run total)

    @classmethod
    def allocate(cls, shape: JacobiShape, vocab: int, padded: int, device: torch.device) -> "RowState":
        G, D = shape.images, shape.lower * shape.config.row_window
        return cls(fixed=torch.zeros(G, padded, dtype=torch.bool, device=device),
                   q=torch.full((G, D, vocab), 1.0 / vocab, device=device),
                   proposed=torch.zeros(G, D, dtype=torch.bool, device=device),
                   ahead_ok=torch.zeros(shape.rows, shape.slots, dtype=torch.bool, device=device),
                   commits=torch.zeros(shape.lower, dtype=torch.long, device=device))

    def start_image(self) -> None:
        self.fixed.zero_()
        self.fixed[:, 0] = True  # the first token, drawn after the prefill
        self.ahead_ok.zero_()

    def select(self, images: list[int], keep: torch.Tensor, rows: torch.Tensor) -> "RowState":
        """Images `images` (`keep` on the device; their batch rows `rows`) only; the laws compacted in place."""
        return RowState(self.fixed.index_select(0, keep), keep_rows(self.q, images),
                        self.proposed.index_select(0, keep), self.ahead_ok.index_select(0, rows), self.commits)


@dataclass
class JacobiState:
    """The static tensors of one Jacobi run shape (G images), allocated once and reused across batches."""

    cache: KVCache  # (L, rows, H_kv, slots, D)
    key_valid: torch.Tensor  # (rows, slots) bool
    length: torch.Tensor  # (rows,) long committed slots per row
    done: torch.Tensor  # (G,) long image tokens emitted
    canvas: torch.Tensor  # (G, N + 2H + 2) long: emitted tokens, then the current drafts (H: horizon)
    per_cell: torch.Tensor  # (G, N + 2H + 2) int32
    drafts: torch.Tensor  # (G, W) long the frontier's drafts
    q: torch.Tensor  # (G, W, V) the distribution each frontier draft was drawn from
    proposed: torch.Tensor  # (G, W) bool: drawn from the model's own prediction (relaxable)
    ahead: torch.Tensor  # (G, H + 1, V) a ring: the latest prediction for position P in row P mod H (H: discards)
    held: torch.Tensor  # (G, H + 1) long the position whose prediction each row holds (-1: none)
    last_p: torch.Tensor  # (G, V) the last frontier row's prediction (sample_left's law)
    drawn: torch.Tensor | None  # continuation: (G, H + 1, V) ring of the law each position's current draft came from
    drawn_at: torch.Tensor | None  # continuation: (G, H + 1) long the position each `drawn` row is for (-1: none)
    uniforms: torch.Tensor  # (G, N, noise_width) per image, row t: iteration t's draft then judge (W + 1) uniforms
    # (one row under the AR-identical rule, which draws none)
    iteration: torch.Tensor  # (G,) long iterations each image has taken (its row of `uniforms`)
    uniform_q: torch.Tensor  # (drafts, V) 1 / V, the random initialisation's law
    gumbel: torch.Tensor | None  # (G, N + H, V) per-position noise of coupled drafts and proactive leaves, per image
    neighbors: torch.Tensor | None
    histogram: torch.Tensor  # (G, W + 1) long iterations by drafts accepted, per image
    absorbed: torch.Tensor  # (2,) relaxed / grouped mass: sum and max over accepted drafts
    relaxed: torch.Tensor  # () long
    rows: "RowState | None" = None  # row_commit only
    tree: LeafBuffers | None = None  # proactive drafting only
    forwards_per_iteration: int = 0  # drafter forwards (none)

    @classmethod
    def allocate(cls, model: ImageTransformer, shape: JacobiShape, neighbors: torch.Tensor | None) -> "JacobiState":
        device = model.tok_embeddings.weight.device
        N, V, W, G = shape.image_tokens, model.config.vocab_size, shape.window, shape.images
        H = shape.horizon
        shape.far_starts  # noqa: B018 -- cached here, never first inside a compiled iteration (its lock)
        long = dict(dtype=torch.long, device=device)
        noisy = (shape.config.coupled or shape.leaves > 0 or shape.same_as_ar) and not shape.sampling.greedy  # Gumbel
        # drafts or leaves (AR's own noise when judged by AR's draws)
        padded = N + 2 * H + 2 + shape.queries  # row_commit parks idle lanes' drafts past N + 2H
        return cls(
            cache=model.allocate_cache(shape.rows, shape.slots),
            key_valid=torch.ones(shape.rows, shape.slots, dtype=torch.bool, device=device),
            length=torch.zeros(shape.rows, **long), done=torch.ones(G, **long), canvas=torch.zeros(G, padded, **long),
            per_cell=torch.ones(G, padded, dtype=torch.int32, device=device), drafts=torch.zeros(G, W, **long),
            q=torch.full((G, W, V), 1.0 / V, device=device),
            proposed=torch.zeros(G, W, dtype=torch.bool, device=device),
            ahead=torch.full((G, H + 1, V), 1.0 / V, device=device),
            held=torch.full((G, H + 1), -1, **long),
            last_p=torch.full((G, V), 1.0 / V, device=device),
            drawn=torch.full((G, H + 1, V), 1.0 / V, device=device) if shape.continues else None,
            drawn_at=torch.full((G, H + 1), -1, **long) if shape.continues else None,
            uniforms=torch.full((G, 1 if shape.same_as_ar else N, shape.noise_width), 0.5, device=device),
            iteration=torch.zeros(G, **long), uniform_q=torch.full((shape.drafts, V), 1.0 / V, device=device),
            gumbel=torch.zeros(G, N + H, V, device=device) if noisy else None,
            neighbors=None if neighbors is None else torch.zeros_like(neighbors),
            histogram=torch.zeros(G, W + 1, **long), absorbed=torch.zeros(2, device=device),
            relaxed=torch.zeros((), **long),
            rows=RowState.allocate(shape, V, padded, device) if shape.row_commit else None,
            tree=LeafBuffers.allocate(shape, G, device) if shape.leaves else None)

    def reset_counters(self) -> None:
        for t in (self.histogram, self.absorbed, self.relaxed):
            t.zero_()
        if self.rows is not None:
            self.rows.commits.zero_()

    def start_image(self, prefix_len: int, first: torch.Tensor, first_p: torch.Tensor) -> None:
        """After the prefill and the first tokens `first` (G,): the first refill initialises all W positions (no
        carried rows) and `sample_left` draws them from the first predictions `first_p` (G, V)."""
        self.canvas.zero_()
        self.canvas[:, 0] = first.reshape(-1)
        self.per_cell.fill_(1)
        self.length.fill_(prefix_len)
        self.done.fill_(1)
        self.held.fill_(-1)
        if self.drawn_at is not None:
            self.drawn_at.fill_(-1)
        self.iteration.zero_()
        self.last_p.copy_(first_p)
        if self.rows is not None:
            self.rows.start_image()

    def reset_for_warmup(self, start: int) -> None:
        self.start_image(start, torch.zeros_like(self.done), self.last_p.clone())

    def select(self, images: list[int], guided: bool) -> "JacobiState":
        """The state of images `images` (ascending) only (their cache rows, windows, noise and counters; the
        run totals carried over): a smaller batch for devices that run eagerly (see `TreeState.select`). Every
        per-image buffer is compacted in place (`kv_cache.keep_rows`): this state must not be used after."""
        G, device = self.done.shape[0], self.done.device
        keep = torch.tensor(images, dtype=torch.long, device=device)
        row_ids = row_list(images, G, guided)
        rows = torch.tensor(row_ids, dtype=torch.long, device=device)
        pick = lambda t: None if t is None else keep_rows(t, images)  # noqa: E731
        return JacobiState(
            cache=self.cache.keep_rows(row_ids), key_valid=self.key_valid.index_select(0, rows),
            length=self.length.index_select(0, rows), done=pick(self.done), canvas=pick(self.canvas),
            per_cell=pick(self.per_cell), drafts=pick(self.drafts), q=pick(self.q), proposed=pick(self.proposed),
            ahead=pick(self.ahead), held=pick(self.held), last_p=pick(self.last_p), drawn=pick(self.drawn),
            drawn_at=pick(self.drawn_at), uniforms=pick(self.uniforms), iteration=pick(self.iteration),
            uniform_q=self.uniform_q, gumbel=pick(self.gumbel), neighbors=self.neighbors,
            histogram=pick(self.histogram), absorbed=self.absorbed, relaxed=self.relaxed,
            rows=None if self.rows is None else self.rows.select(images, keep, rows),
            tree=None if self.tree is None else self.tree.select(keep))

    def release(self) -> None:
        self.cache.release()

    @property
    def nbytes(self) -> int:
        return self.cache.nbytes


@dataclass
class JacobiContext:
    model: ImageTransformer
    shape: JacobiShape
    dist: Any  # speculative.NodeDistributions of the run

    def filtered(self, logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """(rows, n, V) logits -> (G, n, V) the filtered logits AR races (`sampling.race`); `target` is their
        softmax for a sampled run."""
        return self.dist.filtered(logits, index)

    def target(self, logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """(rows, n, V) logits, image-token indices (n,) or (G, n) -> (G, n, V) what the sampler samples from
        (softmax of the CFG mix when greedy)."""
        if self.shape.sampling.greedy:
            return self.dist.combine(logits, index).softmax(-1)
        return self.dist(logits, index)

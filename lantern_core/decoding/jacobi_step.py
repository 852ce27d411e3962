"""The static-shape Jacobi iteration (SJD, coupled SJD, relaxed Jacobi, 2-D drafting): refill the draft
windows, verify them in one target forward, judge the frontier's leading run, emit, with every value that
changes between iterations held in device tensors.

One iteration = the Jacobi update of the kept predictions plus the initialisation of the positions entering
a window (`refill`), one forward over the last emitted token and the W drafts, the acceptance tests of every
position at once and the leading run (`judge_run`), and the emission of the accepted drafts plus one token.
2-D drafting (`JacobiConfig.rows` > 1) adds, in the same forward, a window on each of the next image rows at
fixed offsets past the frontier: its queries read the tokens before their positions (raster-causal, or
row-causal: the committed tokens and their own window) and only propose. `keep_predictions` keeps the newest
prediction of every position ahead in a ring (position mod horizon), so a position the frontier reaches is
re-drawn from what a lower window last predicted for it; acceptance stays the frontier's exact rule on the law
each draft was drawn from. With one row this is 1-D Jacobi, draw for draw. Near the end of the image the
active width w = min(W, N - done) is a device value: drafts past it are never accepted, so the shapes stay
those of `JacobiShape`. Randomness is drawn once per image before its first iteration
(`sampling.fill_per_image`, outside any captured region): a table with one row of uniforms per iteration an
image can take (each advances at least one token), picked by the image's own iteration counter, so no
iteration launches a generator call and no draw depends on a verdict the host would have to read. Every
tensor carries the G images of a batch: each image has its own window position, drafts, width and verdict,
and advances on its own in the static KV cache; an image that is done keeps running (static shapes) with its
length frozen and nothing kept or counted. The decode loop, prefill, window choice and the rules'
documentation live in `jacobi.py`.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from ..config import SamplingConfig
from ..models.gpt import ForwardStep, ImageTransformer
from ..models.kv_cache import KVCache, attention_mask, keep_rows
from .acceptance import absorbed_set, normalise
from .drafting import per_row, row_list
from .jacobi_proactive import LeafBuffers, draw_leaves, judge_with_leaves, move_leaf_key
from .jacobi_rows import RowLanes, raster_mask, row_lanes
from .relaxation import group_mass, relax
from .sampling import sample_from_probs
from .step_graphs import SLOT_BUCKET, band_starts, band_window
from .tree_attention import window_mask

DRAWN_INITS = ("random", "sample_left")  # initialisations that draw fresh tokens (the repeat ones copy)


@dataclass(frozen=True)
class JacobiShape:
    """What fixes an iteration's shapes and code: rows (G images, [cond G; uncond G] with CFG), cache slots,
    image tokens, the sampling settings, and the `JacobiConfig` (with an integer window) whose rule it bakes
    in."""

    rows: int
    slots: int
    image_tokens: int
    sampling: SamplingConfig
    config: Any  # jacobi.JacobiConfig with an int window
    stride: int = 0  # tokens per image row (the model's row stride); needed when config.rows > 1

    @property
    def window(self) -> int:
        return self.config.window

    @cached_property
    def far_starts(self) -> tuple[int, ...]:
        """Offsets past the frontier where the lower rows' windows start (empty for 1-D Jacobi)."""
        if self.config.rows == 1 or self.config.row_commit:  # row fronts move on their own (`jacobi_rows.py`)
            return ()
        return self.config.far_starts(self.window, self.stride)

    @property
    def lower(self) -> int:
        """Lower-row windows per image (rows - 1)."""
        return self.config.rows - 1

    @property
    def row_commit(self) -> bool:
        return self.config.row_commit and self.lower > 0

    @property
    def drafts(self) -> int:
        """Drafts per image per iteration: the frontier's W and every lower-row window's."""
        return self.window + self.lower * self.config.row_window

    @property
    def tree_depth(self) -> int:
        """Positions past the frontier with proactive candidates (0: proactive drafting off)."""
        return self.config.tree_depth(self.window)

    @property
    def leaves(self) -> int:
        """Proactive drafting's extra candidates per image per forward (`jacobi_proactive.py`)."""
        return self.config.leaves(self.window)

    @property
    def queries(self) -> int:
        """Tokens one forward feeds per image: the last emitted token, the W frontier drafts, each lower
        window's left neighbour and its drafts but the last (a query predicts the next position), and the
        proactive leaves."""
        return self.window + 1 + self.lower * self.config.row_window + self.leaves

    @property
    def horizon(self) -> int:
        """Positions past the frontier whose latest prediction is kept (offsets 0 .. horizon - 1)."""
        if self.row_commit:  # a lower lane predicts at most rows x stride - 1 past the frontier
            return max(self.window + 1, self.config.rows * self.stride)
        far = [start + self.config.row_window for start in self.far_starts]
        return max([self.window + 1, *far])

    @property
    def extent(self) -> int:
        """Cache slots one forward writes past the committed length: its queries' (contiguous), or with
        `row_commit` up to the furthest raster slot a lower lane writes."""
        return self.horizon + 1 if self.row_commit else self.queries

    @property
    def draft_noise(self) -> int:
        """Uniforms one refill consumes: one per draft, and with continuation one more per draft (the test
        whether the current draft is kept)."""
        return self.drafts * (2 if self.config.continuation else 1)

    @property
    def noise_width(self) -> int:
        """Uniforms one iteration consumes: the refill's, the judge's W + 1, then with `row_commit` one per
        lower-row draft (its acceptance test), or one per proactive leaf (its test)."""
        lower = self.lower * self.config.row_window if self.row_commit else 0
        return self.draft_noise + self.window + 1 + lower + self.leaves

    @property
    def images(self) -> int:
        """G: images decoded together."""
        return self.rows // 2 if self.sampling.uses_cfg else self.rows


def jacobi_window(length: int, shape: JacobiShape, exact: bool, whole: bool = False) -> tuple[int, int]:
    """(band start, keys) for the forward at committed `length`: exactly length + W + 1 keys (devices that never
    capture), the whole cache (`whole`: one variant for an Inductor-compiled iteration), or rounded so one value
    serves every length of a `SLOT_BUCKET`-wide band; the start is where a capture of that band warms up."""
    extent = shape.extent
    if exact:
        return length, length + extent
    if whole:
        return 0, shape.slots
    return length // SLOT_BUCKET * SLOT_BUCKET, band_window(length, extent, shape.slots)


def jacobi_bands(shape: JacobiShape) -> list[tuple[int, int]]:
    """Every bucketed variant a cache of `shape.slots` slots can use (one captured graph each)."""
    return [jacobi_window(start, shape, exact=False) for start in band_starts(shape.slots - shape.queries)]


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
        noisy = (shape.config.coupled or shape.leaves > 0) and not shape.sampling.greedy  # Gumbel-drawn drafts or leaves
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
            drawn=torch.full((G, H + 1, V), 1.0 / V, device=device) if shape.config.continuation else None,
            drawn_at=torch.full((G, H + 1), -1, **long) if shape.config.continuation else None,
            uniforms=torch.full((G, N, shape.noise_width), 0.5, device=device),
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

    def target(self, logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """(rows, n, V) logits, image-token indices (n,) or (G, n) -> (G, n, V) what the sampler samples from
        (softmax of the CFG mix when greedy)."""
        if self.shape.sampling.greedy:
            return self.dist.combine(logits, index).softmax(-1)
        return self.dist(logits, index)


def _draw(shape: JacobiShape, state: JacobiState, probs: torch.Tensor, positions: torch.Tensor,
          uniforms: torch.Tensor, ring: torch.Tensor) -> torch.Tensor:
    """One token per row of probs (G, D, V): argmax when greedy, Gumbel-max with the positions' (G, D) noise
    when coupled, else inverse-CDF sampling with the refill's uniforms (G, D) (row j uses uniform j). With
    continuation (SJD-PAC's adaptive continuation, as a maximal coupling) the position's current draft x, drawn
    from a recorded law q, is kept with probability min(1, p(x) / q(x)) (the second half of `uniforms`) and
    otherwise replaced by a draw from normalise(max(0, p - q)): either way the new draft is distributed as p."""
    if shape.sampling.greedy:
        return probs.argmax(-1)
    if shape.config.coupled and state.gumbel is not None:
        return (probs.clamp(min=0).log() + position_noise(state, positions)).argmax(-1)
    G, D, V = probs.shape
    if state.drawn is None:
        return sample_from_probs(probs.reshape(G * D, V), uniforms.reshape(-1)).view(G, D)
    current = state.canvas.gather(1, positions)  # (G, D) each position's draft now
    had = state.drawn_at.gather(1, ring) == positions  # (G, D) its law is recorded
    law = state.drawn.gather(1, ring[..., None].expand(-1, -1, V))  # (G, D, V)
    p_x = probs.gather(2, current[..., None])[..., 0]
    q_x = law.gather(2, current[..., None])[..., 0]
    keep = had & (uniforms[:, D:] * q_x < p_x)  # u < p(x) / q(x) without dividing
    source = torch.where(had[..., None], normalise((probs - law).clamp(min=0), probs), probs)
    fresh = sample_from_probs(source.reshape(G * D, V), uniforms[:, :D].reshape(-1)).view(G, D)
    return torch.where(keep, current, fresh)


def position_noise(state: JacobiState, positions: torch.Tensor) -> torch.Tensor:
    """(G, D, V) the per-image Gumbel rows of image positions (G, D) (past the table: its last row)."""
    V = state.gumbel.shape[-1]
    return state.gumbel.gather(1, positions.clamp(max=state.gumbel.shape[1] - 1)[..., None].expand(-1, -1, V))


def draft_offsets(shape: JacobiShape, device: torch.device) -> torch.Tensor:
    """(drafts,) offsets past the frontier of every draft: the frontier's 0 .. W-1, then each lower-row
    window's, row by row."""
    return _offsets(shape, device, shape.window)


def query_offsets(shape: JacobiShape, device: torch.device) -> torch.Tensor:
    """(queries,) the offset each query predicts: query i reads the token at offset i - 1 (the frontier's
    first reads the last emitted token) and predicts offset i; the frontier's W + 1, then the lower windows'."""
    return _offsets(shape, device, shape.window + 1)


def _offsets(shape: JacobiShape, device: torch.device, frontier: int) -> torch.Tensor:
    """0 .. frontier - 1, then offset j x (row stride + row_offset) + c of every lower window j, column c."""
    ahead = torch.arange(frontier, device=device)
    if not shape.far_starts:
        return ahead
    step = shape.stride + shape.config.column_offset
    rows = torch.arange(1, len(shape.far_starts) + 1, device=device)
    cols = torch.arange(shape.config.row_window, device=device)
    return torch.cat([ahead, (rows[:, None] * step + cols[None]).reshape(-1)])  # (R-1, w) -> flat


def query_blocks(shape: JacobiShape, device: torch.device) -> torch.Tensor:
    """(queries,) the window each query belongs to: 0 for the frontier's, j for row j's; with `row_causal` a
    lower window's queries see the committed tokens and their own window only (they propose, nothing more)."""
    frontier = torch.zeros(shape.window + 1, dtype=torch.long, device=device)
    if not shape.lower:
        return frontier
    rows = torch.arange(1, shape.lower + 1, device=device)
    far = rows[:, None].expand(-1, shape.config.row_window).reshape(-1)  # x w -> flat
    return torch.cat([frontier, far])


def refill(ctx: JacobiContext, state: JacobiState, uniforms: torch.Tensor, lanes: RowLanes | None = None) -> None:
    """New drafts at every draft offset of every image (the frontier's W, then the lower rows' windows, at
    fixed offsets or, with `lanes`, at the rows' own fronts): where a prediction for the position is kept
    (`known`: the last forward's, or an earlier lower window's) the draft is re-drawn from it (the Jacobi
    update), elsewhere initialised per `config.init`; a committed cell keeps its token. Row j of a sampled
    draw uses uniforms[:, j] (G, drafts). The frontier's drafts and their laws go to `drafts`, `q` and
    `proposed`, the row fronts' to `state.rows`; every draft to the canvas."""
    shape = ctx.shape
    W, init, grid = shape.window, shape.config.init, ctx.model.config.row_stride
    G, V = state.drafts.shape[0], state.ahead.shape[-1]
    H = state.ahead.shape[1] - 1
    if lanes is None:
        positions = state.done[:, None] + draft_offsets(shape, state.canvas.device)  # (G, D) image positions
        ring = positions % H  # (G, D) where a kept prediction for each position would be
    else:  # row fronts: idle lanes keep their predictions in the discard row H
        positions = torch.cat([lanes.cells[:, :W], lanes.positions], 1)
        inside = torch.arange(W, device=positions.device) < lanes.front_width[:, None]
        ring = torch.cat([torch.where(inside, positions[:, :W] % H, H), torch.where(lanes.real, lanes.positions % H, H)], 1)
    D = positions.shape[1]
    known = state.held.gather(1, ring) == positions  # (G, D)
    p_known = state.ahead.gather(1, ring[..., None].expand(-1, -1, V))  # (G, D, V) the kept prediction per draft
    if init in DRAWN_INITS:
        fresh_q = state.uniform_q[None] if init == "random" else state.last_p[:, None].expand(-1, D, -1)
        q = torch.where(known[..., None], p_known, fresh_q)
        tokens = _draw(shape, state, q, positions, uniforms, ring)
    else:  # repeat_left / repeat_above: copy an earlier token (re-drawn ones written first)
        moved = _draw(shape, state, p_known, positions, uniforms, ring)
        state.canvas.scatter_(1, positions, torch.where(known, moved, state.canvas.gather(1, positions)))
        fresh = torch.zeros_like(state.canvas, dtype=torch.bool).scatter_(1, positions, ~known)  # initialised now
        source = positions
        for _ in range(D):  # follow copies of copies back to a position not initialised now (fixed trip)
            if init == "repeat_above":
                earlier = torch.where(source < grid, source - 1, source - grid)
            else:
                earlier = source - 1
            source = torch.where(fresh.gather(1, source.clamp(min=0)), earlier, source)
        tokens = torch.where(known, moved, state.canvas.gather(1, source.clamp(min=0)))
        point = torch.zeros_like(p_known).scatter_(2, tokens[..., None], 1.0)  # point masses (one_hot would sync on CUDA)
        q = torch.where(known[..., None], p_known, point)
    if state.rows is not None:  # committed cells keep their tokens (the frontier passes over them)
        tokens = torch.where(state.rows.fixed.gather(1, positions), state.canvas.gather(1, positions), tokens)
    state.canvas.scatter_(1, positions, tokens)
    if state.drawn is not None:  # continuation: the law of each draft now in the canvas
        state.drawn.scatter_(1, ring[..., None].expand(-1, -1, V), q.expand(G, D, V))
        state.drawn_at.scatter_(1, ring, positions)
    if state.tree is not None:  # proactive drafting: K - 1 more candidates from the first positions' laws
        Dp = shape.tree_depth
        noise = None if state.gumbel is None else position_noise(state, positions[:, :Dp])
        state.tree.leaves.copy_(draw_leaves(shape, q[:, :Dp].expand(G, Dp, V), tokens[:, :Dp], noise))
    state.drafts.copy_(tokens[:, :W])
    state.q.copy_(q[:, :W].expand(G, W, V))
    state.proposed.copy_(known[:, :W])
    if state.rows is not None:
        state.rows.q.copy_(q[:, W:].expand(G, D - W, V))
        state.rows.proposed.copy_(known[:, W:])


def keep_predictions(shape: JacobiShape, state: JacobiState, p: torch.Tensor, positions: torch.Tensor,
                     width: torch.Tensor, row: torch.Tensor | None = None) -> None:
    """Keep this forward's predictions, p (G, queries, V) row i predicting `positions`[:, i] (done +
    `query_offsets`[i]), each in its ring row, position mod horizon, so the newest prediction of a position
    replaces an older one. The forward's positions span less than a horizon, so no two share a row, and a
    row left holding a position the frontier has passed (the emitted ones among them) is never read again:
    `refill` reads a row only where it holds the very position it drafts. Predictions past the image are kept
    too (the drafts they feed are never judged and sit after every image position). The last frontier row's
    (position done + `width`) becomes sample_left's law. `row` (G, Q) overrides the ring rows (row fronts
    send their idle lanes to the discard row H)."""
    H, V = state.ahead.shape[1] - 1, state.ahead.shape[-1]
    row = positions % H if row is None else row  # (G, Q)
    if row is None and shape.far_starts and shape.far_starts[0] == shape.window:  # the frontier's last row and the first lower
        # window's first both predict offset W: the lower window's prediction is kept, the other discarded
        row = torch.where(torch.arange(positions.shape[1], device=p.device) == shape.window, H, row)
    state.ahead.scatter_(1, row[..., None].expand(-1, -1, V), p)
    state.held.scatter_(1, row, positions)
    state.last_p.copy_(p.gather(1, width[:, None, None].expand(-1, 1, V))[:, 0])


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Where a rejected draft's position is resampled from: normalise(max(0, p - q)) (p if that is empty)."""
    return normalise((p - q).clamp(min=0), p)


@dataclass
class StaticVerdict:
    accepted: torch.Tensor  # (G,) long leading drafts accepted (<= the active width)
    token: torch.Tensor  # (G,) the token after them
    gain: torch.Tensor  # (G, W) relaxed / grouped mass each accepted draft used, 0 elsewhere


def judge_run(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, uniforms: torch.Tensor | None,
              width: torch.Tensor, config, neighbors: torch.Tensor | None, relaxable: torch.Tensor | None = None,
              greedy: bool = False, forced: torch.Tensor | None = None, with_token: bool = True) -> StaticVerdict:
    """For G windows: p (G, W+1, V) target at each window position, q (G, W, V) the drafts' distributions,
    drafts (G, W), uniforms (G, >= width+1): the acceptance tests of every position at once, drafts past
    `width` ((G,) long) never accepted, then the leading run and the token after it: the residual
    max(0, p - q) at a rejection (with LANTERN's absorbed set carved out of q), p itself after the whole run.
    Relaxed / grouped rules apply where `relaxable` (G, W) is True (default everywhere); other positions are
    judged exactly; `forced` (G, W) positions (already committed) pass. Without `with_token` (p then may hold
    W rows) no token is drawn: `token` is the run itself. No host read."""
    G, W = drafts.shape
    V = p.shape[-1]
    device = p.device
    cols = torch.arange(W, device=device)
    flat_p, flat_q, flat_x = p[:, :W].reshape(G * W, V), q.reshape(G * W, V), drafts.reshape(-1)  # (G*W, ...)
    gain = torch.zeros(G, W, dtype=p.dtype, device=device)
    count = None
    if greedy:
        ok = drafts == p[:, :W].argmax(-1)
    else:
        target = flat_p.gather(1, flat_x[:, None]).view(G, W)
        draft = flat_q.gather(1, flat_x[:, None]).view(G, W)
        if relaxable is None:
            relaxable = torch.ones(G, W, dtype=torch.bool, device=device)
        if config.relaxation is not None:
            mass = relax(flat_p, flat_x, neighbors, config.relaxation)
            count = torch.where(relaxable, mass.count.view(G, W), torch.zeros_like(drafts))
            gain = torch.where(relaxable, mass.absorbed.view(G, W), gain)
            target = target + gain
        elif config.grouping is not None:
            group = group_mass(flat_p, flat_q, flat_x, neighbors, config.grouping)
            exact_target = target
            target = torch.where(relaxable, group.target.view(G, W), target)
            draft = torch.where(relaxable, group.draft.view(G, W), draft)
            gain = target - exact_target
        ok = uniforms[:, :W] * draft < target  # u < target / draft without dividing (draft > 0 for a drawn token)
    if forced is not None:
        ok = ok | forced
    ok = ok & (cols < width[:, None])
    a = ok.long().cumprod(1).sum(1)  # (G,) the leading run
    if not with_token:
        return StaticVerdict(a, a, torch.where(cols < a[:, None], gain, torch.zeros_like(gain)))
    p_a = p.gather(1, a[:, None, None].expand(-1, 1, V))[:, 0]  # (G, V)
    if greedy:
        token = p_a.argmax(-1)
    else:
        at = a.clamp(max=W - 1)[:, None]  # (G, 1)
        q_row = q.gather(1, at[..., None].expand(-1, 1, V))[:, 0]  # (G, V)
        if count is not None and config.relaxation.k > 0:  # LANTERN: the absorbed set leaves q, as in the tree walk
            q_row = q_row.masked_fill(absorbed_set(drafts.gather(1, at)[:, 0], count.gather(1, at)[:, 0], neighbors,
                                                   config.relaxation.k, V), 0.0)
        probs = torch.where((a < width)[:, None], residual_distribution(p_a, q_row), p_a)
        token = sample_from_probs(probs, uniforms.gather(1, width.clamp(min=0)[:, None])[:, 0])
    return StaticVerdict(a, token, torch.where(cols < a[:, None], gain, torch.zeros_like(gain)))


def forward_window(model: ImageTransformer, state, feed: torch.Tensor, window: int | None = None,
                   offsets: torch.Tensor | None = None, blocks: torch.Tensor | None = None,
                   visible: torch.Tensor | None = None) -> torch.Tensor:
    """Feed tokens (n,) at the committed length of `state` (anything with `cache`, `key_valid` and an int or
    () device `length`), or per image (G, n) at per-row lengths (rows,); written, not committed, in the n
    slots past the committed length. Attends over `window` slots (default length + n, exact). Query i sits
    at position length + offsets[i] (default i) and, with `blocks` (n,) window ids, sees the committed keys
    and the earlier keys of its own window only; with `visible` (n, n) (per-row lengths only) the committed
    keys and the scratch keys its row marks (a tree's ancestry); by default every earlier key (causal).
    Returns logits (rows, n, V)."""
    rows, n = state.key_valid.shape[0], feed.shape[-1]
    window = state.length + n if window is None else window
    lanes = torch.arange(n, device=feed.device)
    if feed.dim() == 2:  # per image, per-row lengths
        slots = state.length[:, None] + lanes  # (rows, n)
        inputs = per_row(feed, rows)
    else:
        slots = state.length + lanes  # (n,)
        inputs = feed[None].expand(rows, -1)
    if visible is not None:
        mask = window_mask(state.key_valid, state.length, visible, window)  # (rows, 1, n, window)
    else:
        mask = attention_mask(state.key_valid, slots, window)  # (rows, 1, n, window)
    positions = slots
    if offsets is not None:
        positions = slots - lanes + offsets
    if blocks is not None:
        keys = torch.arange(window, device=feed.device)
        start = slots[..., :1] if slots.dim() == 2 else slots[:1]  # the first scratch slot (rows, 1) or (1,)
        scratch = keys - start  # (rows | 1, window): which window's slot each key is, where >= 0
        key_block = blocks.gather(0, scratch.clamp(min=0, max=n - 1).reshape(-1)).view(scratch.shape)
        same = (scratch < 0)[..., None, :] | (key_block[..., None, :] == blocks[:, None])  # (rows | 1, n, window)
        mask = mask & (same[:, None] if same.dim() == 3 else same[None, None])
    step = ForwardStep(positions.clamp(max=model.rope_table.shape[0] - 1), state.cache, kv_len=window,
                       mask=mask, slots=slots)
    return model.logits(model(model.embed_tokens(inputs), step))


def forward_at_slots(model: ImageTransformer, cache: KVCache, inputs: torch.Tensor, slots: torch.Tensor,
                     mask: torch.Tensor, window: int, one_image: bool) -> torch.Tensor:
    """Tokens (rows, n) written at cache `slots` (rows, n), each at the RoPE position of its slot, attending
    over `window` slots through `mask` (rows, 1, n, window): logits (rows, n, V). `one_image`: every row is
    the same image's (its CFG rows), so the rows share their slots and one index_copy per layer writes them."""
    if one_image:
        slots = slots[0]
    step = ForwardStep(slots.clamp(max=model.rope_table.shape[0] - 1), cache, kv_len=window, mask=mask, slots=slots)
    return model.logits(model(model.embed_tokens(inputs), step))


def jacobi_iteration(ctx: JacobiContext, state: JacobiState, window: int) -> None:
    """Refill every image's drafts, verify [last token; drafts] of all images in one forward attending over
    `window` cache slots, judge and emit; images already done advance nothing. Shapes depend on `ctx.shape`
    and `window` only; nothing reads the host."""
    if ctx.shape.row_commit:
        return _row_front_iteration(ctx, state, window)
    shape, model = ctx.shape, ctx.model
    W, N = shape.window, shape.image_tokens
    done = state.done
    active = done < N  # (G,) images still decoding before this iteration
    D = shape.drafts
    row = state.iteration.clamp(max=N - 1)[:, None, None].expand(-1, 1, shape.noise_width)  # (G, 1, D+W+1)
    uniforms = state.uniforms.gather(1, row)[:, 0]  # (G, D+W+1) this iteration's: drafts D, judge W+1
    refill(ctx, state, uniforms[:, :shape.draft_noise])
    k = torch.arange(W + 1, device=done.device)
    cells = done[:, None] + k  # (G, W+1) the frontier's positions (emitted cells: <= a)
    if state.tree is not None:  # proactive leaves after the chain (and the lower windows), seeing their ancestors
        offsets = state.tree.offsets  # (Q,)
        predicted = done[:, None] + offsets  # (G, Q)
        Q0 = offsets.shape[0] - shape.leaves
        feed = torch.cat([state.canvas.gather(1, predicted[:, :Q0] - 1), state.tree.leaves], 1)  # (G, Q)
        logits = forward_window(model, state, feed, window, offsets, visible=state.tree.visible)
        p_all = ctx.target(logits, predicted.clamp(max=N))  # (G, Q, V)
        p = p_all[:, :W + 1]
    elif shape.far_starts:  # 2-D: the lower rows' windows ride in the same forward
        offsets = query_offsets(shape, done.device)  # (Q,)
        predicted = done[:, None] + offsets  # (G, Q) the position each query predicts
        feed = state.canvas.gather(1, predicted - 1)  # (G, Q) each query reads the token before it
        blocks = query_blocks(shape, done.device) if shape.config.row_causal else None
        logits = forward_window(model, state, feed, window, offsets, blocks)
        p_all = ctx.target(logits, predicted.clamp(max=N))  # (G, Q, V)
        p = p_all[:, :W + 1]
    else:
        predicted = cells
        feed = torch.cat([state.canvas.gather(1, (done - 1)[:, None]), state.drafts], 1)  # (G, W+1)
        logits = forward_window(model, state, feed, window)  # (rows, W+1, V)
        p_all = p = ctx.target(logits, cells.clamp(max=N))  # (G, W+1, V)
    width = (N - done).clamp(min=0, max=W)  # (G,) active drafts: never past the last image token
    chain = torch.cat([state.drafts, state.canvas.gather(1, cells[:, W:])], 1)  # (G, W+1) cell W keeps its draft
    if state.tree is None:
        verdict = judge_run(p, state.q, state.drafts, uniforms[:, shape.draft_noise:], width, shape.config,
                            state.neighbors, state.proposed, shape.sampling.greedy)
        gain = verdict.gain * active[:, None]
    else:  # proactive leaves: the candidates of the first positions judged together, a passing leaf committed
        Q0 = p_all.shape[1] - shape.leaves
        verdict = judge_with_leaves(p, p_all[:, Q0:], state.q, state.drafts,
                                    state.tree.leaves.view(done.shape[0], shape.tree_depth, -1),
                                    uniforms[:, shape.draft_noise:], width, shape.sampling.greedy)
        move_leaf_key(state.cache, state.length, verdict, Q0)
        leaf_token = state.tree.leaves.gather(1, verdict.leaf.clamp(min=0)[:, None])  # (G, 1)
        chain = torch.where((k == verdict.run[:, None]) & (verdict.leaf >= 0)[:, None], leaf_token, chain)
        p_all, predicted = p_all[:, :Q0], predicted[:, :Q0]  # the leaves' predictions are not kept
        gain = torch.zeros_like(p[:, :1, 0])  # exact rules only
    a = verdict.accepted
    count = a + 1  # (G,)
    new = torch.where(k == a[:, None], verdict.token[:, None], chain)
    state.canvas.scatter_(1, cells, new)
    state.per_cell.scatter_(1, cells, count.to(torch.int32)[:, None].expand(-1, W + 1))
    keep_predictions(shape, state, p_all, predicted, width)
    # an image finishing now (or done before) keeps its length: its later writes stay inside the cache
    _advance(state, a, active, gain, N)


def _advance(state: JacobiState, a: torch.Tensor, active: torch.Tensor, gain: torch.Tensor, N: int) -> None:
    """After the frontier accepted a (G,) drafts plus one token: move the committed length and the tokens done
    (an image finishing now, or done before, keeps its length: its later writes stay inside the cache), count
    the iteration, and fold in the relaxed / grouped mass `gain` (G, ·) the accepted drafts used."""
    done, count = state.done, a + 1
    state.length.add_(per_row(torch.where(done + count < N, count, torch.zeros_like(count)), state.length.shape[0]))
    done.add_(torch.where(active, count, torch.zeros_like(count)))
    state.iteration.add_(active.long())
    state.histogram.scatter_add_(1, a[:, None], active.long()[:, None])
    state.absorbed.copy_(torch.stack([state.absorbed[0] + gain.sum(), torch.maximum(state.absorbed[1], gain.max())]))
    state.relaxed.add_((gain > 0).sum())


def _row_front_iteration(ctx: JacobiContext, state: JacobiState, window: int) -> None:
    """`jacobi_iteration` with `row_commit` (relaxed 2-D, `jacobi_rows.py`): the frontier's window as in 1-D
    Jacobi (committed cells it reaches pass as forced drafts), plus a window at the front of each of the next
    rows - 1 image rows, all in one forward with keys at raster slots. The frontier judges its run exactly;
    each lower window judges its live lanes against the prediction it sees (no residual, no bonus token) and
    commits its accepted leading run. Shapes depend on `ctx.shape` and `window` only; nothing reads the host."""
    shape, model, rs = ctx.shape, ctx.model, state.rows
    W, N, w, L = shape.window, shape.image_tokens, shape.config.row_window, shape.lower
    done, rows = state.done, state.length.shape[0]
    G, V = done.shape[0], state.ahead.shape[-1]
    active = done < N
    row = state.iteration.clamp(max=N - 1)[:, None, None].expand(-1, 1, shape.noise_width)
    uniforms = state.uniforms.gather(1, row)[:, 0]  # (G, noise_width): drafts, frontier judge W + 1, lower judges
    lanes = row_lanes(rs.fixed, done, shape)
    refill(ctx, state, uniforms[:, :shape.draft_noise], lanes)
    lower_drafts = state.canvas.gather(1, lanes.positions)  # (G, (R-1) w)
    k = torch.arange(W + 1, device=done.device)
    cells, inside = lanes.cells, k <= lanes.front_width[:, None]  # (G, W+1) the frontier's positions, real ones
    predicted = torch.cat([cells, lanes.positions], 1)  # (G, Q) the position each query predicts
    feed = state.canvas.gather(1, predicted - 1)  # (G, Q) each query reads the token before it
    trash = rs.ahead_ok.shape[1] - 1
    written = per_row(torch.cat([inside, lanes.real], 1), rows)  # (rows, Q)
    base = state.length - per_row(done, rows)  # (rows,) the query predicting P reads the key at base + P
    slots = torch.where(written, base[:, None] + per_row(predicted, rows), trash)  # raster slots, idle: trash
    mask = raster_mask(state.key_valid, rs.ahead_ok, state.length, slots, written,
                       query_blocks(shape, done.device), window, shape.config.row_causal)
    p_all = ctx.target(forward_at_slots(model, state.cache, per_row(feed, rows), slots, mask, window, G == 1),
                       predicted.clamp(max=N))
    width = lanes.front_width
    judged = shape.draft_noise + W + 1
    verdict = judge_run(p_all[:, :W + 1], state.q, state.drafts, uniforms[:, shape.draft_noise:judged], width,
                        shape.config, state.neighbors, state.proposed, shape.sampling.greedy,
                        forced=rs.fixed.gather(1, cells[:, :W]))
    low = judge_run(p_all[:, W + 1:].reshape(G * L, w, V), rs.q.view(G * L, w, V), lower_drafts.view(G * L, w),
                    uniforms[:, judged:].reshape(G * L, w), lanes.width.view(-1), shape.config, state.neighbors,
                    rs.proposed.view(G * L, w), shape.sampling.greedy, with_token=False)  # (G, w) windows
    a, runs = verdict.accepted, low.accepted.view(G, L)
    at = (done + a)[:, None]
    token = torch.where(rs.fixed.gather(1, at), state.canvas.gather(1, at), verdict.token[:, None])[:, 0]
    count = a + 1
    tail = state.canvas.gather(1, cells[:, W:])
    state.canvas.scatter_(1, cells, torch.where(k == a[:, None], token[:, None], torch.cat([state.drafts, tail], 1)))
    was = rs.fixed.gather(1, cells)
    state.per_cell.scatter_(1, cells, torch.where(was, state.per_cell.gather(1, cells), count.to(torch.int32)[:, None]))
    rs.fixed.scatter_(1, cells, was | ((k <= a[:, None]) & active[:, None]))
    commit = (torch.arange(w, device=done.device) < runs[..., None]).view(G, -1) & lanes.real  # (G, (R-1) w)
    run_of = runs[..., None].expand(-1, -1, w).reshape(G, -1).to(torch.int32)
    state.per_cell.scatter_(1, lanes.positions, torch.where(commit, run_of, state.per_cell.gather(1, lanes.positions)))
    rs.fixed.scatter_(1, lanes.positions, rs.fixed.gather(1, lanes.positions) | commit)
    settled = per_row(lanes.real & rs.fixed.gather(1, (lanes.positions - 1).clamp(min=0)), rows)  # committed keys
    rs.ahead_ok.scatter_(1, slots[:, W + 1:], settled)
    H = state.ahead.shape[1] - 1
    keep_predictions(shape, state, p_all, predicted, width, lanes.ring(H))
    rs.commits.add_(runs.sum(0))
    _advance(state, a, active, torch.cat([verdict.gain * active[:, None], low.gain.view(G, -1)], 1), N)

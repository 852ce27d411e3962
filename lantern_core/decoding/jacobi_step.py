"""The static-shape Jacobi iteration (SJD, coupled SJD, relaxed Jacobi): refill the draft window, verify it
in one target forward, judge the leading run, emit, with every value that changes between iterations held
in device tensors.

One iteration = the Jacobi update of the previous judge's predictions plus the initialisation of the
positions entering the window (`refill`), one causal forward over the last emitted token and the W drafts,
the acceptance tests of every position at once and the leading run (`judge_run`), and the emission of
the accepted drafts plus one token. Near the end of the image the active width w = min(W, N - done) is a
device value: drafts past it are never accepted, so the shapes stay those of `JacobiShape`. Randomness is
drawn by `draw_jacobi_noise` before each iteration, outside any captured region, in the order and sizes the
step-by-step decoder drew it (its sizes follow from the number of tokens done, which the loop reads once per
iteration). The decode loop, prefill, window choice and the rules' documentation live in `jacobi.py`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..config import SamplingConfig
from ..models.gpt import ForwardStep, ImageTransformer
from ..models.kv_cache import KVCache, attention_mask
from .acceptance import absorbed_set, normalise
from .relaxation import group_mass, relax
from .sampling import sample_from_probs
from .step_graphs import SLOT_BUCKET, band_starts, band_window

DRAWN_INITS = ("random", "sample_left")  # initialisations that draw fresh tokens (the repeat ones copy)


@dataclass(frozen=True)
class JacobiShape:
    """What fixes an iteration's shapes and code: rows (2 with CFG), cache slots, image tokens, the sampling
    settings, and the `JacobiConfig` (with an integer window) whose rule it bakes in."""

    rows: int
    slots: int
    image_tokens: int
    sampling: SamplingConfig
    config: Any  # jacobi.JacobiConfig with an int window

    @property
    def window(self) -> int:
        return self.config.window


def jacobi_window(length: int, shape: JacobiShape, exact: bool) -> tuple[int, int]:
    """(band start, keys) for the forward at committed `length`: exactly length + W + 1 keys (devices that never
    capture), or rounded so one value serves every length of a `SLOT_BUCKET`-wide band; the start is where
    a capture of that band warms up."""
    extent = shape.window + 1
    if exact:
        return length, length + extent
    return length // SLOT_BUCKET * SLOT_BUCKET, band_window(length, extent, shape.slots)


def jacobi_bands(shape: JacobiShape) -> list[tuple[int, int]]:
    """Every bucketed variant a cache of `shape.slots` slots can use (one captured graph each)."""
    return [jacobi_window(start, shape, exact=False) for start in band_starts(shape.slots - shape.window - 1)]


@dataclass
class JacobiState:
    """The static tensors of one Jacobi run shape, allocated once and reused across images."""

    cache: KVCache  # (L, rows, H_kv, slots, D)
    key_valid: torch.Tensor  # (rows, slots) bool
    length: torch.Tensor  # () long committed slots
    done: torch.Tensor  # () long image tokens emitted
    canvas: torch.Tensor  # (N + W + 1,) long: emitted tokens, then the current drafts
    per_cell: torch.Tensor  # (N + W + 1,) int32
    drafts: torch.Tensor  # (W,) long
    q: torch.Tensor  # (W, V) the distribution each draft was drawn from
    proposed: torch.Tensor  # (W,) bool: drawn from the model's own prediction (relaxable)
    p_prev: torch.Tensor  # (W + 1, V) the last judge's target rows (the next Jacobi update)
    accepted_prev: torch.Tensor  # () long drafts the last judge accepted
    width_prev: torch.Tensor  # () long the last judge's active width
    judge_uniforms: torch.Tensor  # (W + 1,)
    draw_uniforms: torch.Tensor  # (W,) for sampled (uncoupled) refills
    uniform_q: torch.Tensor  # (W, V) 1 / V, the random initialisation's law
    gumbel: torch.Tensor | None  # (N + W + 1, V) coupled drafting's per-position noise, drawn per image
    neighbors: torch.Tensor | None
    histogram: torch.Tensor  # (W + 1,) long iterations by drafts accepted
    absorbed: torch.Tensor  # (2,) relaxed / grouped mass: sum and max over accepted drafts
    relaxed: torch.Tensor  # () long
    forwards_per_iteration: int = 0  # drafter forwards (none)

    @classmethod
    def allocate(cls, model: ImageTransformer, shape: JacobiShape, neighbors: torch.Tensor | None) -> "JacobiState":
        device = model.tok_embeddings.weight.device
        N, V, W = shape.image_tokens, model.config.vocab_size, shape.window
        long = dict(dtype=torch.long, device=device)
        coupled = shape.config.coupled and not shape.sampling.greedy
        return cls(
            cache=model.allocate_cache(shape.rows, shape.slots),
            key_valid=torch.ones(shape.rows, shape.slots, dtype=torch.bool, device=device),
            length=torch.zeros((), **long), done=torch.ones((), **long), canvas=torch.zeros(N + W + 1, **long),
            per_cell=torch.ones(N + W + 1, dtype=torch.int32, device=device), drafts=torch.zeros(W, **long),
            q=torch.full((W, V), 1.0 / V, device=device), proposed=torch.zeros(W, dtype=torch.bool, device=device),
            p_prev=torch.full((W + 1, V), 1.0 / V, device=device), accepted_prev=torch.zeros((), **long),
            width_prev=torch.zeros((), **long), judge_uniforms=torch.full((W + 1,), 0.5, device=device),
            draw_uniforms=torch.full((W,), 0.5, device=device), uniform_q=torch.full((W, V), 1.0 / V, device=device),
            gumbel=torch.zeros(N + W + 1, V, device=device) if coupled else None,
            neighbors=None if neighbors is None else torch.zeros_like(neighbors),
            histogram=torch.zeros(W + 1, **long), absorbed=torch.zeros(2, device=device),
            relaxed=torch.zeros((), **long))

    def reset_counters(self) -> None:
        for t in (self.histogram, self.absorbed, self.relaxed):
            t.zero_()

    def start_image(self, prefix_len: int, first: torch.Tensor, first_p: torch.Tensor) -> None:
        """After the prefill and the first token: the first refill initialises all W positions (no carried
        rows) and `sample_left` draws them from the first prediction `first_p` (V,)."""
        self.canvas.zero_()
        self.canvas[0] = first.reshape(())
        self.per_cell.fill_(1)
        self.length.fill_(prefix_len)
        self.done.fill_(1)
        self.accepted_prev.zero_()
        self.width_prev.zero_()
        self.p_prev[0] = first_p

    def reset_for_warmup(self, start: int) -> None:
        self.start_image(start, torch.zeros((), dtype=torch.long, device=self.canvas.device), self.p_prev[0].clone())

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
        """(rows, n, V) logits -> (n, V) what the sampler samples from (softmax of the CFG mix when greedy)."""
        if self.shape.sampling.greedy:
            return self.dist.combine(logits, index).softmax(-1)[0]
        return self.dist(logits, index)[0]


def refill_draws(shape: JacobiShape, carried: int) -> int:
    """Uniforms the next refill consumes when `carried` rows are Jacobi updates (the rest initialised)."""
    if shape.sampling.greedy or (shape.config.coupled and not shape.sampling.greedy):
        return 0
    return shape.window if shape.config.init in DRAWN_INITS else carried


def draw_jacobi_noise(state: JacobiState, shape: JacobiShape, generator: torch.Generator | None, carried: int,
                      width: int) -> None:
    """Fill the next iteration's uniforms from the image's generator: the refill's (`carried` Jacobi rows),
    then the judge's w + 1 (`width` = w). Runs eagerly, outside capture."""
    if shape.sampling.greedy:
        return
    count = refill_draws(shape, carried)
    if count:
        state.draw_uniforms[:count].uniform_(0.0, 1.0, generator=generator)
    state.judge_uniforms[:width + 1].uniform_(0.0, 1.0, generator=generator)


def _draw(shape: JacobiShape, state: JacobiState, probs: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One token per row of probs (W, V): argmax when greedy, Gumbel-max with the positions' noise when
    coupled, else inverse-CDF sampling with the refill's uniforms (row j uses uniform j)."""
    if shape.sampling.greedy:
        return probs.argmax(-1)
    if state.gumbel is not None:
        return (probs.clamp(min=0).log() + state.gumbel.index_select(0, positions)).argmax(-1)
    return sample_from_probs(probs, state.draw_uniforms)


def refill(ctx: JacobiContext, state: JacobiState) -> None:
    """New drafts for positions done .. done+W-1: the first c = w - a rows re-drawn from the last judge's
    predictions for them (Jacobi update), the rest initialised per `config.init`."""
    shape = ctx.shape
    W, init, grid = shape.window, shape.config.init, ctx.model.config.row_stride
    j = torch.arange(W, device=state.canvas.device)
    carried = j < (state.width_prev - state.accepted_prev)  # (W,)
    rows = (state.accepted_prev + 1 + j).clamp(max=W)
    p_carry = state.p_prev.index_select(0, rows)  # (W, V) the prediction for each carried position
    positions = state.done + j  # (W,) absolute image positions
    if init in DRAWN_INITS:
        fresh_q = state.uniform_q if init == "random" else state.p_prev.index_select(0, state.width_prev.view(1)).expand(W, -1)
        q = torch.where(carried[:, None], p_carry, fresh_q)
        tokens = _draw(shape, state, q, positions)
    else:  # repeat_left / repeat_above: copy an earlier token (carried ones written first)
        moved = _draw(shape, state, p_carry, positions)
        state.canvas.index_copy_(0, positions, torch.where(carried, moved, state.canvas.index_select(0, positions)))
        start = state.done + (state.width_prev - state.accepted_prev)  # first initialised position
        source = positions
        for _ in range(W):  # follow copies of copies back to a position before `start` (fixed trip)
            if init == "repeat_above":
                earlier = torch.where(source < grid, source - 1, source - grid)
            else:
                earlier = source - 1
            source = torch.where(source >= start, earlier, source)
        tokens = torch.where(carried, moved, state.canvas.index_select(0, source))
        point = torch.zeros_like(p_carry).scatter_(1, tokens[:, None], 1.0)  # point masses (one_hot would sync on CUDA)
        q = torch.where(carried[:, None], p_carry, point)
    state.canvas.index_copy_(0, positions, tokens)
    state.drafts.copy_(tokens)
    state.q.copy_(q)
    state.proposed.copy_(carried)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Where a rejected draft's position is resampled from: normalise(max(0, p - q)) (p if that is empty)."""
    return normalise((p - q).clamp(min=0), p)


@dataclass
class StaticVerdict:
    accepted: torch.Tensor  # () long leading drafts accepted (<= the active width)
    token: torch.Tensor  # (1,) the token after them
    gain: torch.Tensor  # (W,) relaxed / grouped mass each accepted draft used, 0 elsewhere


def judge_run(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, uniforms: torch.Tensor | None,
              width: torch.Tensor, config, neighbors: torch.Tensor | None, relaxable: torch.Tensor | None = None,
              greedy: bool = False) -> StaticVerdict:
    """p (W+1, V) target at each window position, q (W, V) the drafts' distributions, drafts (W,), uniforms
    (>= width+1,): the acceptance tests of every position at once, drafts past `width` (() long) never
    accepted, then the leading run and the token after it: the residual max(0, p - q) at a rejection (with
    LANTERN's absorbed set carved out of q), p itself after the whole run. Relaxed / grouped rules apply where
    `relaxable` (W,) is True (default everywhere); other positions are judged exactly. No host read."""
    W = drafts.numel()
    rows = torch.arange(W, device=p.device)
    gain = torch.zeros(W, dtype=p.dtype, device=p.device)
    count = None
    if greedy:
        ok = drafts == p[:W].argmax(-1)
    else:
        target, draft = p[rows, drafts], q[rows, drafts]
        if relaxable is None:
            relaxable = torch.ones(W, dtype=torch.bool, device=p.device)
        if config.relaxation is not None:
            mass = relax(p[:W], drafts, neighbors, config.relaxation)
            count = torch.where(relaxable, mass.count, torch.zeros_like(mass.count))
            gain = torch.where(relaxable, mass.absorbed, gain)
            target = target + gain
        elif config.grouping is not None:
            group = group_mass(p[:W], q, drafts, neighbors, config.grouping)
            target = torch.where(relaxable, group.target, target)
            draft = torch.where(relaxable, group.draft, draft)
            gain = target - p[rows, drafts]
        ok = uniforms[:W] * draft < target  # u < target / draft without dividing (draft > 0 for a drawn token)
    ok = ok & (rows < width)
    a = ok.long().cumprod(0).sum()  # () the leading run
    p_a = p.index_select(0, a.view(1))  # (1, V)
    if greedy:
        token = p_a.argmax(-1)
    else:
        at = a.clamp(max=W - 1).view(1)
        q_row = q.index_select(0, at)
        if count is not None and config.relaxation.k > 0:  # LANTERN: the absorbed set leaves q, as in the tree walk
            q_row = q_row.masked_fill(absorbed_set(drafts.index_select(0, at), count.index_select(0, at), neighbors,
                                                   config.relaxation.k, p.shape[-1]), 0.0)
        probs = torch.where(a < width, residual_distribution(p_a, q_row), p_a)
        token = sample_from_probs(probs, uniforms.index_select(0, width.view(1)))
    return StaticVerdict(a, token, torch.where(rows < a, gain, torch.zeros_like(gain)))


def forward_window(model: ImageTransformer, state, feed: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """Feed tokens (n,) at the committed length of `state` (anything with `cache`, `key_valid` and an int or
    () device `length`); written, not committed. Attends over `window` slots (default length + n, exact).
    Returns logits (rows, n, V)."""
    rows, n = state.key_valid.shape[0], feed.numel()
    window = state.length + n if window is None else window
    slots = state.length + torch.arange(n, device=feed.device)
    step = ForwardStep(slots.clamp(max=model.rope_table.shape[0] - 1), state.cache, kv_len=window,
                       mask=attention_mask(state.key_valid, slots, window), slots=slots)
    return model.logits(model(model.embed_tokens(feed[None].expand(rows, -1)), step))


def jacobi_iteration(ctx: JacobiContext, state: JacobiState, window: int) -> None:
    """Refill the drafts, verify [last token; drafts] in one forward attending over `window` cache slots,
    judge and emit. Shapes depend on `ctx.shape` and `window` only; nothing reads the host."""
    shape, model = ctx.shape, ctx.model
    W, N = shape.window, shape.image_tokens
    refill(ctx, state)
    done, length = state.done, state.length
    k = torch.arange(W + 1, device=done.device)
    feed = torch.cat([state.canvas.index_select(0, (done - 1).view(1)), state.drafts])  # (W+1,)
    logits = forward_window(model, state, feed, window)  # (rows, W+1, V)
    p = ctx.target(logits, (done + k).clamp(max=N))  # (W+1, V)
    width = (N - done).clamp(max=W)  # () active drafts: never past the last image token
    verdict = judge_run(p, state.q, state.drafts, state.judge_uniforms, width, shape.config, state.neighbors,
                        state.proposed, shape.sampling.greedy)
    a = verdict.accepted
    new = torch.where(k == a, verdict.token, torch.cat([state.drafts, state.drafts[-1:]]))  # (W+1,) valid <= a
    state.canvas.index_copy_(0, done + k, new)
    state.per_cell.index_copy_(0, done + k, (a + 1).to(torch.int32).expand(W + 1))
    state.p_prev.copy_(p)
    state.accepted_prev.copy_(a)
    state.width_prev.copy_(width)
    length.add_(a + 1)
    done.add_(a + 1)
    state.histogram.index_add_(0, a.view(1), torch.ones(1, dtype=torch.long, device=a.device))
    gain = verdict.gain
    state.absorbed.copy_(torch.stack([state.absorbed[0] + gain.sum(), torch.maximum(state.absorbed[1], gain.max())]))
    state.relaxed.add_((gain > 0).sum())

"""The static-shape Jacobi iteration (SJD, coupled SJD, relaxed Jacobi): refill the draft window, verify it
in one target forward, judge the leading run, emit, with every value that changes between iterations held
in device tensors.

One iteration = the Jacobi update of the previous judge's predictions plus the initialisation of the
positions entering the window (`refill`), one causal forward over the last emitted token and the W drafts,
the acceptance tests of every position at once and the leading run (`judge_run`), and the emission of
the accepted drafts plus one token. Near the end of the image the active width w = min(W, N - done) is a
device value: drafts past it are never accepted, so the shapes stay those of `JacobiShape`. Randomness is
drawn once per image before its first iteration (`draw_jacobi_uniforms`, outside any captured region): a
table with one row of uniforms per iteration an image can take (each advances at least one token), which the
iteration picks by the image's own iteration counter, so no iteration launches a generator call and none of
the draws depends on a verdict the host would have to read. Every tensor carries the G images of a batch: each image has its own window position, drafts,
width and verdict, and advances on its own in the static KV cache; an image that is done keeps running
(static shapes) with its length frozen and nothing kept or counted. The decode loop, prefill, window
choice and the rules' documentation live in `jacobi.py`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..config import SamplingConfig
from ..models.gpt import ForwardStep, ImageTransformer
from ..models.kv_cache import KVCache, attention_mask
from .acceptance import absorbed_set, normalise
from .drafting import per_row, rows_of
from .relaxation import group_mass, relax
from .sampling import sample_from_probs
from .step_graphs import SLOT_BUCKET, band_starts, band_window

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

    @property
    def window(self) -> int:
        return self.config.window

    @property
    def images(self) -> int:
        """G: images decoded together."""
        return self.rows // 2 if self.sampling.uses_cfg else self.rows


def jacobi_window(length: int, shape: JacobiShape, exact: bool, whole: bool = False) -> tuple[int, int]:
    """(band start, keys) for the forward at committed `length`: exactly length + W + 1 keys (devices that never
    capture), the whole cache (`whole`: one variant for an Inductor-compiled iteration), or rounded so one value
    serves every length of a `SLOT_BUCKET`-wide band; the start is where a capture of that band warms up."""
    extent = shape.window + 1
    if exact:
        return length, length + extent
    if whole:
        return 0, shape.slots
    return length // SLOT_BUCKET * SLOT_BUCKET, band_window(length, extent, shape.slots)


def jacobi_bands(shape: JacobiShape) -> list[tuple[int, int]]:
    """Every bucketed variant a cache of `shape.slots` slots can use (one captured graph each)."""
    return [jacobi_window(start, shape, exact=False) for start in band_starts(shape.slots - shape.window - 1)]


@dataclass
class JacobiState:
    """The static tensors of one Jacobi run shape (G images), allocated once and reused across batches."""

    cache: KVCache  # (L, rows, H_kv, slots, D)
    key_valid: torch.Tensor  # (rows, slots) bool
    length: torch.Tensor  # (rows,) long committed slots per row
    done: torch.Tensor  # (G,) long image tokens emitted
    canvas: torch.Tensor  # (G, N + 2W + 2) long: emitted tokens, then the current drafts
    per_cell: torch.Tensor  # (G, N + 2W + 2) int32
    drafts: torch.Tensor  # (G, W) long
    q: torch.Tensor  # (G, W, V) the distribution each draft was drawn from
    proposed: torch.Tensor  # (G, W) bool: drawn from the model's own prediction (relaxable)
    p_prev: torch.Tensor  # (G, W + 1, V) the last judge's target rows (the next Jacobi update)
    accepted_prev: torch.Tensor  # (G,) long drafts the last judge accepted
    width_prev: torch.Tensor  # (G,) long the last judge's active width
    uniforms: torch.Tensor  # (G, N, 2W + 1) per image, row t: iteration t's refill (W) then judge (W + 1) uniforms
    iteration: torch.Tensor  # (G,) long iterations each image has taken (its row of `uniforms`)
    uniform_q: torch.Tensor  # (W, V) 1 / V, the random initialisation's law
    gumbel: torch.Tensor | None  # (G, N + W + 1, V) coupled drafting's per-position noise, drawn per image
    neighbors: torch.Tensor | None
    histogram: torch.Tensor  # (G, W + 1) long iterations by drafts accepted, per image
    absorbed: torch.Tensor  # (2,) relaxed / grouped mass: sum and max over accepted drafts
    relaxed: torch.Tensor  # () long
    forwards_per_iteration: int = 0  # drafter forwards (none)

    @classmethod
    def allocate(cls, model: ImageTransformer, shape: JacobiShape, neighbors: torch.Tensor | None) -> "JacobiState":
        device = model.tok_embeddings.weight.device
        N, V, W, G = shape.image_tokens, model.config.vocab_size, shape.window, shape.images
        long = dict(dtype=torch.long, device=device)
        coupled = shape.config.coupled and not shape.sampling.greedy
        padded = N + 2 * W + 2
        return cls(
            cache=model.allocate_cache(shape.rows, shape.slots),
            key_valid=torch.ones(shape.rows, shape.slots, dtype=torch.bool, device=device),
            length=torch.zeros(shape.rows, **long), done=torch.ones(G, **long), canvas=torch.zeros(G, padded, **long),
            per_cell=torch.ones(G, padded, dtype=torch.int32, device=device), drafts=torch.zeros(G, W, **long),
            q=torch.full((G, W, V), 1.0 / V, device=device),
            proposed=torch.zeros(G, W, dtype=torch.bool, device=device),
            p_prev=torch.full((G, W + 1, V), 1.0 / V, device=device), accepted_prev=torch.zeros(G, **long),
            width_prev=torch.zeros(G, **long), uniforms=torch.full((G, N, 2 * W + 1), 0.5, device=device),
            iteration=torch.zeros(G, **long), uniform_q=torch.full((W, V), 1.0 / V, device=device),
            gumbel=torch.zeros(G, N + W + 1, V, device=device) if coupled else None,
            neighbors=None if neighbors is None else torch.zeros_like(neighbors),
            histogram=torch.zeros(G, W + 1, **long), absorbed=torch.zeros(2, device=device),
            relaxed=torch.zeros((), **long))

    def reset_counters(self) -> None:
        for t in (self.histogram, self.absorbed, self.relaxed):
            t.zero_()

    def start_image(self, prefix_len: int, first: torch.Tensor, first_p: torch.Tensor) -> None:
        """After the prefill and the first tokens `first` (G,): the first refill initialises all W positions (no
        carried rows) and `sample_left` draws them from the first predictions `first_p` (G, V)."""
        self.canvas.zero_()
        self.canvas[:, 0] = first.reshape(-1)
        self.per_cell.fill_(1)
        self.length.fill_(prefix_len)
        self.done.fill_(1)
        self.accepted_prev.zero_()
        self.width_prev.zero_()
        self.iteration.zero_()
        self.p_prev[:, 0] = first_p

    def reset_for_warmup(self, start: int) -> None:
        self.start_image(start, torch.zeros_like(self.done), self.p_prev[:, 0].clone())

    def select(self, images: list[int], guided: bool) -> "JacobiState":
        """The state of images `images` only (their cache rows, windows, noise and counters; the run totals
        carried over): a smaller batch for devices that run eagerly (see `TreeState.select`)."""
        G, device = self.done.shape[0], self.done.device
        keep = torch.tensor(images, dtype=torch.long, device=device)
        rows = rows_of(images, G, guided, device)
        pick = lambda t: None if t is None else t.index_select(0, keep)  # noqa: E731
        return JacobiState(
            cache=self.cache.select_rows(rows), key_valid=self.key_valid.index_select(0, rows),
            length=self.length.index_select(0, rows), done=pick(self.done), canvas=pick(self.canvas),
            per_cell=pick(self.per_cell), drafts=pick(self.drafts), q=pick(self.q), proposed=pick(self.proposed),
            p_prev=pick(self.p_prev), accepted_prev=pick(self.accepted_prev), width_prev=pick(self.width_prev),
            uniforms=pick(self.uniforms), iteration=pick(self.iteration), uniform_q=self.uniform_q, gumbel=pick(self.gumbel), neighbors=self.neighbors,
            histogram=pick(self.histogram), absorbed=self.absorbed, relaxed=self.relaxed)

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


def draw_jacobi_uniforms(state: JacobiState, shape: JacobiShape, generators: list[torch.Generator | None]) -> None:
    """Before an image's first iteration: its whole table of iteration uniforms (N rows of 2W + 1), image g
    from `generators[g]` (so image g of a batch draws what a single run of it draws). Greedy runs draw
    nothing. Runs eagerly, outside capture."""
    if shape.sampling.greedy:
        return
    for g, generator in enumerate(generators):
        state.uniforms[g].uniform_(0.0, 1.0, generator=generator)


def _draw(shape: JacobiShape, state: JacobiState, probs: torch.Tensor, positions: torch.Tensor,
          uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of probs (G, W, V): argmax when greedy, Gumbel-max with the positions' (G, W) noise
    when coupled, else inverse-CDF sampling with the refill's uniforms (G, W) (row j uses uniform j)."""
    if shape.sampling.greedy:
        return probs.argmax(-1)
    if state.gumbel is not None:
        index = positions.clamp(max=state.gumbel.shape[1] - 1)[..., None].expand(-1, -1, probs.shape[-1])
        return (probs.clamp(min=0).log() + state.gumbel.gather(1, index)).argmax(-1)
    G, W, V = probs.shape
    return sample_from_probs(probs.reshape(G * W, V), uniforms.reshape(-1)).view(G, W)


def refill(ctx: JacobiContext, state: JacobiState, uniforms: torch.Tensor) -> None:
    """New drafts for positions done .. done+W-1 of every image: the first c = w - a rows re-drawn from the
    last judge's predictions for them (Jacobi update), the rest initialised per `config.init`; row j of a
    sampled draw uses uniforms[:, j] (G, W)."""
    shape = ctx.shape
    W, init, grid = shape.window, shape.config.init, ctx.model.config.row_stride
    G, V = state.drafts.shape[0], state.q.shape[-1]
    j = torch.arange(W, device=state.canvas.device)
    carried = j < (state.width_prev - state.accepted_prev)[:, None]  # (G, W)
    rows = (state.accepted_prev[:, None] + 1 + j).clamp(max=W)  # (G, W)
    p_carry = state.p_prev.gather(1, rows[..., None].expand(-1, -1, V))  # (G, W, V) prediction per carried position
    positions = state.done[:, None] + j  # (G, W) absolute image positions
    if init in DRAWN_INITS:
        if init == "random":
            fresh_q = state.uniform_q[None]
        else:
            fresh_q = state.p_prev.gather(1, state.width_prev[:, None, None].expand(-1, 1, V)).expand(-1, W, -1)
        q = torch.where(carried[..., None], p_carry, fresh_q)
        tokens = _draw(shape, state, q, positions, uniforms)
    else:  # repeat_left / repeat_above: copy an earlier token (carried ones written first)
        moved = _draw(shape, state, p_carry, positions, uniforms)
        state.canvas.scatter_(1, positions, torch.where(carried, moved, state.canvas.gather(1, positions)))
        start = (state.done + (state.width_prev - state.accepted_prev))[:, None]  # (G, 1) first initialised position
        source = positions
        for _ in range(W):  # follow copies of copies back to a position before `start` (fixed trip)
            if init == "repeat_above":
                earlier = torch.where(source < grid, source - 1, source - grid)
            else:
                earlier = source - 1
            source = torch.where(source >= start, earlier, source)
        tokens = torch.where(carried, moved, state.canvas.gather(1, source))
        point = torch.zeros_like(p_carry).scatter_(2, tokens[..., None], 1.0)  # point masses (one_hot would sync on CUDA)
        q = torch.where(carried[..., None], p_carry, point)
    state.canvas.scatter_(1, positions, tokens)
    state.drafts.copy_(tokens)
    state.q.copy_(q.expand(G, W, V))
    state.proposed.copy_(carried)


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
              greedy: bool = False) -> StaticVerdict:
    """For G windows: p (G, W+1, V) target at each window position, q (G, W, V) the drafts' distributions,
    drafts (G, W), uniforms (G, >= width+1): the acceptance tests of every position at once, drafts past
    `width` ((G,) long) never accepted, then the leading run and the token after it: the residual
    max(0, p - q) at a rejection (with LANTERN's absorbed set carved out of q), p itself after the whole run.
    Relaxed / grouped rules apply where `relaxable` (G, W) is True (default everywhere); other positions are
    judged exactly. No host read."""
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
    ok = ok & (cols < width[:, None])
    a = ok.long().cumprod(1).sum(1)  # (G,) the leading run
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


def forward_window(model: ImageTransformer, state, feed: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """Feed tokens (n,) at the committed length of `state` (anything with `cache`, `key_valid` and an int or
    () device `length`), or per image (G, n) at per-row lengths (rows,); written, not committed. Attends over
    `window` slots (default length + n, exact). Returns logits (rows, n, V)."""
    rows, n = state.key_valid.shape[0], feed.shape[-1]
    window = state.length + n if window is None else window
    if feed.dim() == 2:  # per image, per-row lengths
        slots = state.length[:, None] + torch.arange(n, device=feed.device)  # (rows, n)
        inputs = per_row(feed, rows)
    else:
        slots = state.length + torch.arange(n, device=feed.device)  # (n,)
        inputs = feed[None].expand(rows, -1)
    step = ForwardStep(slots.clamp(max=model.rope_table.shape[0] - 1), state.cache, kv_len=window,
                       mask=attention_mask(state.key_valid, slots, window), slots=slots)
    return model.logits(model(model.embed_tokens(inputs), step))


def jacobi_iteration(ctx: JacobiContext, state: JacobiState, window: int) -> None:
    """Refill every image's drafts, verify [last token; drafts] of all images in one forward attending over
    `window` cache slots, judge and emit; images already done advance nothing. Shapes depend on `ctx.shape`
    and `window` only; nothing reads the host."""
    shape, model = ctx.shape, ctx.model
    W, N = shape.window, shape.image_tokens
    done = state.done
    active = done < N  # (G,) images still decoding before this iteration
    row = state.iteration.clamp(max=N - 1)[:, None, None].expand(-1, 1, 2 * W + 1)  # (G, 1, 2W+1)
    uniforms = state.uniforms.gather(1, row)[:, 0]  # (G, 2W+1) this iteration's: refill W, judge W+1
    refill(ctx, state, uniforms[:, :W])
    k = torch.arange(W + 1, device=done.device)
    feed = torch.cat([state.canvas.gather(1, (done - 1)[:, None]), state.drafts], 1)  # (G, W+1)
    logits = forward_window(model, state, feed, window)  # (rows, W+1, V)
    p = ctx.target(logits, (done[:, None] + k).clamp(max=N))  # (G, W+1, V)
    width = (N - done).clamp(min=0, max=W)  # (G,) active drafts: never past the last image token
    verdict = judge_run(p, state.q, state.drafts, uniforms[:, W:], width, shape.config, state.neighbors,
                        state.proposed, shape.sampling.greedy)
    a = verdict.accepted
    count = a + 1  # (G,)
    new = torch.where(k == a[:, None], verdict.token[:, None], torch.cat([state.drafts, state.drafts[:, -1:]], 1))
    cells = done[:, None] + k  # (G, W+1), valid <= a
    state.canvas.scatter_(1, cells, new)
    state.per_cell.scatter_(1, cells, count.to(torch.int32)[:, None].expand(-1, W + 1))
    state.p_prev.copy_(p)
    state.accepted_prev.copy_(a)
    state.width_prev.copy_(width)
    # an image finishing now (or done before) keeps its length: its later writes stay inside the cache
    state.length.add_(per_row(torch.where(done + count < N, count, torch.zeros_like(count)), state.length.shape[0]))
    done.add_(torch.where(active, count, torch.zeros_like(count)))
    state.iteration.add_(active.long())
    state.histogram.scatter_add_(1, a[:, None], active.long()[:, None])
    gain = verdict.gain * active[:, None]
    state.absorbed.copy_(torch.stack([state.absorbed[0] + gain.sum(), torch.maximum(state.absorbed[1], gain.max())]))
    state.relaxed.add_((gain > 0).sum())

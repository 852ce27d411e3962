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
length frozen and nothing kept or counted. The decode loop and prefill are in `jacobi/batch.py`,
the window choice in `jacobi/auto.py`, the rules' documentation in `jacobi/driver.py`.
"""
from __future__ import annotations

import torch

from ...models.gpt import ForwardStep, ImageTransformer
from ...models.kv_cache import KVCache, attention_mask, window_mask
from ..acceptance.siblings import normalise
from ..batching import per_row
from ..sampling import sample_from_probs
from .judge import judge_run, judge_same_as_ar
from .proactive import draw_leaves, judge_leaves_same_as_ar, judge_with_leaves, move_leaf_key
from .rows import RowLanes, raster_mask, row_lanes
from .shape import DRAWN_INITS, JacobiShape, draft_offsets, query_blocks, query_offsets
from .state import JacobiContext, JacobiState


def _draw(shape: JacobiShape, state: JacobiState, probs: torch.Tensor, positions: torch.Tensor,
          uniforms: torch.Tensor, ring: torch.Tensor) -> torch.Tensor:
    """One token per row of probs (G, D, V): argmax when greedy, Gumbel-max with the positions' (G, D) noise
    when coupled, else inverse-CDF sampling with the refill's uniforms (G, D) (row j uses uniform j). With
    continuation (SJD-PAC's adaptive continuation, as a maximal coupling) the position's current draft x, drawn
    from a recorded law q, is kept with probability min(1, p(x) / q(x)) (the second half of `uniforms`) and
    otherwise replaced by a draw from normalise(max(0, p - q)): either way the new draft is distributed as p."""
    if shape.sampling.greedy:
        return probs.argmax(-1)
    if (shape.config.coupled or shape.same_as_ar) and state.gumbel is not None:
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


def refill(ctx: JacobiContext, state: JacobiState, uniforms: torch.Tensor | None,
           lanes: RowLanes | None = None) -> None:
    """New drafts at every draft offset of every image (the frontier's W, then the lower rows' windows, at
    fixed offsets or, with `lanes`, at the rows' own fronts): where a prediction for the position is kept
    (`known`: the last forward's, or an earlier lower window's) the draft is re-drawn from it (the Jacobi
    update), elsewhere initialised per `config.init`; a committed cell keeps its token. Row j of a sampled
    draw uses uniforms[:, j] (G, drafts). The frontier's drafts and their laws go to `drafts`, `q` and
    `proposed`, the row fronts' to `state.rows`; every draft to the canvas. `uniforms` is None under the
    AR-identical rule, whose drafts race with AR's position noise (`state.gumbel`)."""
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
    uniforms = None  # AR's position noise (the Gumbel table) decides every draw of the AR-identical rule
    if not shape.same_as_ar:
        row = state.iteration.clamp(max=N - 1)[:, None, None].expand(-1, 1, shape.noise_width)  # (G, 1, D+W+1)
        uniforms = state.uniforms.gather(1, row)[:, 0]  # (G, D+W+1) this iteration's: drafts D, judge W+1
    refill(ctx, state, None if uniforms is None else uniforms[:, :shape.draft_noise])
    k = torch.arange(W + 1, device=done.device)
    cells = done[:, None] + k  # (G, W+1) the frontier's positions (emitted cells: <= a)
    if state.tree is not None:  # proactive leaves after the chain (and the lower windows), seeing their ancestors
        offsets = state.tree.offsets  # (Q,)
        predicted = done[:, None] + offsets  # (G, Q)
        Q0 = offsets.shape[0] - shape.leaves
        feed = torch.cat([state.canvas.gather(1, predicted[:, :Q0] - 1), state.tree.leaves], 1)  # (G, Q)
        logits = forward_window(model, state, feed, window, offsets, visible=state.tree.visible)
        p_all = None if shape.same_as_ar else ctx.target(logits, predicted.clamp(max=N))  # (G, Q, V)
        p = None if p_all is None else p_all[:, :W + 1]
    elif shape.far_starts:  # 2-D: the lower rows' windows ride in the same forward
        offsets = query_offsets(shape, done.device)  # (Q,)
        predicted = done[:, None] + offsets  # (G, Q) the position each query predicts
        feed = state.canvas.gather(1, predicted - 1)  # (G, Q) each query reads the token before it
        blocks = query_blocks(shape, done.device) if shape.config.row_causal else None
        logits = forward_window(model, state, feed, window, offsets, blocks)
        p_all = None if shape.same_as_ar else ctx.target(logits, predicted.clamp(max=N))  # (G, Q, V)
        p = None if p_all is None else p_all[:, :W + 1]
    else:
        predicted = cells
        feed = torch.cat([state.canvas.gather(1, (done - 1)[:, None]), state.drafts], 1)  # (G, W+1)
        logits = forward_window(model, state, feed, window)  # (rows, W+1, V)
        p_all = p = None if shape.same_as_ar else ctx.target(logits, cells.clamp(max=N))  # (G, W+1, V)
    width = (N - done).clamp(min=0, max=W)  # (G,) active drafts: never past the last image token
    chain = torch.cat([state.drafts, state.canvas.gather(1, cells[:, W:])], 1)  # (G, W+1) cell W keeps its draft
    if shape.same_as_ar:  # AR's own draw at every window position; the leading run of drafts equal to them
        filtered = ctx.filtered(logits, predicted.clamp(max=N))  # (G, Q, V)
        p_all = filtered.softmax(-1)  # what `ctx.target` gives (the Jacobi update's laws)
        p = p_all[:, :W + 1]
        gain = torch.zeros_like(p[:, :1, 0])
        if state.tree is None:
            verdict = judge_same_as_ar(filtered[:, :W + 1], position_noise(state, cells), state.drafts, width)
        else:  # a leaf is taken only where it is AR's draw, its key moved into the chain's slot
            Q0 = p_all.shape[1] - shape.leaves
            verdict = judge_leaves_same_as_ar(filtered[:, :W + 1], filtered[:, Q0:], position_noise(state, cells),
                                              state.drafts, state.tree.leaves.view(done.shape[0], shape.tree_depth, -1),
                                              width)
            chain, p_all, predicted = take_leaf(state, verdict, chain, k, Q0), p_all[:, :Q0], predicted[:, :Q0]
    elif state.tree is None:
        verdict = judge_run(p, state.q, state.drafts, uniforms[:, shape.draft_noise:], width, shape.config,
                            state.neighbors, state.proposed, shape.sampling.greedy)
        gain = verdict.gain * active[:, None]
    else:  # proactive leaves: the candidates of the first positions judged together, a passing leaf committed
        Q0 = p_all.shape[1] - shape.leaves
        verdict = judge_with_leaves(p, p_all[:, Q0:], state.q, state.drafts,
                                    state.tree.leaves.view(done.shape[0], shape.tree_depth, -1),
                                    uniforms[:, shape.draft_noise:], width, shape.sampling.greedy)
        chain, p_all, predicted = take_leaf(state, verdict, chain, k, Q0), p_all[:, :Q0], predicted[:, :Q0]
        gain = torch.zeros_like(p[:, :1, 0])  # exact rules only
    a = verdict.accepted
    count = a + 1  # (G,)
    new = torch.where(k == a[:, None], verdict.token[:, None], chain)
    state.canvas.scatter_(1, cells, new)
    state.per_cell.scatter_(1, cells, count.to(torch.int32)[:, None].expand(-1, W + 1))
    keep_predictions(shape, state, p_all, predicted, width)
    # an image finishing now (or done before) keeps its length: its later writes stay inside the cache
    _advance(state, a, active, gain, N)


def take_leaf(state: JacobiState, verdict, chain: torch.Tensor, k: torch.Tensor, queries: int) -> torch.Tensor:
    """Where a proactive leaf was accepted, its key goes to the chain's slot after the run and its token into
    the chain (G, W+1); returns the chain. The leaves' predictions are not kept (the caller drops them)."""
    move_leaf_key(state.cache, state.length, verdict, queries)
    leaf_token = state.tree.leaves.gather(1, verdict.leaf.clamp(min=0)[:, None])  # (G, 1)
    return torch.where((k == verdict.run[:, None]) & (verdict.leaf >= 0)[:, None], leaf_token, chain)


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
    """`jacobi_iteration` with `row_commit` (relaxed 2-D, `jacobi/rows.py`): the frontier's window as in 1-D
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

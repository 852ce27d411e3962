"""The Jacobi decoders' batch loop: eager prefill and first token, the per-position noise of coupled drafts,
then one `jacobi_iteration` per target forward (cached runners, replayed from a CUDA graph per window band where
the device captures) until the last image is done, reading the tokens done once per iteration; on eager devices
finished images leave the batch. Used by `driver` for users' images and by `auto` for its scratch images.
"""
from __future__ import annotations

import time
from dataclasses import replace

import torch

from ...conditioning import build_prefix
from ...models.gpt import ImageTransformer
from ..ar_step import slots_for
from ..batching import (BatchProgress, BatchRequest, BatchSink, DoneReader, prefill_state, progress_tokens,
                        record_batch, release_state, retire_finished)
from ..acceptance.position_noise import PositionNoise
from ..sampling import NodeDistributions, fill_per_image, pick_tokens, sample_from_probs
from ..step_graphs import RunLayout, StepRunner, layout_for, runner
from .config import JacobiConfig
from .iteration import jacobi_iteration
from .shape import JacobiShape, jacobi_bands, jacobi_window
from .state import JacobiContext, JacobiState


NOISE_BLOCK = 16  # positions hashed at once when AR's noise fills a Jacobi table


def draw_position_noise(state: JacobiState, generators: list) -> None:
    """Coupled drafts, proactive leaves and the AR-identical judge: one Gumbel row per absolute image position,
    AR's own noise (-log E of `PositionNoise`, keyed by each image's seed), so every rule's drafts race as AR
    does; nothing without a noise table. A position's row decides its drafts until the judge rules on it, and
    a judged position is committed, so no row meets a verdict twice. Filled in blocks of positions: the hash's
    int64 temporaries stay small next to the table."""
    if state.gumbel is None:
        return
    G, P, V = state.gumbel.shape
    device = state.gumbel.device
    noise = PositionNoise.of(generators, G, P, V, device)
    for start in range(0, P, NOISE_BLOCK):
        positions = torch.arange(start, min(P, start + NOISE_BLOCK), device=device)
        state.gumbel[:, start:start + positions.numel()] = noise.exp_at(positions).log().neg_()


def jacobi_runner(model: ImageTransformer, shape: JacobiShape, dist: NodeDistributions,
                  neighbors: torch.Tensor | None, layout: RunLayout) -> StepRunner:
    """The iteration runner for `shape`: cached, with one CUDA graph per window band (variants are
    `jacobi_window`'s (band start, keys)), where `layout` uses graphs; else fresh eager buffers (the caller
    releases them)."""
    def build() -> StepRunner:
        state = JacobiState.allocate(model, shape, neighbors)
        context = JacobiContext(model, shape, dist)
        return StepRunner(lambda variant: jacobi_iteration(context, state, variant[1]), state)

    variants = (lambda: [jacobi_window(0, shape, False, whole=True)]) if layout.compiled else (lambda: jacobi_bands(shape))
    return runner(model, ("jacobi", shape), build, variants,
                  lambda r, variant: r.buffers.reset_for_warmup(variant[0] if variant else 0), layout,
                  model.tok_embeddings.weight.device)


def decode_batch(model: ImageTransformer, config: JacobiConfig, request: BatchRequest, sink: BatchSink) -> None:
    """Decode a batch of G images into `sink` with an integer window: eager prefill and first tokens, then a
    loop of `jacobi_iteration`s over all of them (captured on CUDA) until the last is done, reading the tokens
    done of every image once per iteration."""
    condition, sampling, generators, neighbors = request.condition, request.sampling, request.generators, request.neighbors
    out, tally = sink.tokens, sink.tally
    t0 = time.perf_counter()
    N, W = model.config.num_image_tokens, config.window
    dist = NodeDistributions(sampling, sampling.uses_cfg, model.constrain_logits)
    prefix = build_prefix(model, condition, sampling.uses_cfg)
    rows, T = prefix.key_valid.shape
    device = prefix.embeddings.device
    layout = layout_for(request.compile, device)
    shape = JacobiShape(rows, 0, N, sampling, config, model.config.row_stride)
    shape = replace(shape, slots=slots_for(T, N + shape.extent + int(shape.row_commit), layout.slot_bucket))  # + trash
    G = shape.images
    step_runner = jacobi_runner(model, shape, dist, neighbors, layout)
    state: JacobiState = step_runner.buffers
    try:
        hidden = prefill_state(model, prefix, state, neighbors)
        first_p = JacobiContext(model, shape, dist).target(model.logits(hidden[:, -1:]),
                                                           torch.zeros(1, dtype=torch.long, device=device))[:, 0]  # (G, V)
        if sampling.greedy:
            first = first_p.argmax(-1)
        elif shape.same_as_ar:  # AR's own first token
            first = pick_tokens(dist.combine(model.logits(hidden[:, -1:]), torch.zeros(1, dtype=torch.long,
                                                                                        device=device))[:, 0],
                                sampling, generators)
        else:
            first = sample_from_probs(first_p, torch.cat([torch.rand(1, generator=g, device=device) for g in generators]))
        state.start_image(T, first, first_p)
        draw_position_noise(state, generators)
        if not sampling.greedy and not shape.same_as_ar:  # every iteration's uniforms, per image, before the first one
            fill_per_image(state.uniforms, generators)
        progress_tokens(out, state.canvas, state.done)
        tally.prefill_s += time.perf_counter() - t0
        tally.batches += 1
        progress = BatchProgress.start(G, N)
        sink.report(progress.total)
        reader = DoneReader(state.done, late=not layout.exact)  # captured loops read one iteration late
        lag = W + 1 if reader.late else 0  # tokens an image may have gained since the counts were read
        while progress.running:
            step_runner.run(jacobi_window(T + progress.furthest_after(lag) - 1, shape, layout.exact, layout.compiled))
            tally.batch_iterations += 1
            progress.update(reader.read(state.done))  # the one host read per iteration
            progress_tokens(out, state.canvas, state.done, progress.index)
            sink.report(progress.total)
            smaller, keep = retire_finished(state, progress, sink, sampling.uses_cfg) if layout.exact else (None, None)
            if smaller is not None:
                tally.add_steps(step_runner)  # the runner it leaves
                state, shape = smaller, replace(shape, rows=smaller.length.shape[0])
                context = JacobiContext(model, shape, dist)
                step_runner = StepRunner(lambda variant, c=context, st=state: jacobi_iteration(c, st, variant[1]), state)
        record_batch(state, progress, sink)
        tally.add_steps(step_runner)
    finally:
        release_state(state, sink.tally, step_runner.shared)

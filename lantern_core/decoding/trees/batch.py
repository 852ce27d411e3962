"""The tree decoders' batch loop: eager prefill and first tokens, the drafter's prefix, then one `tree_iteration`
per target forward (cached runners, replayed from a CUDA graph per window band where the device captures) until
the last image is done, reading the tokens done once per iteration; on eager devices finished images leave the
batch. Used by `driver` for users' images and by `auto` for its scratch images.
"""
from __future__ import annotations

import time
from dataclasses import replace

import torch

from ...conditioning import build_prefix
from ...models.drafter import EagleDrafter
from ...models.gpt import ImageTransformer
from ..ar_step import slots_for
from ..batching import (BatchProgress, BatchRequest, BatchSink, DoneReader, prefill_state, progress_tokens,
                        record_batch, release_state, retire_finished)
from ..sampling import NodeDistributions, fill_per_image, pick_tokens
from ..step_graphs import RunLayout, StepRunner, layout_for, runner
from .config import SpeculativeConfig
from .drafting import StaticPlan, prefix_inputs
from .iteration import TreeContext, TreeShape, TreeState, band_windows, tree_iteration, tree_windows
from .prefix_states import drafter_features


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


def decode_batch(model: ImageTransformer, drafter: EagleDrafter, spec: SpeculativeConfig, plan: StaticPlan | None,
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
                      spec.dynamic if plan is None else plan.spec, spec.relaxation, spec.exact_rule)
    step_runner = tree_runner(model, drafter, shape, plan, dist, neighbors, layout)
    state: TreeState = step_runner.buffers
    try:
        hidden = prefill_state(model, prefix, state, neighbors)
        first = pick_tokens(dist.combine(model.logits(hidden[:, -1:]), torch.zeros(1, dtype=torch.long, device=device))[:, 0],
                            sampling, generators)  # (G,)
        state.start_image(T, first)
        state.position.fill(generators)
        if shape.walk_uniforms:  # every iteration's walk uniforms, per image, up front
            fill_per_image(state.uniforms, generators)
        state.session.reset(0)
        fed, embeddings = prefix_inputs(drafter, model, prefix.token_ids, first, rows, T)
        features = drafter_features(model, prefix, hidden, drafter.config.prefix_states)
        state.session.consume(features, fed, embeddings)  # pairs (f_s, x_{s+1}) over the prefix; the last holds the first token
        progress_tokens(out, state.tokens, state.done)
        tally.prefill_s += time.perf_counter() - t0
        tally.batches += 1
        progress = BatchProgress.start(shape.trees, N)
        sink.report(progress.total)
        reader = DoneReader(state.done, late=not layout.exact)  # captured loops read one iteration late
        lag = shape.depth + 1 if reader.late else 0  # tokens an image may have gained since the counts were read
        while progress.running:
            step_runner.run(tree_windows(T + progress.furthest_after(lag) - 1, shape, layout.exact, layout.compiled))
            tally.batch_iterations += 1
            progress.update(reader.read(state.done))  # the one host read per iteration
            progress_tokens(out, state.tokens, state.done, progress.index)
            sink.report(progress.total)
            smaller, _ = retire_finished(state, progress, sink, guided) if layout.exact else (None, None)
            if smaller is not None:
                tally.add_steps(step_runner)  # the runner it leaves
                state, shape = smaller, replace(shape, rows=smaller.length.shape[0])
                step_runner = eager_tree_runner(model, drafter, shape, plan, dist, state)
        record_batch(state, progress, sink)
        tally.add_steps(step_runner)
    finally:
        release_state(state, sink.tally, step_runner.shared)

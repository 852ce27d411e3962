"""Speculative decoding of image tokens with an EAGLE drafter: EAGLE-2 (dynamic tree), static trees
(LANTERN++ / EAGLE-1), each exact or LANTERN-relaxed (delta: absolute TVD budget; lambda: LANTERN++'s
multiplicative bound), with sampling or greedy decoding.

A batch of B images is decoded together (rows = [cond B; uncond B] with CFG): one drafter forward per tree
level drafts all B trees, one target forward verifies them, and each image accepts its own number of
tokens and advances on its own in the static KV cache; image i draws its randomness from generator i only,
so it equals a single run with that generator (seed + i). Per iteration (`trees/iteration.py`, static shapes,
replayed from a CUDA graph with compile "auto" on CUDA): draft the trees, verify them in one target forward
against the static KV cache, walk them (`trees/walk.py`), compact each accepted path in place, feed the
accepted features to the drafter. The loop over iterations (prefill, then iterations until the last image is
done, reading the tokens done of every image once per iteration) is `trees/batch.py`, the `auto` tree
`trees/auto.py`; this module checks the settings, picks the tree and runs the batch. The
acceptance test always sees the CFG-combined, temperature/top-k/top-p-filtered distribution, and the
drafter proposes from its own logits under the same CFG and filters. This module does not pick devices
or load files.
"""
from __future__ import annotations

import time

import torch

from ...conditioning import Condition
from ...config import SamplingConfig
from ...layout import extend_neighbors
from ...models.drafter import EagleDrafter
from ...models.gpt import ImageTransformer
from ..acceptance.neighbors import check_neighbors
from ..batching import BatchRequest, BatchSink, RunTally
from ..generate import GenerationResult, StepCallback, synchronize
from ..sampling import Generators, generator_for
from .auto import auto_tree
from .batch import decode_batch
from .config import SpeculativeConfig, check_tree_fits
from .drafting import plan_static_tree


@torch.no_grad()
def speculative_generate(model: ImageTransformer, drafter: EagleDrafter, condition: Condition, sampling: SamplingConfig,
                         spec: SpeculativeConfig, generator: Generators = None, neighbors: torch.Tensor | None = None,
                         on_step: StepCallback | None = None, compile: str = "auto") -> GenerationResult:
    """Speculatively sample `condition.batch` images' tokens, all in one batch; image i draws from
    generator i (`make_generators`: seed + i). `neighbors` (V, >= k) is needed for relaxation. `compile`
    "auto" replays each iteration from a CUDA graph on CUDA (`trees/iteration.py`); "off" runs eagerly. `on_step`
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
            chosen, note, origin = auto_tree(model, drafter, condition, sampling, spec, neighbors, compile)
            tree_name = f"{chosen.name} (auto, of {spec.static_tree.name}{origin}; {note})"
        plan = plan_static_tree(chosen or spec.static_tree, device)
        tally.by_node = torch.zeros(plan.spec.num_nodes + 1, dtype=torch.long, device=device)

    sink = BatchSink.allocate(B, N, tally)
    if on_step is not None:
        sink.report = lambda done: on_step(sum(done), B * N, sink.tokens)
    request = BatchRequest(condition, sampling, [generator_for(generator, i) for i in range(B)], neighbors, compile)
    decode_batch(model, drafter, spec, plan, request, sink)
    synchronize(device)
    stats = tally.to_stats(B, N, time.perf_counter() - start, tree_name)
    stats.drafter_prefix_states = drafter.config.prefix_states
    return GenerationResult(sink.tokens, stats, sink.per_cell, model.config.grid_size)

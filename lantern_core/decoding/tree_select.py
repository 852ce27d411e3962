"""The `auto` static tree: pick the sub-tree of a base tree (LANTERN++'s naive_extend_57) that gives the
most tokens per second on this machine, from two measurements:

* the forward-cost curve: time of one target verification over n tree nodes, and of one drafter
  forward, measured on the actual model, rows and device (a GPU verifies 57 nodes for about the price
  of one; a CPU pays several single steps);
* the acceptance profile: how often each node of the base tree lies on the accepted path, measured on
  a real run. Siblings are tested in rank order and a node's chance depends only on its ancestors and
  lower-ranked siblings, so for any rank-closed sub-tree the expected accepted length is exactly
  1 + the sum of its nodes' rates.

Candidates grow greedily by rate (keeping every prefix and lower rank), and the best ratio
E[tokens] / (verify(n) + depth x drafter) wins. This module measures and chooses; decoding is elsewhere.
"""
from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass

import torch

from . import step_graphs
from .generate import synchronize
from ..models.drafter import EagleDrafter
from ..models.gpt import ForwardStep, ImageTransformer
from .tree import TreeSpec

log = logging.getLogger("lantern_core.tree_select")

SIZES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class CostCurve:
    verify_s: tuple[tuple[int, float], ...]  # (tree nodes incl. the root, seconds per target verification)
    draft_s: float  # one drafter forward over a tree level

    def verify(self, nodes: int) -> float:
        """Seconds to verify `nodes` tree tokens (root included), linear between measured sizes."""
        points = self.verify_s
        for (n0, t0), (n1, t1) in zip(points, points[1:]):
            if nodes <= n1:
                return t0 + (t1 - t0) * (max(nodes, n0) - n0) / (n1 - n0)
        (n0, t0), (n1, t1) = points[-2], points[-1]
        return t1 + (t1 - t0) * (nodes - n1) / (n1 - n0)


def _time(fn, device: torch.device, reps: int) -> float:
    """Median seconds of `reps` calls after one warm-up call. On CUDA the call is timed as runs make it: a
    captured graph's replay (an eager forward pays every launch from Python, several times a replay's cost
    at batch 1, which would bias `auto` towards fewer, larger forwards); eager where capture fails."""
    if device.type == "cuda":
        try:
            fn = step_graphs.capture(fn, device).replay
        except Exception as error:  # timing must never fail the run: eager forwards then
            log.info("timing eager forwards for auto (capture failed: %s)", error)
    fn()
    times = []
    for _ in range(reps):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.no_grad()
def verify_times(model: ImageTransformer, rows: int, sizes: tuple[int, ...], reps: int) -> list[tuple[int, float]]:
    """Seconds of one target forward + logits over n new tokens at a mid-image context, for each n in sizes
    (the speculative verify step; `bench.py` reports the same curve)."""
    device = model.tok_embeddings.weight.device
    context = model.config.cls_token_num + model.config.num_image_tokens // 2
    cache = model.allocate_cache(rows, context + max(sizes))
    out = []
    for n in sizes:
        tokens = torch.zeros(rows, n, dtype=torch.long, device=device)
        mask = torch.ones(rows, 1, n, context + n, dtype=torch.bool, device=device)
        slots = torch.arange(context, context + n, device=device)
        step = ForwardStep(slots.clamp(max=model.rope_table.shape[0] - 1), cache, context + n, mask, slots)
        out.append((n, _time(lambda: model.logits(model(model.embed_tokens(tokens), step)), device, reps)))
    cache.release()
    return out


@torch.no_grad()
def measure_costs(model: ImageTransformer, drafter: EagleDrafter, rows: int, reps: int = 3) -> CostCurve:
    """Time target verification for SIZES tree tokens and one drafter level, on the model's device."""
    device = model.tok_embeddings.weight.device
    length = model.config.cls_token_num + model.config.num_image_tokens // 2  # a mid-image cache
    dcache = drafter.allocate_cache(rows, length + 8)
    feats = torch.zeros(rows, 8, model.config.dim, device=device, dtype=model.tok_embeddings.weight.dtype)
    dtokens = torch.zeros(rows, 8, dtype=torch.long, device=device)
    dmask = torch.ones(rows, 1, 8, length + 8, dtype=torch.bool, device=device)
    dslots = torch.arange(length, length + 8, device=device)
    dstep = ForwardStep(dslots.clamp(max=drafter.rope_table.shape[0] - 1), dcache, length + 8, dmask, dslots)
    draft = _time(lambda: model.logits(drafter(feats, dtokens, dstep)), device, reps)
    dcache.release()
    return CostCurve(tuple(verify_times(model, rows, SIZES, reps)), draft)


def node_rates(base: TreeSpec, accepted_by_node: list[int], iterations: int) -> dict[tuple[int, ...], float]:
    """P(node on the accepted path) for every node of `base`, from a run's per-node acceptance counts."""
    return {path: accepted_by_node[i + 1] / max(iterations, 1) for i, path in enumerate(base.paths)}


def tree_rate(tree: TreeSpec, rates: dict[tuple[int, ...], float], costs: CostCurve) -> float:
    """Predicted tokens per second of `tree` (model forwards only)."""
    expected = 1.0 + sum(rates.get(p, 0.0) for p in tree.paths)
    return expected / (costs.verify(tree.num_nodes + 1) + tree.depth * costs.draft_s)


def choose_subtree(base: TreeSpec, rates: dict[tuple[int, ...], float], costs: CostCurve) -> tuple[TreeSpec, float]:
    """The rank-closed sub-tree of `base` with the most expected tokens per second, and that rate."""
    chosen: list[tuple[int, ...]] = []
    present: set[tuple[int, ...]] = set()
    best, best_rate = None, -1.0
    remaining = list(base.paths)
    expected = 1.0
    while remaining:
        ready = [p for p in remaining if (len(p) == 1 or p[:-1] in present)
                 and (p[-1] == 0 or p[:-1] + (p[-1] - 1,) in present)]
        pick = max(ready, key=lambda p: (rates.get(p, 0.0), -len(p)))
        remaining.remove(pick)
        present.add(pick)
        chosen.append(pick)
        expected += rates.get(pick, 0.0)
        depth = max(len(p) for p in chosen)
        seconds = costs.verify(len(chosen) + 1) + depth * costs.draft_s
        if expected / seconds > best_rate:
            best, best_rate = list(chosen), expected / seconds
    return TreeSpec(f"auto_{len(best)}", tuple(best)), best_rate

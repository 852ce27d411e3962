"""Measured forward costs that the `auto` choices read: seconds of one target forward over n tokens at the run's
rows, dtype and device (`verify_times`), kept as a piecewise-linear `CostCurve` (with the drafter's cost per tree
level for the tree decoders). `time_call` times a call as runs make it (a CUDA graph replay on CUDA).
Measuring only; what to choose is decided in `trees/auto.py` and `jacobi/auto.py`.
"""
from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass

import torch

from ..models.gpt import ForwardStep, ImageTransformer
from . import step_graphs
from .generate import synchronize

log = logging.getLogger(__name__)


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


def time_call(fn, device: torch.device, reps: int) -> float:
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
        out.append((n, time_call(lambda: model.logits(model(model.embed_tokens(tokens), step)), device, reps)))
    cache.release()
    return out

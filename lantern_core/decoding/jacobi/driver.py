"""Training-free speculative Jacobi decoding on the static KV cache: SJD (arXiv 2410.01699), coupled SJD
(SCD, arXiv 2510.24211), and relaxed Jacobi (LANTERN's latent relaxation, or GSD's grouped acceptance,
arXiv 2508.07747). No drafter, any target.

A window of W draft tokens rides along with the last emitted token in one causal forward. Draft j was
drawn from a known distribution q_j: the model's own prediction for that position in the previous
iteration (the Jacobi update), or, for positions entering the window, the initialisation: uniform
`random` tokens (q uniform), a sample from the model's latest prediction, the one for the furthest
position it has seen (`sample_left`, q that prediction), or a copy of the token to the left / above
(`repeat_left`, `repeat_above`; q a point mass). The test min(1, p_j(x_j) / q_j(x_j)) over the leading run, with the first rejected
position resampled from max(0, p - q), keeps the output distributed exactly as AR. Coupled drafting draws
every draft by Gumbel-max from one noise table indexed by absolute position (derived from the run's
generator), so a position whose distribution barely changed re-draws the same token and is accepted.

Proactive drafting (`proactive` K > 1, `jacobi/proactive.py`) adds K - 1 candidates, drawn without replacement
from the same law, at each of the window's first `proactive_depth` positions and judges each position's
candidates by recursive rejection sampling: still exact, more tokens per forward.

Relaxed modes replace p_j(x_j) by LANTERN's p~(x_j) (delta or lambda, `acceptance/relaxation.py`; the absorbed
neighbours are carved out of q on rejection exactly as in the tree walk) or judge the draft by its GSD
group's mass p(G) / q(G). They relax only drafts the model proposed (Jacobi updates), never a fresh
initialisation: relaxing a uniform random token would accept it whenever its neighbours hold 1/V of
mass. They are not lossless; the mass they spend is reported in the stats. Greedy decoding (temperature
0) always uses the exact rule.

Rollback is free: accepted tokens already sit in consecutive cache slots; slots past the committed length
are stale and overwritten by the next window. A batch of B images runs together (rows = [cond B; uncond B]
with CFG): one forward verifies every image's window, each image accepts its own run and advances on its
own; image i draws only from generator i, so it equals a single run with that generator. Each iteration is one static-shape `jacobi_iteration` (`jacobi/iteration.py`), replayed from a
CUDA graph with compile "auto" on CUDA; `jacobi/batch.py` prefills, draws the first token and loops, reading
the number of tokens done once per iteration. The `auto` window and geometry are chosen from the measured
forward-cost curve (`jacobi/auto.py`). This module checks the settings, resolves `auto` and runs the batch; it
does not pick devices or load files.
"""
from __future__ import annotations

import time
from dataclasses import replace

import torch

from ...conditioning import Condition
from ...config import SamplingConfig
from ...layout import extend_neighbors
from ...models.gpt import ImageTransformer
from ..acceptance.neighbors import check_neighbors
from ..batching import BatchRequest, BatchSink, RunTally
from ..generate import GenerationResult, StepCallback, synchronize
from ..sampling import Generators, generator_for
from .auto import auto_window
from .batch import decode_batch
from .config import JacobiConfig

# ---------------------------------------------------------------------------------------------- decoding


@torch.no_grad()
def jacobi_generate(model: ImageTransformer, condition: Condition, sampling: SamplingConfig, config: JacobiConfig,
                    generator: Generators = None, neighbors: torch.Tensor | None = None,
                    on_step: StepCallback | None = None, compile: str = "auto") -> GenerationResult:
    """Sample `condition.batch` images together with speculative Jacobi decoding; image i uses generator[i].
    `on_step` gets the tokens done by the whole batch, out of B x N, and the (B, N) tokens (-1 past each
    image's progress).
    `neighbors` (V, >= k) is needed for relaxation / grouping with k > 0. `compile` "auto" replays each
    iteration from a CUDA graph on CUDA (`jacobi/iteration.py`); "off" runs eagerly."""
    start = time.perf_counter()
    device = model.tok_embeddings.weight.device
    neighbors = extend_neighbors(model.config, check_neighbors(config.neighbor_k, neighbors, device, model.config))
    N, B = model.config.num_image_tokens, condition.batch
    window, note = config.window, ""
    if window == "auto" or config.auto_rows:
        choice = auto_window(model, condition.row(0), sampling, config, neighbors, B)
        window, note = choice.window, f" (auto; {choice.note})"
        if choice.rows is not None:
            offset = config.row_offset if choice.row_offset is None else choice.row_offset
            config = replace(config, rows=choice.rows, row_window=choice.row_window, row_offset=offset)
    tally = RunTally(device)
    sink = BatchSink.allocate(B, N, tally)
    if on_step is not None:
        sink.report = lambda done: on_step(sum(done), B * N, sink.tokens)
    request = BatchRequest(condition, sampling, [generator_for(generator, i) for i in range(B)], neighbors, compile)
    decode_batch(model, replace(config, window=window), request, sink)
    synchronize(device)
    stats = tally.to_stats(B, N, time.perf_counter() - start, config.describe(window) + note)
    return GenerationResult(sink.tokens, stats, sink.per_cell, model.config.grid_size)

"""The `auto` Jacobi window: how many drafts to verify per forward on this machine.

Two measurements decide it. The forward-cost curve (seconds of one target forward over n tokens, on the
model's own device, dtype and rows; cached per model and device) says what a wider window costs: nearly
nothing on a GPU until it saturates, several single steps on a CPU. The acceptance profile (how many
drafts each iteration accepted, measured on one scratch image decoded with the widest window) says what
it buys: with window W an iteration that accepted a drafts would have accepted min(a, W), so

    tokens per second (W) = (1 + E[min(a, W)]) / verify(W + 1),

and the best W wins; plain AR's 1 / verify(1) is reported next to it. Relaxed 2-D decoding with an `auto`
geometry measures tokens per forward directly, one scratch image per candidate (rows, drafts per lower-row
window) of `ROW_GEOMETRIES`, and keeps the candidate with the most tokens per second on the same curve: its
lower rows commit on their own, so the frontier's histogram alone cannot predict it. Decoding itself is in
`jacobi/batch.py`.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, replace

import torch

from ...conditioning import Condition
from ...config import SamplingConfig
from ...models.gpt import ImageTransformer
from .. import auto_store
from ..auto_store import image_shape, weights_digest
from ..batching import BatchRequest, BatchSink, RunTally
from ..cost_curve import CostCurve, verify_times
from ..acceptance.seed_identity import image_follows_choice
from .batch import decode_batch
from .config import JacobiConfig, candidate_geometries

# ---------------------------------------------------------------------------------------------- auto window

_WINDOWS: dict[tuple, dict] = {}  # by weights digest: a reloaded model keeps its window (same seed, same image)


def _auto_key(sampling: SamplingConfig, config: JacobiConfig, device: torch.device, dtype: torch.dtype) -> tuple:
    return (sampling.uses_cfg, sampling.greedy, round(sampling.cfg_scale, 3), round(sampling.temperature, 3),
            sampling.top_k, round(sampling.top_p, 3), replace(config, window=1), str(device), str(dtype))


def auto_window(model: ImageTransformer, condition: Condition, sampling: SamplingConfig, config: JacobiConfig,
                 neighbors: torch.Tensor | None, batch: int = 1) -> WindowChoice:
    """Once per model, image shape, sampling setting, rule, device and batch size (one image, whatever the batch,
    where the window can change a seed's image: `seed_identity.image_follows_choice`): decode one scratch image
    (fixed seed, output discarded) with the largest window to measure how far drafts get accepted, then pick
    the window with the most tokens per second on the cost curve measured at the batch's rows. The user's
    seeds are untouched."""
    weight = model.tok_embeddings.weight
    if image_follows_choice(config, sampling, weight.dtype):
        batch = 1
    shape = image_shape(model)
    key = (_auto_key(sampling, config, weight.device, weight.dtype), shape, batch)
    cached = _WINDOWS.setdefault(weights_digest(model), {})
    stored_key = auto_store.entry_key("window", weights_digest(model), auto_store.device_name(weight.device),
                                      str(weight.dtype), shape, _auto_key(sampling, config, "-", "-"), batch)
    if key in cached:
        return cached[key]
    stored = auto_store.recall(stored_key)  # an earlier process may have measured it (`auto_store.py`)
    try:
        if stored is not None:
            geometry = (None, None, None)
            if config.auto_rows:
                offset = stored.get("row_offset")
                geometry = (int(stored["rows"]), int(stored["row_window"]), None if offset is None else int(offset))
            cached[key] = WindowChoice(int(stored["window"]), float(stored["tokens_per_s"]),
                                       float(stored["ar_tokens_per_s"]), *geometry)
            return cached[key]
    except (KeyError, TypeError, ValueError):
        pass  # measured again below
    if config.auto_rows:
        choice = _measure_rows(model, condition, sampling, config, neighbors, batch)
    else:
        scratch = RunTally(weight.device)
        request = BatchRequest(condition, sampling, [torch.Generator(device=weight.device).manual_seed(0)], neighbors)
        largest = config.largest_window(model.config.row_stride)
        decode_batch(model, replace(config, window=largest), request,
                      BatchSink.allocate(1, model.config.num_image_tokens, scratch))
        extra = config.extra_drafts(largest)  # lower rows' drafts, leaves
        costs = target_costs(model, batch * (2 if sampling.uses_cfg else 1), largest + 1 + extra)
        choice = choose_window(scratch.histogram, costs, largest, extra)
    cached[key] = choice
    entry = {"window": choice.window, "tokens_per_s": choice.tokens_per_s, "ar_tokens_per_s": choice.ar_tokens_per_s}
    if choice.rows is not None:
        entry.update(rows=choice.rows, row_window=choice.row_window, row_offset=choice.row_offset)
    auto_store.remember(stored_key, entry, f"jacobi window for {type(model).__name__} at batch {batch}")
    return choice


def _measure_rows(model: ImageTransformer, condition: Condition, sampling: SamplingConfig, config: JacobiConfig,
                  neighbors: torch.Tensor | None, batch: int) -> WindowChoice:
    """An auto geometry: one scratch image (seed 0, discarded) per candidate, then the candidate with the most
    tokens per second on this machine's cost curve at the batch's rows. Relaxed 2-D tries `ROW_GEOMETRIES` with
    the frontier's widest window and measures tokens per forward directly; the lossless modes try
    `LOSSLESS_GEOMETRIES` (1-D among them) and plan each one's window from its acceptance histogram."""
    if not config.row_commit:
        return _lossless_geometry(model, condition, sampling, config, neighbors, batch)
    weight, N = model.tok_embeddings.weight, model.config.num_image_tokens
    candidates = candidate_geometries(config, model.config.row_stride)
    measured = {}
    for candidate in candidates:
        scratch = RunTally(weight.device)
        request = BatchRequest(condition, sampling, [torch.Generator(device=weight.device).manual_seed(0)], neighbors)
        decode_batch(model, candidate, request, BatchSink.allocate(1, N, scratch))
        measured[(candidate.rows, candidate.row_window)] = N / max(scratch.iterations, 1)
    window = candidates[0].window  # the frontier's, the same in every candidate
    costs = target_costs(model, batch * (2 if sampling.uses_cfg else 1),
                         window + 1 + max(c.extra_drafts(window) for c in candidates))
    return choose_rows(measured, costs, window)


def _lossless_geometry(model: ImageTransformer, condition: Condition, sampling: SamplingConfig,
                       config: JacobiConfig, neighbors: torch.Tensor | None, batch: int) -> WindowChoice:
    """`_measure_rows` for sjd / sjd_coupled / sjd_relaxed: each geometry of `LOSSLESS_GEOMETRIES` that fits the
    image's rows, its window chosen (or the user's) from its own scratch image's acceptance histogram."""
    weight, N = model.tok_embeddings.weight, model.config.num_image_tokens
    candidates = [(c, c.extra_drafts(c.window)) for c in candidate_geometries(config, model.config.row_stride)]
    costs = target_costs(model, batch * (2 if sampling.uses_cfg else 1),
                         max(c.window + 1 + extra for c, extra in candidates))
    best = None
    for candidate, extra in candidates:
        scratch = RunTally(weight.device)
        request = BatchRequest(condition, sampling, [torch.Generator(device=weight.device).manual_seed(0)], neighbors)
        decode_batch(model, candidate, request, BatchSink.allocate(1, N, scratch))
        if config.window == "auto":
            choice = choose_window(scratch.histogram, costs, candidate.window, extra)
        else:
            choice = WindowChoice(candidate.window, expected_tokens(scratch.histogram, candidate.window)
                                  / costs.verify(candidate.window + 1 + extra), 1.0 / costs.verify(1))
        choice = replace(choice, rows=candidate.rows, row_window=candidate.row_window, row_offset=candidate.row_offset)
        if best is None or choice.tokens_per_s > best.tokens_per_s:
            best = choice
    return best

_COSTS: "weakref.WeakKeyDictionary[ImageTransformer, dict]" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class WindowChoice:
    window: int
    tokens_per_s: float  # predicted (model forwards only)
    ar_tokens_per_s: float  # plain AR on the same curve
    rows: int | None = None  # an auto geometry: the rows, drafts per lower-row window and offset chosen
    row_window: int | None = None
    row_offset: int | None = None  # lossless 2-D only (relaxed rows sit at their own fronts)

    @property
    def note(self) -> str:
        text = f"about {self.tokens_per_s:.0f} tok/s expected vs {self.ar_tokens_per_s:.0f} tok/s for plain AR"
        if self.rows is not None:
            shape = "1-D" if self.rows == 1 else f"{self.rows} rows x w{self.row_window}"
            text = f"geometry {shape}; " + text
        return text + ("; plain AR (mode ar) is faster here" if self.tokens_per_s < self.ar_tokens_per_s else "")


def curve_sizes(max_tokens: int) -> tuple[int, ...]:
    """Powers of two up to max_tokens, plus max_tokens itself."""
    sizes = [1]
    while sizes[-1] * 2 < max_tokens:
        sizes.append(sizes[-1] * 2)
    return tuple(sizes + ([max_tokens] if max_tokens > 1 else []))


def target_costs(model: ImageTransformer, rows: int, max_tokens: int, reps: int = 3) -> CostCurve:
    """The target's forward-cost curve for 1..max_tokens tokens, measured once per model, rows, device
    and dtype (the GPU curve is flat where the CPU's climbs)."""
    weight = model.tok_embeddings.weight
    key = (rows, max_tokens, str(weight.device), str(weight.dtype))
    per_model = _COSTS.setdefault(model, {})
    if key not in per_model:
        per_model[key] = CostCurve(tuple(verify_times(model, rows, curve_sizes(max(max_tokens, 2)), reps)), 0.0)
    return per_model[key]


def expected_tokens(histogram: list[int], window: int) -> float:
    """Image tokens per iteration with `window`, from a histogram of drafts accepted per iteration."""
    total = sum(histogram)
    if total == 0:
        return 1.0
    return 1.0 + sum(min(a, window) * count for a, count in enumerate(histogram)) / total


def choose_window(histogram: list[int], costs: CostCurve, max_window: int, extra: int = 0) -> WindowChoice:
    """The window in 1..max_window with the most predicted tokens per second; every forward also carries
    `extra` tokens (2-D drafting's lower-row windows)."""
    best, best_rate = 1, -1.0
    for window in range(1, max_window + 1):
        rate = expected_tokens(histogram, window) / costs.verify(window + 1 + extra)
        if rate > best_rate:
            best, best_rate = window, rate
    return WindowChoice(best, best_rate, 1.0 / costs.verify(1))


def choose_rows(measured: dict[tuple[int, int], float], costs: CostCurve, window: int) -> WindowChoice:
    """The (rows, row_window) of `measured` (tokens per forward each reached on the scratch image, frontier
    window `window`) with the most tokens per second: a forward carries window + 1 + (rows - 1) x row_window
    tokens."""
    rate = {geometry: per_forward / costs.verify(window + 1 + (geometry[0] - 1) * geometry[1])
            for geometry, per_forward in measured.items()}
    rows, row_window = max(rate, key=lambda geometry: (rate[geometry], -geometry[0] * geometry[1]))
    return WindowChoice(window, rate[(rows, row_window)], 1.0 / costs.verify(1), rows, row_window)

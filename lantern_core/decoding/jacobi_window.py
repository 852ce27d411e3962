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
`jacobi.py`.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

from ..models.gpt import ImageTransformer
from .tree_select import CostCurve, verify_times

_COSTS: "weakref.WeakKeyDictionary[ImageTransformer, dict]" = weakref.WeakKeyDictionary()


ROW_GEOMETRIES = ((3, 4), (4, 2), (4, 4), (6, 3), (6, 6), (8, 2), (8, 4))  # (rows, row_window) relaxed 2-D tries
LOSSLESS_GEOMETRIES = ((1, 4, -5), (2, 16, -1), (2, 8, -1), (3, 4, -5))  # (rows, row_window, row_offset) for sjd


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

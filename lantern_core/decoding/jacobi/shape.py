"""What fixes a Jacobi iteration's shapes and code (`JacobiShape`), the attention windows its variants use
(`jacobi_window`, `jacobi_bands`), and the layout of its queries: where each draft and each query of the
frontier's window and of the lower-row windows sits past the frontier (`draft_offsets`, `query_offsets`) and
which block each query belongs to (`query_blocks`). The iteration and the proactive leaves both read the layout
from here.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from ...config import SamplingConfig
from ..step_graphs import SLOT_BUCKET, band_starts, band_window

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
    stride: int = 0  # tokens per image row (the model's row stride); needed when config.rows > 1

    @property
    def same_as_ar(self) -> bool:
        """A sampled run judged by AR's own draws (`JacobiConfig.same_as_ar`): its drafts race with AR's noise."""
        return self.config.same_as_ar and not self.sampling.greedy

    @property
    def continues(self) -> bool:
        """Whether refills apply continuation's keep-or-redraw test (recording each draft's law): continuation
        under the residual rule; under the AR-identical rule the race already couples the drafts."""
        return self.config.continuation and not self.same_as_ar and not self.sampling.greedy

    @property
    def window(self) -> int:
        return self.config.window

    @cached_property
    def far_starts(self) -> tuple[int, ...]:
        """Offsets past the frontier where the lower rows' windows start (empty for 1-D Jacobi)."""
        if self.config.rows == 1 or self.config.row_commit:  # row fronts move on their own (`jacobi/rows.py`)
            return ()
        return self.config.far_starts(self.window, self.stride)

    @property
    def lower(self) -> int:
        """Lower-row windows per image (rows - 1)."""
        return self.config.rows - 1

    @property
    def row_commit(self) -> bool:
        return self.config.row_commit and self.lower > 0

    @property
    def drafts(self) -> int:
        """Drafts per image per iteration: the frontier's W and every lower-row window's."""
        return self.window + self.lower * self.config.row_window

    @property
    def tree_depth(self) -> int:
        """Positions past the frontier with proactive candidates (0: proactive drafting off)."""
        return self.config.tree_depth(self.window)

    @property
    def leaves(self) -> int:
        """Proactive drafting's extra candidates per image per forward (`jacobi/proactive.py`)."""
        return self.config.leaves(self.window)

    @property
    def queries(self) -> int:
        """Tokens one forward feeds per image: the last emitted token, the W frontier drafts, each lower
        window's left neighbour and its drafts but the last (a query predicts the next position), and the
        proactive leaves."""
        return self.window + 1 + self.config.extra_drafts(self.window)

    @property
    def horizon(self) -> int:
        """Positions past the frontier whose latest prediction is kept (offsets 0 .. horizon - 1)."""
        if self.row_commit:  # a lower lane predicts at most rows x stride - 1 past the frontier
            return max(self.window + 1, self.config.rows * self.stride)
        far = [start + self.config.row_window for start in self.far_starts]
        return max([self.window + 1, *far])

    @property
    def extent(self) -> int:
        """Cache slots one forward writes past the committed length: its queries' (contiguous), or with
        `row_commit` up to the furthest raster slot a lower lane writes."""
        return self.horizon + 1 if self.row_commit else self.queries

    @property
    def draft_noise(self) -> int:
        """Uniforms one refill consumes: one per draft, and with continuation one more per draft (the test
        whether the current draft is kept)."""
        return self.drafts * (2 if self.continues else 1)

    @property
    def noise_width(self) -> int:
        """Uniforms one iteration consumes: the refill's, the judge's W + 1, then with `row_commit` one per
        lower-row draft (its acceptance test), or one per proactive leaf (its test)."""
        lower = self.lower * self.config.row_window if self.row_commit else 0
        return self.draft_noise + self.window + 1 + lower + self.leaves

    @property
    def images(self) -> int:
        """G: images decoded together."""
        return self.rows // 2 if self.sampling.uses_cfg else self.rows


def jacobi_window(length: int, shape: JacobiShape, exact: bool, whole: bool = False) -> tuple[int, int]:
    """(band start, keys) for the forward at committed `length`: exactly length + W + 1 keys (devices that never
    capture), the whole cache (`whole`: one variant for an Inductor-compiled iteration), or rounded so one value
    serves every length of a `SLOT_BUCKET`-wide band; the start is where a capture of that band warms up."""
    extent = shape.extent
    if exact:
        return length, length + extent
    if whole:
        return 0, shape.slots
    return length // SLOT_BUCKET * SLOT_BUCKET, band_window(length, extent, shape.slots)


def jacobi_bands(shape: JacobiShape) -> list[tuple[int, int]]:
    """Every bucketed variant a cache of `shape.slots` slots can use (one captured graph each)."""
    return [jacobi_window(start, shape, exact=False) for start in band_starts(shape.slots - shape.queries)]


def draft_offsets(shape: JacobiShape, device: torch.device) -> torch.Tensor:
    """(drafts,) offsets past the frontier of every draft: the frontier's 0 .. W-1, then each lower-row
    window's, row by row."""
    return _offsets(shape, device, shape.window)


def query_offsets(shape: JacobiShape, device: torch.device) -> torch.Tensor:
    """(queries,) the offset each query predicts: query i reads the token at offset i - 1 (the frontier's
    first reads the last emitted token) and predicts offset i; the frontier's W + 1, then the lower windows'."""
    return _offsets(shape, device, shape.window + 1)


def _offsets(shape: JacobiShape, device: torch.device, frontier: int) -> torch.Tensor:
    """0 .. frontier - 1, then offset j x (row stride + row_offset) + c of every lower window j, column c."""
    ahead = torch.arange(frontier, device=device)
    if not shape.far_starts:
        return ahead
    step = shape.stride + shape.config.column_offset
    rows = torch.arange(1, len(shape.far_starts) + 1, device=device)
    cols = torch.arange(shape.config.row_window, device=device)
    return torch.cat([ahead, (rows[:, None] * step + cols[None]).reshape(-1)])  # (R-1, w) -> flat


def query_blocks(shape: JacobiShape, device: torch.device) -> torch.Tensor:
    """(queries,) the window each query belongs to: 0 for the frontier's, j for row j's; with `row_causal` a
    lower window's queries see the committed tokens and their own window only (they propose, nothing more)."""
    frontier = torch.zeros(shape.window + 1, dtype=torch.long, device=device)
    if not shape.lower:
        return frontier
    rows = torch.arange(1, shape.lower + 1, device=device)
    far = rows[:, None].expand(-1, shape.config.row_window).reshape(-1)  # x w -> flat
    return torch.cat([frontier, far])

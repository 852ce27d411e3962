"""How a Jacobi decoder drafts and judges (`JacobiConfig`: window, initialisation, coupled / continued drafts,
proactive candidates, 2-D rows, relaxed or grouped acceptance), validated when made, and the 2-D geometries an
`auto` run tries (`ROW_GEOMETRIES`, `LOSSLESS_GEOMETRIES`). `candidate_geometries` lists the integer-window
configurations a run may end up with: the auto search decodes each, the memory planner reserves for the
largest. Settings only: no tensors.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ...errors import ConfigError
from ..acceptance.relaxation import EXACT_RULES, Grouping, Relaxation, relaxes

INITS = ("random", "sample_left", "repeat_left", "repeat_above")


@dataclass(frozen=True)
class JacobiConfig:
    """window: drafts verified per forward (besides the last emitted token), or "auto" (chosen up to
    `max_window` from this machine's cost curve). `relaxation` (LANTERN delta / lambda) or `grouping` (GSD)
    make it lossy; neither is lossless SJD."""

    window: int | str = 8
    coupled: bool = False  # SCD: Gumbel-max drafts from a per-position noise table
    init: str = "random"  # how positions entering the window are drafted
    relaxation: Relaxation | None = None
    grouping: Grouping | None = None
    max_window: int = 32
    rows: int = 1  # draft windows open: the frontier's plus rows - 1 on the image rows below it (2-D drafting)
    row_window: int = 4  # drafts per lower-row window
    row_offset: int | None = None  # where row j's window starts: j x (row stride + row_offset) past the frontier
    # (default -row_window - 1: it ends one column left of the column below the frontier, so the tokens above
    # it and above-right of it are committed)
    continuation: bool = False  # SJD-PAC's adaptive continuation: a Jacobi update keeps the current draft with
    # probability min(1, p / q) (else a residual draw), a maximal coupling; uncoupled drafts only. Under the
    # AR-identical rule every draft is AR's race with its position's noise, which is that coupling already
    row_causal: bool = False  # lower windows see the committed tokens and their own window only (PJD's mask);
    # else every earlier token the forward holds (the frontier's drafts and the windows above), in raster order
    row_commit: bool = False  # relaxed 2-D (Parallel-Jacobi style, lossy): each lower row keeps its own front,
    # judges its window there against what it sees and commits its accepted drafts before the frontier arrives
    row_lead: int = 1  # with row_commit: a lower row commits column c only once the row above holds c + row_lead
    auto_rows: bool = False  # rows, row_window (and for lossless 2-D row_offset) chosen per machine on scratch images
    proactive: int = 1  # proactive drafting (SJD-PAC's tree, `jacobi/proactive.py`): candidates at each of the first
    # `proactive_depth` positions past the frontier, judged by recursive rejection sampling (lossless); 1 = off
    proactive_depth: int = 3
    exact_rule: str = "same_as_ar"  # lossless windows: accept only AR's own draws ("residual": min(1, p/q))

    @property
    def same_as_ar(self) -> bool:
        """Whether the window is judged by AR's own draws (`judge_same_as_ar`, with proactive leaves
        `judge_leaves_same_as_ar`): the exact rule without row commits and `exact_rule` "same_as_ar" (sampled
        runs only). Its drafts race with AR's position noise; continuation's keep-or-redraw coupling is then the
        race itself and changes nothing (it applies under "residual")."""
        return (not relaxes(self.relaxation) and not relaxes(self.grouping) and self.exact_rule == "same_as_ar"
                and not self.row_commit)

    def __post_init__(self) -> None:
        if self.exact_rule not in EXACT_RULES:
            raise ConfigError("jacobi exact_rule", f"one of {list(EXACT_RULES)}", self.exact_rule)
        if self.window != "auto" and (isinstance(self.window, bool) or not isinstance(self.window, int)
                                      or not 1 <= self.window <= 256):
            raise ConfigError("jacobi window", "an integer in 1..256 or 'auto'", self.window)
        if isinstance(self.max_window, bool) or not isinstance(self.max_window, int) or not 1 <= self.max_window <= 256:
            raise ConfigError("jacobi max_window", "an integer in 1..256", self.max_window)
        if self.init not in INITS:
            raise ConfigError("jacobi init", f"one of {INITS}", self.init)
        for name, value, low, high in (("jacobi rows", self.rows, 1, 8), ("jacobi row_window", self.row_window, 1, 64)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigError(name, f"an integer in {low}..{high}", value)
        if self.row_offset is not None and (isinstance(self.row_offset, bool) or not isinstance(self.row_offset, int)):
            raise ConfigError("jacobi row_offset", "an integer (columns; negative = left of the frontier's)",
                              self.row_offset)
        if isinstance(self.row_lead, bool) or not isinstance(self.row_lead, int) or not 0 <= self.row_lead <= 64:
            raise ConfigError("jacobi row_lead", "an integer in 0..64 (columns the row above stays ahead)", self.row_lead)
        if self.row_commit and self.rows < 2:
            raise ConfigError("jacobi row_commit", "rows >= 2 (lower rows to commit)", {"rows": self.rows},
                              "open at least one lower row, or turn row_commit off")
        if self.continuation and self.coupled:
            raise ConfigError("jacobi continuation", "uncoupled drafts (continuation is itself a coupling)",
                              {"continuation": True, "coupled": True}, "use sjd with continuation, or sjd_coupled")
        if self.relaxation is not None and self.grouping is not None:
            raise ConfigError("jacobi acceptance", "at most one of relaxation (LANTERN) or grouping (GSD)",
                              {"relaxation": self.relaxation, "grouping": self.grouping})
        for name, value, low, high in (("jacobi proactive", self.proactive, 1, 8),
                                       ("jacobi proactive_depth", self.proactive_depth, 1, 16)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigError(name, f"an integer in {low}..{high}", value)
        if self.proactive > 1 and (self.relaxation is not None or self.grouping is not None or self.row_commit):
            raise ConfigError("jacobi proactive", "the exact Jacobi rule (sjd, sjd_coupled, lossless 2-D)",
                              {"proactive": self.proactive, "relaxed": self.relaxation is not None
                               or self.grouping is not None, "row_commit": self.row_commit},
                              "set proactive to 1 with relaxed acceptance or relaxed 2-D decoding")

    @property
    def column_offset(self) -> int:
        """Columns between the column below the frontier and the start of the next row's window."""
        return -self.row_window - 1 if self.row_offset is None else self.row_offset

    def far_starts(self, window: int, stride: int) -> tuple[int, ...]:
        """Offsets (past the frontier) where each lower row's window starts, for a frontier `window` on rows of
        `stride` tokens; checked so that no two windows overlap."""
        step = stride + self.column_offset
        starts = tuple(j * step for j in range(1, self.rows))
        if self.rows > 1 and (starts[0] < window or (self.rows > 2 and step < self.row_window)):
            raise ConfigError("jacobi row geometry",
                              f"lower-row windows past the frontier's {window} drafts and apart by >= row_window "
                              f"{self.row_window} (row stride {stride} + row_offset >= max(window, row_window))",
                              {"rows": self.rows, "row_window": self.row_window, "row_offset": self.column_offset,
                               "window": window, "row stride": stride},
                              "open fewer rows, draft a smaller window, or start the lower windows further right "
                              "(a larger row_offset)")
        return starts

    def largest_window(self, stride: int) -> int:
        """The widest frontier window "auto" may choose: `max_window`, and with lower-row windows no wider than
        the offset where the first of them starts."""
        if self.rows == 1:
            return self.max_window
        if self.row_commit:  # the frontier's window stays inside its row
            return max(1, min(self.max_window, stride - 1))
        return max(1, min(self.max_window, stride + self.column_offset))

    def tree_depth(self, window: int) -> int:
        """Positions past the frontier that carry proactive candidates with a frontier `window` (0: off)."""
        return 0 if self.proactive == 1 else min(self.proactive_depth, window)

    def leaves(self, window: int) -> int:
        """Extra candidates proactive drafting adds to a forward with a frontier `window`: K - 1 at each of the
        `tree_depth` positions."""
        return (self.proactive - 1) * self.tree_depth(window)

    def extra_drafts(self, window: int) -> int:
        """Drafts a forward carries besides the frontier's `window` and its last token: the lower rows' windows
        and the proactive leaves."""
        return (self.rows - 1) * self.row_window + self.leaves(window)

    @property
    def neighbor_k(self) -> int:
        """Latent neighbours per token the acceptance rule reads (0: no table needed)."""
        rule = self.relaxation or self.grouping
        return 0 if rule is None else rule.k

    def describe(self, window: int | str | None = None) -> str:
        """e.g. "coupled jacobi w12 (sample-left init), lantern k10 lambda 5"; `window` overrides "auto"."""
        kind = "coupled " if self.coupled else "continued " if self.continuation else ""
        name = f"{kind}jacobi w{window or self.window} ({self.init.replace('_', '-')} init)"
        if self.rows > 1 and self.row_commit:
            name += (f", relaxed 2-D (lossy): {self.rows} rows x w{self.row_window} lead {self.row_lead}"
                     f"{' row-causal' if self.row_causal else ''}")
        elif self.rows > 1:
            name += (f", 2-D: {self.rows} rows x w{self.row_window} offset {self.column_offset:+d}"
                     f"{' row-causal' if self.row_causal else ''}")
        if self.proactive > 1:
            name += f", proactive {self.proactive} x depth {self.proactive_depth}"
        if self.auto_rows:
            name += " (auto geometry)"
        if self.relaxation is not None:
            r = self.relaxation
            name += f", lantern k{r.k} " + (f"delta {r.delta:g}" if r.delta is not None else f"lambda {r.lam:g}")
        if self.grouping is not None:
            name += f", gsd group k{self.grouping.k} gap {self.grouping.gap:g}"
        return name


ROW_GEOMETRIES = ((3, 4), (4, 2), (4, 4), (6, 3), (6, 6), (8, 2), (8, 4))  # (rows, row_window) relaxed 2-D tries
LOSSLESS_GEOMETRIES = ((1, 4, -5), (2, 16, -1), (2, 8, -1), (3, 4, -5))  # (rows, row_window, row_offset) for sjd


def candidate_geometries(config: JacobiConfig, stride: int) -> list[JacobiConfig]:
    """The integer-window configurations a run of `config` may decode with, on image rows of `stride` tokens:
    the user's window, or the widest an "auto" window may pick; with an auto geometry (`auto_rows`), one per
    geometry the search tries: relaxed 2-D rows (`row_commit`) every `ROW_GEOMETRIES` entry at the frontier's
    window, the lossless modes every `LOSSLESS_GEOMETRIES` entry whose windows fit these rows, each at its own
    widest window (or the user's). Every other field is `config`'s. The auto search decodes each
    (`auto.py`); the memory planner reserves for the largest (`reservation.py`)."""
    def widest(c: JacobiConfig) -> JacobiConfig:
        return c if c.window != "auto" else replace(c, window=c.largest_window(stride))
    if not config.auto_rows:
        return [widest(config)]
    if config.row_commit:
        window = widest(config).window
        return [replace(config, window=window, rows=rows, row_window=row_window) for rows, row_window in ROW_GEOMETRIES]
    candidates = []
    for rows, row_window, offset in LOSSLESS_GEOMETRIES:
        candidate = widest(replace(config, rows=rows, row_window=row_window, row_offset=offset))
        try:
            candidate.far_starts(candidate.window, stride)
        except ConfigError:
            continue  # this geometry does not fit these rows (or the user's window)
        candidates.append(candidate)
    return candidates

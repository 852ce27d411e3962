"""The decoding modes offered by the nodes and the command line, and the one place that turns their settings
(mode, tree, chain length, custom tree, lantern_k, delta, lambda, EAGLE-2 shape, Jacobi window / init / rule,
GSD gap) into a `SpeculativeConfig` or `JacobiConfig`, with errors that name the parameter. Both front ends
call it, so they accept and refuse the same values with the same messages. It does not load drafters or
models."""
from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import ConfigError, LanternError, check_choice
from .acceptance.relaxation import Grouping, Relaxation
from .jacobi.config import INITS, JacobiConfig
from .trees.config import SpeculativeConfig
from .trees.drafting import DynamicShape
from .trees.specs import STATIC_TREES, TreeSpec, chain_tree

MODES = {
    "ar": "plain autoregressive decoding, one forward pass per token (the reference)",
    "eagle2": "EAGLE-2 dynamic draft tree, exact (lossless) acceptance",
    "static_tree": "static draft tree, children sampled without replacement, exact (lossless) acceptance",
    "lantern": "LANTERN: EAGLE-2 tree with relaxed acceptance; latent neighbours share a total-variation budget delta",
    "lantern_pp": "LANTERN++: static tree with relaxed acceptance bounded by lambda x the target probability",
    "sjd": "speculative Jacobi decoding: no drafter, any model; the model drafts a window of future tokens "
           "itself; exact (lossless)",
    "sjd_coupled": "coupled SJD: like sjd, with drafts tied to a per-position noise table so they settle faster; "
                   "exact (lossless)",
    "sjd_relaxed": "relaxed Jacobi: coupled SJD with relaxed acceptance (sjd_relaxation: LANTERN delta, "
                   "LANTERN++ lambda or GSD groups); not lossless",
    "sjd_2d_relaxed": "relaxed 2-D Jacobi (Parallel-Jacobi style): coupled draft windows on several image rows at "
                      "once, each row committing its own accepted tokens before the frontier reaches them; the "
                      "fastest mode without a drafter; not lossless",
}
JACOBI_MODES = ("sjd", "sjd_coupled", "sjd_relaxed", "sjd_2d_relaxed")
RELAXED_2D_ROWS = 6  # placeholder rows of sjd_2d_relaxed's auto geometry (jacobi_rows left at 1)
SJD_RELAXATIONS = ("lantern_pp", "lantern", "gsd")
TREES = ["auto", *STATIC_TREES, "chain", "custom"]
CUSTOM_TREE_MAX_NODES = 512  # as many as eagle_nodes allows
CUSTOM_TREE_MAX_DEPTH = 64  # as deep as a dynamic tree may be


@dataclass(frozen=True)
class JacobiWidgets:
    """The Jacobi widgets: window (0 = auto), initialisation, relaxed rule, GSD's probability gap, and the 2-D
    row geometry (draft windows open, drafts per lower-row window, its column offset, the lower windows' mask)."""

    window: int = 0
    init: str = "sample_left"
    relaxation: str = "lantern_pp"
    gsd_gap: float = 0.15
    rows: int = 1
    row_window: int = 4
    row_offset: int = -5
    row_causal: bool = False
    continuation: bool = False  # sjd only: SJD-PAC's adaptive continuation
    row_lead: int = 0  # sjd_2d_relaxed: columns the row above stays ahead of a committing row
    proactive: int = 1  # sjd, sjd_coupled: proactive candidates per position (1 = off)


def parse_custom_tree(text: str) -> TreeSpec:
    """'[[0], [1], [0, 0]]' (child ranks from the root, as in EAGLE's choices.py) -> TreeSpec."""
    try:
        paths = json.loads(text)
        if not isinstance(paths, list) or not paths or not all(isinstance(p, list) for p in paths):
            raise ValueError("not a non-empty list of lists")
        if len(paths) > CUSTOM_TREE_MAX_NODES or max(map(len, paths)) > CUSTOM_TREE_MAX_DEPTH:
            raise ValueError(f"{len(paths)} nodes, depth {max(map(len, paths))}: at most {CUSTOM_TREE_MAX_NODES} "
                             f"nodes and depth {CUSTOM_TREE_MAX_DEPTH}")
        return TreeSpec("custom", tuple(tuple(int(r) for r in p) for p in paths))
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:  # RecursionError: nesting too deep
        raise ConfigError("custom_tree", "a JSON list of paths of child ranks, e.g. [[0], [1], [0, 0]]",
                          text[:80], f"fix the JSON ({str(exc)[:300]})") from exc


def check_number(name: str, value, low: float, high: float, what: str) -> None:
    """A float widget in [low, high]; NaN fails too (it passes ComfyUI's min/max check)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ConfigError(name, f"{what} in [{low:g}, {high:g}]", value)


def check_widgets(mode, tree, delta, lam, jacobi: JacobiWidgets) -> None:
    """Every choice and float widget, whether or not the mode reads it."""
    check_choice("mode", mode, MODES)
    check_choice("tree", tree, TREES)
    check_choice("jacobi_init", jacobi.init, INITS)
    check_choice("sjd_relaxation", jacobi.relaxation, SJD_RELAXATIONS)
    check_number("delta", delta, 0.0, 1.0, "a total-variation budget")
    check_number("lambda", lam, 1.0, 100.0, "a multiplicative bound")
    check_number("gsd_gap", jacobi.gsd_gap, 0.0, 1.0, "a GSD group gap (probability difference)")


def build_jacobi(mode: str, jacobi: JacobiWidgets, lantern_k: int, delta: float, lam: float) -> JacobiConfig:
    """The Jacobi modes' widgets -> JacobiConfig (validated, naming the widget)."""
    if jacobi.init not in INITS:
        raise ConfigError("jacobi_init", f"one of {list(INITS)}", jacobi.init)
    if jacobi.relaxation not in SJD_RELAXATIONS:
        raise ConfigError("sjd_relaxation", f"one of {list(SJD_RELAXATIONS)}", jacobi.relaxation)
    if not 0 <= jacobi.window <= 256:
        raise ConfigError("jacobi_window", "0 (auto) or a window of 1..256 drafted tokens", jacobi.window)
    relaxation = grouping = None
    if mode == "sjd_relaxed":
        if lantern_k < 1:
            raise ConfigError("lantern_k", "an integer >= 1 (latent neighbours per token)", lantern_k)
        if jacobi.relaxation == "lantern":
            relaxation = Relaxation(k=lantern_k, delta=delta)
        elif jacobi.relaxation == "lantern_pp":
            relaxation = Relaxation(k=lantern_k, lam=lam)
        else:
            grouping = Grouping(k=lantern_k, gap=jacobi.gsd_gap)
    for name, value, low, high in (("jacobi_rows", jacobi.rows, 0, 8), ("jacobi_row_window", jacobi.row_window, 1, 64),
                                   ("jacobi_row_offset", jacobi.row_offset, -64, 64), ("row_lead", jacobi.row_lead, 0, 64),
                                   ("jacobi_proactive", jacobi.proactive, 1, 8)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigError(name, f"an integer in {low}..{high}", value)
    if mode == "sjd_2d_relaxed":  # lower rows commit at their own fronts; jacobi_rows 1: an auto geometry
        return JacobiConfig(window=jacobi.window or "auto", coupled=True, init=jacobi.init,
                            rows=jacobi.rows if jacobi.rows > 1 else RELAXED_2D_ROWS, row_window=jacobi.row_window,
                            row_causal=bool(jacobi.row_causal), row_commit=True, row_lead=jacobi.row_lead,
                            auto_rows=jacobi.rows <= 1)
    return JacobiConfig(window=jacobi.window or "auto", coupled=mode != "sjd", init=jacobi.init,
                        relaxation=relaxation, grouping=grouping, rows=max(jacobi.rows, 1), auto_rows=jacobi.rows == 0,
                        row_window=jacobi.row_window,
                        row_offset=jacobi.row_offset, row_causal=bool(jacobi.row_causal),
                        continuation=bool(jacobi.continuation) and mode == "sjd",
                        proactive=jacobi.proactive if mode in ("sjd", "sjd_coupled") else 1)


@dataclass(frozen=True)
class ModeSpec:
    """A decoding mode's settings, built: the config its decoder takes (None for ar) and a short label."""

    mode: str
    spec: SpeculativeConfig | JacobiConfig | None
    label: str

    @property
    def needs_drafter(self) -> bool:
        return isinstance(self.spec, SpeculativeConfig)

    @property
    def neighbor_k(self) -> int:
        """Latent neighbours per token the acceptance rule reads (0: no table)."""
        if isinstance(self.spec, JacobiConfig):
            return self.spec.neighbor_k
        if isinstance(self.spec, SpeculativeConfig) and self.spec.relaxation is not None:
            return self.spec.relaxation.k
        return 0


@dataclass(frozen=True)
class ModeSettings:
    """What a person chose: the mode and every setting a mode may read (the node's widgets, the command
    line's options). Every choice and float is checked on creation, whether or not the mode reads it,
    with errors that name the parameter."""

    mode: str = "ar"
    tree: str = "auto"
    chain_length: int = 4
    custom_tree: str = "[[0], [1], [0, 0], [0, 0, 0]]"
    lantern_k: int = 1000
    delta: float = 0.1
    lam: float = 5.0
    eagle: DynamicShape = DynamicShape()
    jacobi: JacobiWidgets = JacobiWidgets()

    def __post_init__(self) -> None:
        check_widgets(self.mode, self.tree, self.delta, self.lam, self.jacobi)


def build_mode(settings: ModeSettings, vocab: int | None = None, has_drafter: bool = True) -> ModeSpec:
    """Settings -> ModeSpec (validated; raises LanternError naming the parameter). `vocab` (the drafter's or
    model's codebook size) bounds lantern_k for the tree modes; `has_drafter` False refuses the modes that
    need one, saying how to give one."""
    mode, lantern_k, eagle = settings.mode, settings.lantern_k, settings.eagle
    if mode == "ar":
        return ModeSpec("ar", None, "ar")
    if mode in JACOBI_MODES:
        config = build_jacobi(mode, settings.jacobi, lantern_k, settings.delta, settings.lam)
        return ModeSpec(mode, config, config.describe())
    if not has_drafter:
        raise LanternError(f"mode '{mode}' needs a drafter: connect Lantern: Load Drafter to 'drafter' "
                           "(command line: --drafter FOLDER; or choose mode 'ar' or an sjd mode)")
    tree = settings.tree
    if mode in ("eagle2", "lantern"):
        kind, static, label = "dynamic", STATIC_TREES["naive_extend_57"], f"eagle2 d{eagle.depth} k{eagle.top_k} n{eagle.nodes}"
    elif tree == "custom":
        kind, static = "static", parse_custom_tree(settings.custom_tree)
        label = f"custom ({static.num_nodes} nodes)"
    elif tree == "chain":
        kind, static, label = "static", chain_tree(settings.chain_length), f"chain_{settings.chain_length}"
    elif tree == "auto":
        kind, static, label = "auto", STATIC_TREES["naive_extend_57"], "auto"
    else:
        kind, static, label = "static", STATIC_TREES[tree], tree
    if mode in ("lantern", "lantern_pp") and vocab is not None and not 1 <= lantern_k < vocab:
        raise ConfigError("lantern_k", f"an integer in 1..{vocab - 1} (neighbours per token; codebook size - 1)",
                          lantern_k)
    relaxation = None
    if mode == "lantern":
        relaxation = Relaxation(k=lantern_k, delta=settings.delta)
    elif mode == "lantern_pp":
        relaxation = Relaxation(k=lantern_k, lam=settings.lam)
    spec = SpeculativeConfig(tree=kind, static_tree=static, dynamic=eagle, relaxation=relaxation)
    return ModeSpec(mode, spec, label)

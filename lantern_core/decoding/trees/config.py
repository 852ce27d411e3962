"""How a tree decoder drafts and accepts (`SpeculativeConfig`: static, dynamic EAGLE-2 or `auto` tree; exact or
LANTERN-relaxed), and the check, before any forward, that a tree never drafts more children under one node than
the target has codes to draw from. Settings only: no tensors.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ...errors import ConfigError
from ...layout import draftable_codes
from ..acceptance.relaxation import EXACT_RULES, Relaxation
from .drafting import DynamicShape
from .specs import NAIVE_EXTEND_57, TreeSpec


@dataclass(frozen=True)
class SpeculativeConfig:
    """How to draft and accept. `tree` "static" uses `static_tree`; "dynamic" is EAGLE-2 with `dynamic`;
    "auto" picks the best sub-tree of `static_tree` for this machine (`trees/auto.py`), calibrating on the
    first image of the first run per drafter and sampling setting. `relaxation` None is exact (lossless);
    a Relaxation with delta is LANTERN, with lam LANTERN++.

    `exact_rule` says how a lossless tree accepts sampled drafts: "same_as_ar" (the default) accepts a
    drafted token only where it equals the target's own draw at that position (the Gumbel race AR runs with
    the image's position noise), so the image is AR's for the seed; "residual" is the multi-draft
    speculative-sampling rule (accept x with min(1, p/q), redraw from the residual), which samples AR's
    law but another image. Relaxed rules (delta > 0, lambda > 1) keep their own tests."""

    tree: Literal["static", "dynamic", "auto"] = "static"
    static_tree: TreeSpec = NAIVE_EXTEND_57
    dynamic: DynamicShape = DynamicShape()
    relaxation: Relaxation | None = None
    exact_rule: Literal["same_as_ar", "residual"] = "same_as_ar"

    def __post_init__(self) -> None:
        if self.tree not in ("static", "dynamic", "auto"):
            raise ConfigError("tree", "'static', 'dynamic' or 'auto'", self.tree)
        if self.exact_rule not in EXACT_RULES:
            raise ConfigError("exact_rule", f"one of {list(EXACT_RULES)}", self.exact_rule)
        d = self.dynamic
        if not (1 <= d.depth <= 64 and 1 <= d.top_k <= 64 and 1 <= d.nodes <= d.top_k + (d.depth - 1) * d.top_k ** 2):
            raise ConfigError("dynamic tree", "depth 1..64, top_k 1..64 and 1 <= nodes <= top_k + (depth-1)*top_k^2",
                              d)

    @property
    def max_nodes(self) -> int:
        return self.dynamic.nodes if self.tree == "dynamic" else self.static_tree.num_nodes

    @property
    def depth(self) -> int:
        return self.dynamic.depth if self.tree == "dynamic" else self.static_tree.depth

    @property
    def cache_spare(self) -> int:
        """KV slots past the image that a step needs: the verified nodes (+ root), and for EAGLE-2 the
        drafter's depth x top_k expanded candidates, however few of them are kept."""
        drafted = self.dynamic.depth * self.dynamic.top_k if self.tree == "dynamic" else 0
        return max(self.max_nodes, drafted) + 2


def check_tree_fits(spec: SpeculativeConfig, config) -> None:
    """Refuse, before any forward, a tree that drafts more children under one node than the target `config`
    has codes a draft can pick (children are drawn without replacement from the vocabulary: a static tree's
    widest node, EAGLE-2's top_k per expanded node). The error names the tree, its widest node's child count and the vocabulary size,
    and the fix. Reads settings only, no tensor; trees of at most that many children per node run (children
    a top-k / top-p filter leaves no mass for are drawn last and never accepted)."""
    V = draftable_codes(config)
    codes = f"{V} image codes a draft can pick" + (
        f": {config.vocab_size} less the forced end-of-row code" if config.row_end else "")
    if spec.tree == "dynamic":
        d = spec.dynamic
        if d.top_k > V:
            nodes = min(d.nodes, V + (d.depth - 1) * V ** 2)
            raise ConfigError(f"dynamic tree 'eagle2 d{d.depth} k{d.top_k} n{d.nodes}'",
                              f"a top_k of at most {V} children per node (the vocabulary size, {codes})",
                              f"top_k {d.top_k}: {d.top_k} children under every expanded node",
                              f"lower eagle_top_k (command line: --eagle-top-k) to at most {V}"
                              + ("" if nodes == d.nodes else f" and eagle_nodes (--eagle-nodes) to at most {nodes}")
                              + ", or use a model with a larger vocabulary")
    elif spec.static_tree.widest > V:
        tree = spec.static_tree
        base = " (the base tree of 'auto')" if spec.tree == "auto" else ""
        raise ConfigError(f"tree '{tree.name}'{base}",
                          f"at most {V} children under any node (the vocabulary size, {codes})",
                          f"{tree.widest} children under its widest node",
                          f"choose a narrower tree (at most {V} children per node, e.g. tree 'chain' or a "
                          "'custom' tree) or a model with a larger vocabulary")

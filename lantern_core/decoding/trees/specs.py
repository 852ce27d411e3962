"""Static draft trees (LANTERN++ / EAGLE-1 style) as data: a `TreeSpec` lists root-to-node paths of child
ranks; `build_tree_buffers` turns it into the tensors a verifier needs (parents, depths, the ancestor
mask for tree attention, root-to-leaf retrieval paths). Pure functions, no model code; drafting and
verification use these buffers, they never rebuild them.

Node 0 is the root (the last accepted token); nodes 1..n are ordered by depth, then by path.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import ConfigError


@dataclass(frozen=True)
class TreeSpec:
    name: str
    paths: tuple[tuple[int, ...], ...]  # each node as the child ranks from the root, e.g. (0, 2)

    def __post_init__(self) -> None:
        paths = tuple(sorted({tuple(int(r) for r in p) for p in self.paths}, key=lambda p: (len(p), p)))
        if len(paths) != len(self.paths):
            raise ConfigError(f"tree '{self.name}'", "distinct paths", "duplicates")
        present = set(paths)
        for p in paths:
            if not p or min(p) < 0:
                raise ConfigError(f"tree '{self.name}'", "non-empty paths of ranks >= 0", p)
            if len(p) > 1 and p[:-1] not in present:
                raise ConfigError(f"tree '{self.name}'", f"the parent {list(p[:-1])} of every node", list(p),
                                  "list every prefix of a path as its own node")
            if p[-1] > 0 and p[:-1] + (p[-1] - 1,) not in present:
                raise ConfigError(f"tree '{self.name}'", "child ranks without gaps (rank r needs rank r-1)", list(p))
        object.__setattr__(self, "paths", paths)

    @property
    def num_nodes(self) -> int:
        """Drafted nodes, root excluded."""
        return len(self.paths)

    @property
    def depth(self) -> int:
        return max(len(p) for p in self.paths)

    @property
    def widest(self) -> int:
        """Most children under one node, the root included (ranks have no gaps: the largest rank + 1)."""
        return max(p[-1] for p in self.paths) + 1

    def nodes_per_depth(self) -> list[int]:
        return [sum(1 for p in self.paths if len(p) == d) for d in range(1, self.depth + 1)]


@dataclass
class TreeBuffers:
    parents: torch.Tensor  # (n+1,) long, -1 for the root
    depths: torch.Tensor  # (n+1,) long, 0 for the root: RoPE offset of each node
    ranks: torch.Tensor  # (n+1,) long, child rank under the parent (0 for the root)
    mask: torch.Tensor  # (n+1, n+1) bool: mask[i, j] iff j is i or an ancestor of i
    retrieve: torch.Tensor  # (leaves, depth+1) long: node ids from the root to each leaf, -1 padded


def chain_tree(length: int) -> TreeSpec:
    """A single path of `length` drafted tokens (plain speculative decoding)."""
    if length < 1:
        raise ConfigError("chain length", "an integer >= 1", length)
    return TreeSpec(f"chain_{length}", tuple(tuple([0] * d) for d in range(1, length + 1)))


def build_tree_buffers(spec: TreeSpec) -> TreeBuffers:
    index = {(): 0} | {p: i + 1 for i, p in enumerate(spec.paths)}
    n = len(index)
    parents = torch.full((n,), -1, dtype=torch.long)
    depths = torch.zeros(n, dtype=torch.long)
    ranks = torch.zeros(n, dtype=torch.long)
    mask = torch.eye(n, dtype=torch.bool)
    for path, i in index.items():
        if not path:
            continue
        parents[i] = index[path[:-1]]
        depths[i] = len(path)
        ranks[i] = path[-1]
        for k in range(len(path)):
            mask[i, index[path[:k]]] = True
    has_child = {p[:-1] for p in spec.paths}
    leaves = [p for p in spec.paths if p not in has_child]
    retrieve = torch.full((len(leaves), spec.depth + 1), -1, dtype=torch.long)
    for row, leaf in enumerate(leaves):
        for k in range(len(leaf) + 1):
            retrieve[row, k] = index[leaf[:k]]
    return TreeBuffers(parents, depths, ranks, mask, retrieve)


def _ranks(prefix: tuple[int, ...], count: int) -> list[tuple[int, ...]]:
    return [prefix + (r,) for r in range(count)]


# LANTERN++'s default tree for LlamaGen and Anole: 57 nodes, 5/13/16/14/9 per depth.
NAIVE_EXTEND_57 = TreeSpec("naive_extend_57", tuple(
    _ranks((), 5)
    + _ranks((0,), 4) + _ranks((1,), 3) + _ranks((2,), 3) + _ranks((3,), 2) + _ranks((4,), 1)
    + _ranks((0, 0), 4) + _ranks((0, 1), 3) + _ranks((0, 2), 3) + _ranks((0, 3), 2) + _ranks((1, 0), 2)
    + _ranks((1, 1), 1) + _ranks((2, 0), 1)
    + _ranks((0, 0, 0), 4) + _ranks((0, 0, 1), 3) + _ranks((0, 0, 2), 2) + _ranks((0, 0, 3), 1)
    + _ranks((0, 1, 0), 2) + _ranks((0, 1, 1), 1) + _ranks((0, 2, 0), 1)
    + _ranks((0, 0, 0, 0), 3) + _ranks((0, 0, 0, 1), 2) + _ranks((0, 0, 1, 0), 2) + _ranks((0, 0, 1, 1), 1)
    + _ranks((0, 0, 2, 0), 1)
))

# EAGLE-1's default tree (LANTERN++'s default for Lumina-mGPT): 25 nodes, 4/8/8/3/2 per depth.
MC_SIM_7B_63 = TreeSpec("mc_sim_7b_63", tuple(
    _ranks((), 4)
    + _ranks((0,), 3) + _ranks((1,), 2) + _ranks((2,), 2) + _ranks((3,), 1)
    + _ranks((0, 0), 3) + _ranks((0, 1), 2) + _ranks((0, 2), 2) + _ranks((1, 0), 1)
    + _ranks((0, 0, 0), 3)
    + _ranks((0, 0, 0, 0), 2)
))

STATIC_TREES = {t.name: t for t in (NAIVE_EXTEND_57, MC_SIM_7B_63)}

"""Static draft trees: the published shapes, buffer invariants, and a chain reproducing the causal mask."""
import pytest
import torch

from lantern_core.errors import ConfigError
from lantern_core.decoding.trees.specs import MC_SIM_7B_63, NAIVE_EXTEND_57, TreeSpec, build_tree_buffers, chain_tree


@pytest.mark.parametrize("spec,per_depth,max_rank", [(NAIVE_EXTEND_57, [5, 13, 16, 14, 9], 4),
                                                     (MC_SIM_7B_63, [4, 8, 8, 3, 2], 3)])
def test_published_tree_shapes(spec, per_depth, max_rank):
    assert spec.nodes_per_depth() == per_depth and spec.num_nodes == sum(per_depth)
    assert max(max(p) for p in spec.paths) == max_rank


@pytest.mark.parametrize("spec", [NAIVE_EXTEND_57, MC_SIM_7B_63, chain_tree(3)], ids=lambda s: s.name)
def test_buffers_are_consistent(spec):
    b = build_tree_buffers(spec)
    n = spec.num_nodes + 1
    assert b.mask.shape == (n, n) and bool(b.mask.diagonal().all())
    for i in range(1, n):
        p = int(b.parents[i])
        assert b.depths[i] == b.depths[p] + 1
        assert torch.equal(b.mask[i], b.mask[p] | (torch.arange(n) == i))  # ancestors of the parent, plus self
    # every node lies on some retrieved root-to-leaf path, and each path walks parent links
    assert set(b.retrieve[b.retrieve >= 0].tolist()) == set(range(n))
    for row in b.retrieve:
        ids = [int(x) for x in row if x >= 0]
        assert ids[0] == 0 and all(int(b.parents[c]) == p for p, c in zip(ids, ids[1:]))


def test_chain_tree_reproduces_the_causal_mask():
    b = build_tree_buffers(chain_tree(6))
    assert torch.equal(b.mask, torch.tril(torch.ones(7, 7, dtype=torch.bool)))
    assert b.depths.tolist() == list(range(7)) and b.retrieve.tolist() == [list(range(7))]


@pytest.mark.parametrize("paths,fragment", [([(0,), (0, 0), (0, 0)], "distinct"), ([(0, 1)], "parent"),
                                            ([(0,), (2,)], "without gaps"), ([()], "non-empty")])
def test_bad_trees_are_rejected(paths, fragment):
    with pytest.raises(ConfigError, match=fragment):
        TreeSpec("bad", tuple(paths))

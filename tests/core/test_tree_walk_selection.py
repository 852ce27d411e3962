"""Which path greedy LANTERN takes on a dynamic (EAGLE-2) tree when several siblings pass: LANTERN's released
rule (each root-to-leaf path accepts its longest passing prefix, the longest wins, ties go to the leaf created
first, so a shallower leaf can beat a deeper branch), on hand-computed trees for the delta and lambda rules.
Each case also shows the first-passing-sibling walk choosing otherwise, so the tests can fail."""
from __future__ import annotations

import pytest
import torch

from lantern_core.decoding.acceptance.relaxation import Relaxation
from lantern_core.decoding.trees.walk import walk_longest_path, walk_tree

V = 6
# token 2's nearest latent neighbours are 5 then 4; every other row lists two other tokens
NEIGHBORS = torch.tensor([[1, 2], [0, 3], [5, 4], [4, 0], [3, 5], [2, 4]])
# at the root, token 1 is the argmax (0.40) and token 2 (0.30) passes once relaxed: delta 0.2 absorbs its
# neighbour 5 (0.15 -> 0.45), lambda 2 absorbs 5 and 4 (0.23 -> 0.53); both beat 0.40
ROOT = [0.02, 0.40, 0.30, 0.05, 0.08, 0.15]
A_NODE = [0.90, 0.02, 0.02, 0.02, 0.02, 0.02]  # below A, token 3 fails (0.02, its neighbours 0.02 + 0.90 > budget)
B_NODE = [0.02, 0.02, 0.02, 0.02, 0.88, 0.04]  # below B, token 4 is the argmax
LEAF = [0.02, 0.02, 0.02, 0.02, 0.02, 0.90]
RULES = {"delta": Relaxation(k=2, delta=0.2), "lambda": Relaxation(k=2, lam=2.0)}


def tree(parents: list[int], tokens: list[int], targets: list[list[float]]):
    """One tree (G = 1) from parent ids (root -1) and node tokens, its children ranked in id order."""
    n1 = len(parents)
    depths, mask = [0] * n1, torch.eye(n1, dtype=torch.bool)
    for j in range(1, n1):
        depths[j] = depths[parents[j]] + 1
        mask[j] |= mask[parents[j]]
    children = torch.full((n1, 2), -1)
    for j in range(1, n1):
        rank = int((children[parents[j]] >= 0).sum())
        children[parents[j], rank] = j
    return dict(target=torch.tensor(targets).log()[None], parents=torch.tensor(parents)[None],
                depths=torch.tensor(depths)[None], mask=mask[None], children=children[None],
                tokens=torch.tensor(tokens)[None], depth=max(depths))


def both_walks(t, rule):
    longest = walk_longest_path(t["target"], t["parents"], t["depths"], t["mask"], t["tokens"], t["depth"], rule,
                                NEIGHBORS)
    first = walk_tree(t["target"], t["children"], t["tokens"], t["depth"], torch.zeros(1, t["depth"], 3),
                      greedy=True, rule=rule, neighbors=NEIGHBORS)
    return longest, first


@pytest.mark.parametrize("name", sorted(RULES))
def test_the_longest_accepted_path_wins_over_the_first_passing_sibling(name):
    # root -> A (token 1, rank 0) -> A1 (token 3, fails); root -> B (token 2, rank 1) -> B1 (token 4, passes)
    t = tree([-1, 0, 0, 1, 2], [0, 1, 2, 3, 4], [ROOT, A_NODE, B_NODE, LEAF, LEAF])
    longest, first = both_walks(t, RULES[name])
    assert longest.path.tolist() == [[0, 2, 4]] and longest.accepted.tolist() == [2]
    assert longest.bonus.tolist() == [5]  # the argmax of the target after B1
    assert float(longest.absorbed[0, 0]) > 0 and float(longest.absorbed[0, 1]) == 0.0  # B passed relaxed, B1 exactly
    assert first.path.tolist() == [[0, 1, -1]] and first.bonus.tolist() == [0]  # the other rule stops after A


@pytest.mark.parametrize("name", sorted(RULES))
def test_a_tie_goes_to_the_leaf_created_first(name):
    # root -> A (token 1, rank 0) -> A1 (token 3, fails, created after B); root -> B (token 2, a leaf)
    # both root-to-leaf paths accept one token; B's row comes first (B is the first leaf), so B wins
    t = tree([-1, 0, 0, 1], [0, 1, 2, 3], [ROOT, A_NODE, B_NODE, LEAF])
    longest, first = both_walks(t, RULES[name])
    assert longest.path.tolist() == [[0, 2, -1]] and longest.accepted.tolist() == [1]
    assert longest.bonus.tolist() == [4]  # the argmax of B's target
    assert first.path.tolist() == [[0, 1, -1]] and first.bonus.tolist() == [0]


def test_exact_greedy_is_unchanged():
    """Without relaxation only the argmax passes, so both walks agree (the path is unique)."""
    t = tree([-1, 0, 0, 1, 2], [0, 1, 2, 3, 4], [ROOT, A_NODE, B_NODE, LEAF, LEAF])
    longest, first = both_walks(t, None)
    assert longest.path.tolist() == first.path.tolist() == [[0, 1, -1]]
    assert longest.bonus.tolist() == first.bonus.tolist() == [0]


def test_relaxed_greedy_dynamic_decoding_uses_the_longest_path(monkeypatch):
    """The decoder routes greedy relaxed dynamic trees through it (and nothing else)."""
    import lantern_core.decoding.trees.iteration as tree_step
    from lantern_core.conditioning import Condition
    from lantern_core.config import SamplingConfig
    from lantern_core.decoding.trees.drafting import DynamicShape
    from lantern_core.decoding.acceptance.neighbors import build_neighbors
    from lantern_core.decoding.sampling import make_generators
    from lantern_core.decoding.trees.config import SpeculativeConfig
    from lantern_core.decoding.trees.driver import speculative_generate
    from tiny_models import TINY_C2I, random_drafter, random_gpt

    calls = []
    real = tree_step.walk_longest_path
    monkeypatch.setattr(tree_step, "walk_longest_path", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = random_gpt(TINY_C2I, seed=2)
    drafter = random_drafter(model)
    table = build_neighbors(torch.randn(TINY_C2I.vocab_size, 3, generator=torch.Generator().manual_seed(1)), 4)
    greedy = SamplingConfig(cfg_scale=2.0, temperature=0.0)
    spec = SpeculativeConfig(tree="dynamic", dynamic=DynamicShape(depth=3, top_k=3, nodes=8),
                             relaxation=Relaxation(k=4, lam=3.0))
    with torch.no_grad():
        out = speculative_generate(model, drafter, Condition.classes([1]), greedy, spec, make_generators(0, 1),
                                   table, compile="off")
        assert calls and out.stats.iterations == len(calls)
        calls.clear()
        speculative_generate(model, drafter, Condition.classes([1]), SamplingConfig(cfg_scale=2.0), spec,
                             make_generators(0, 1), table, compile="off")
    assert not calls  # sampled trees keep the sequential sibling test

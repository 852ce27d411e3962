"""LANTERN relaxation: hand-computed cases and property tests of its bounds (TVD <= delta, p~ <= lambda p),
each checked to fail on a deliberately wrong rule."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lantern_core.errors import ConfigError
from lantern_core.decoding.acceptance.relaxation import Relaxation, relax

NEIGHBORS = torch.tensor([[1, 2, 3], [0, 2, 3], [1, 3, 0], [2, 1, 0]])


def test_hand_computed_prefixes():
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    x = torch.tensor([0])  # neighbours of 0: 1 (0.2), 2 (0.3), 3 (0.4); prefix sums 0.2, 0.5, 0.9
    out = relax(probs, x, NEIGHBORS, Relaxation(k=3, delta=0.5))
    assert out.count.tolist() == [2] and torch.allclose(out.probability, torch.tensor([0.6]))
    out = relax(probs, x, NEIGHBORS, Relaxation(k=3, delta=0.19))
    assert out.count.tolist() == [0] and torch.allclose(out.probability, torch.tensor([0.1]))
    out = relax(probs, x, NEIGHBORS, Relaxation(k=3, lam=6.0))  # budget (6-1) * 0.1 = 0.5
    assert out.count.tolist() == [2] and torch.allclose(out.probability, torch.tensor([0.6]))
    out = relax(probs, x, NEIGHBORS, Relaxation(k=1, delta=1.0))  # only the nearest one may be taken
    assert torch.allclose(out.probability, torch.tensor([0.3]))


def test_zero_budget_and_k_zero_reduce_to_the_target():
    probs = torch.softmax(torch.randn(6, 4, generator=torch.Generator().manual_seed(0)), -1)
    x = torch.tensor([0, 1, 2, 3, 0, 1])
    for rule in (Relaxation(k=3, delta=0.0), Relaxation(k=3, lam=1.0), Relaxation(k=0, delta=0.5)):
        out = relax(probs, x, NEIGHBORS, rule)
        assert torch.equal(out.probability, probs[torch.arange(6), x]) and not out.absorbed.any()


distributions = st.integers(4, 12).flatmap(lambda v: st.tuples(
    st.lists(st.floats(0.0, 1.0, allow_nan=False, allow_subnormal=False), min_size=v, max_size=v).filter(lambda w: sum(w) > 1e-3),
    st.integers(0, v - 1), st.integers(1, v - 1), st.integers(0, 2**31 - 1)))


def _case(case):
    weights, x, k, seed = case
    probs = torch.tensor(weights, dtype=torch.float64)
    probs = (probs / probs.sum())[None]
    V = probs.shape[1]
    g = torch.Generator().manual_seed(seed)
    neighbors = torch.stack([torch.cat([r[r != i] for r in [torch.randperm(V, generator=g)]]) for i in range(V)])
    return probs, torch.tensor([x]), neighbors, k


def relaxed_tvd(probs, x, neighbors, rule, out):
    """TVD between p and the relaxed p~ that moves the absorbed neighbours' mass onto x."""
    relaxed = probs.clone()
    taken = neighbors[x, : int(out.count)]
    relaxed[0, taken] = 0.0
    relaxed[0, x] = out.probability
    return 0.5 * (relaxed - probs).abs().sum().item(), relaxed


@settings(max_examples=300, deadline=None, derandomize=True)
@given(distributions, st.floats(0.0, 1.0, allow_subnormal=False))
def test_lantern_stays_within_its_tvd_budget(case, delta):
    probs, x, neighbors, k = _case(case)
    out = relax(probs, x, neighbors, Relaxation(k=k, delta=delta))
    tvd, relaxed = relaxed_tvd(probs, x, neighbors, Relaxation(k=k, delta=delta), out)
    assert tvd <= delta + 1e-9 and abs(tvd - out.absorbed.item()) < 1e-9
    assert abs(relaxed.sum().item() - 1.0) < 1e-9  # p~ is still a distribution


@settings(max_examples=300, deadline=None, derandomize=True)
@given(distributions, st.floats(1.0, 50.0, allow_subnormal=False))
def test_lantern_pp_stays_within_its_multiplicative_bound(case, lam):
    probs, x, neighbors, k = _case(case)
    out = relax(probs, x, neighbors, Relaxation(k=k, lam=lam))
    assert out.probability.item() <= lam * probs[0, x].item() + 1e-9


def test_the_bound_checks_catch_a_wrong_rule():
    """A rule that always absorbs all k neighbours must violate the budget the properties check."""
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4]], dtype=torch.float64)
    x = torch.tensor([0])
    greedy_all = relax(probs, x, NEIGHBORS, Relaxation(k=3, delta=1.0))  # what a budget-blind rule does
    tvd, _ = relaxed_tvd(probs, x, NEIGHBORS, Relaxation(k=3, delta=0.3), greedy_all)
    assert tvd > 0.3
    assert greedy_all.probability.item() > 2.0 * probs[0, 0].item()


@pytest.mark.parametrize("kwargs,name", [({"k": 3}, "relaxation"), ({"k": 3, "delta": 0.1, "lam": 2.0}, "relaxation"),
                                         ({"k": -1, "delta": 0.1}, "lantern k"), ({"k": 3, "delta": 1.5}, "delta"),
                                         ({"k": 3, "lam": 0.5}, "lambda")])
def test_bad_relaxations_name_the_parameter(kwargs, name):
    with pytest.raises(ConfigError, match=f"Invalid {name}"):
        Relaxation(**kwargs)

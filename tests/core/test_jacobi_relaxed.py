"""Relaxed Jacobi verification respects its bounds (property tests, float64): for random targets, draft
distributions, drafts, neighbour tables and uniforms, `judge_window` accepts exactly the leading run of
u < p~(x) / q(x) where p~ is a reference (plain-loop) LANTERN relaxation within delta or lambda, or GSD's
group mass; every accepted draft's spent mass is within the budget; a rejected position is resampled
where p exceeds the (carved) draft distribution. A budget-blind rule fails the same checks."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lantern_core.decoding.jacobi.judge as jacobi_judge
from lantern_core.decoding.jacobi.config import JacobiConfig
from lantern_core.decoding.jacobi.judge import judge_window
from lantern_core.decoding.acceptance.relaxation import Grouping, Relaxation, RelaxedMass

cases = st.tuples(st.integers(4, 10), st.integers(1, 5), st.integers(1, 9), st.integers(0, 2**31 - 1))


def make_case(case):
    V, w, k, seed = case
    k = min(k, V - 1)
    g = torch.Generator().manual_seed(seed)
    sharp = torch.rand(1, generator=g).item() * 4
    p = torch.softmax(sharp * torch.randn(w + 1, V, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(sharp * torch.randn(w, V, generator=g, dtype=torch.float64), -1)
    drafts = torch.multinomial(q.float(), 1, generator=g)[:, 0]
    u = torch.rand(w + 1, generator=g, dtype=torch.float64)
    neighbors = torch.stack([(lambda r: r[r != i])(torch.randperm(V, generator=g)) for i in range(V)])
    return p, q, drafts, u, neighbors, k


def reference_absorbed(p_row, x, neighbors, rule):
    """Nearest-first neighbours absorbed while the prefix sum fits the budget (a plain loop)."""
    budget = rule.delta if rule.delta is not None else (rule.lam - 1.0) * float(p_row[x])
    total = 0.0
    for n in neighbors[x, : rule.k].tolist():
        if total + float(p_row[n]) > budget + 1e-12:
            break
        total += float(p_row[n])
    return total


def reference_group(p_row, q_row, x, neighbors, rule):
    members = [x] + [n for n in neighbors[x, : rule.k].tolist() if abs(float(p_row[n] - p_row[x])) < rule.gap]
    return float(p_row[members].sum()), float(q_row[members].sum())


def check_window(p, q, drafts, u, neighbors, config):
    """The properties: leading run of the reference rule, spent mass within the budget, valid resample."""
    verdict = judge_window(p, q, drafts, u, config, neighbors)
    w = drafts.numel()
    expected = 0
    for j in range(w):
        x = int(drafts[j])
        if config.relaxation is not None:
            target, draft = float(p[j, x]) + reference_absorbed(p[j], x, neighbors, config.relaxation), float(q[j, x])
        else:
            target, draft = reference_group(p[j], q[j], x, neighbors, config.grouping)
        ratio = target / draft
        if abs(float(u[j]) - ratio) < 1e-9:
            return verdict  # a tie within rounding: the comparison may go either way
        if float(u[j]) >= ratio:
            break
        expected += 1
    assert verdict.accepted == expected
    spent = verdict.absorbed
    assert spent.shape == (expected,) and (spent >= -1e-12).all()
    rule = config.relaxation
    for j in range(expected):
        x = int(drafts[j])
        if rule is not None and rule.delta is not None:
            assert float(spent[j]) <= rule.delta + 1e-9
        elif rule is not None:
            assert float(p[j, x]) + float(spent[j]) <= rule.lam * float(p[j, x]) + 1e-9
        else:
            members_mass, _ = reference_group(p[j], q[j], x, neighbors, config.grouping)
            assert abs(float(spent[j]) - (members_mass - float(p[j, x]))) < 1e-9
    if expected < w:  # the resampled token must have positive residual mass (p above the carved q)
        a, token = expected, int(verdict.token)
        carved = q[a].clone()
        if rule is not None:
            x = int(drafts[a])
            taken, total = [], 0.0
            budget = rule.delta if rule.delta is not None else (rule.lam - 1.0) * float(p[a, x])
            for n in neighbors[x, : rule.k].tolist():
                if total + float(p[a, n]) > budget + 1e-12:
                    break
                total += float(p[a, n])
                taken.append(n)
            carved[taken] = 0.0
        assert float(p[a, token]) > float(carved[token]) or float((p[a] - carved).clamp(min=0).sum()) == 0
    return verdict


@settings(max_examples=250, deadline=None, derandomize=True)
@given(cases, st.floats(0.0, 1.0, allow_subnormal=False))
def test_lantern_delta_windows(case, delta):
    p, q, drafts, u, neighbors, k = make_case(case)
    check_window(p, q, drafts, u, neighbors, JacobiConfig(4, relaxation=Relaxation(k=k, delta=delta)))


@settings(max_examples=250, deadline=None, derandomize=True)
@given(cases, st.floats(1.0, 30.0, allow_subnormal=False))
def test_lantern_lambda_windows(case, lam):
    p, q, drafts, u, neighbors, k = make_case(case)
    check_window(p, q, drafts, u, neighbors, JacobiConfig(4, relaxation=Relaxation(k=k, lam=lam)))


@settings(max_examples=250, deadline=None, derandomize=True)
@given(cases, st.floats(0.0, 1.0, allow_subnormal=False))
def test_gsd_group_windows(case, gap):
    p, q, drafts, u, neighbors, k = make_case(case)
    check_window(p, q, drafts, u, neighbors, JacobiConfig(4, grouping=Grouping(k=k, gap=gap)))


def failures_under(config: JacobiConfig) -> int:
    """How many of 40 fixed cases violate the properties."""
    failures = 0
    for seed in range(40):
        p, q, drafts, u, neighbors, _ = make_case((8, 4, 6, seed))
        try:
            check_window(p, q, drafts, u, neighbors, config)
        except AssertionError:
            failures += 1
    return failures


def test_the_checks_reject_a_budget_blind_rule(monkeypatch):
    """A relaxation that always absorbs all k neighbours must fail the properties on some cases."""
    def blind(probs, tokens, neighbors, rule):
        near = neighbors[tokens, : rule.k]
        absorbed = probs.gather(1, near).sum(1)
        return RelaxedMass(probs.gather(1, tokens[:, None])[:, 0] + absorbed, absorbed,
                           torch.full_like(tokens, rule.k))

    assert failures_under(JacobiConfig(4, relaxation=Relaxation(k=6, delta=0.05))) == 0
    monkeypatch.setattr(jacobi_judge, "relax", blind)
    assert failures_under(JacobiConfig(4, relaxation=Relaxation(k=6, delta=0.05))) >= 10


def test_grouped_checks_reject_a_group_that_ignores_the_gap(monkeypatch):
    """A group that takes every one of the k neighbours, whatever their probability, must fail them too."""
    real = jacobi_judge.group_mass
    assert failures_under(JacobiConfig(4, grouping=Grouping(k=6, gap=0.01))) == 0
    monkeypatch.setattr(jacobi_judge, "group_mass",
                        lambda p, q, tokens, neighbors, rule: real(p, q, tokens, neighbors, Grouping(rule.k, 1.0)))
    assert failures_under(JacobiConfig(4, grouping=Grouping(k=6, gap=0.01))) >= 10


@pytest.mark.parametrize("rule", [Relaxation(k=3, delta=0.0), Grouping(k=3, gap=0.0)])
def test_zero_budget_windows_are_the_exact_rule(rule):
    for seed in range(20):
        p, q, drafts, u, neighbors, _ = make_case((6, 4, 3, seed))
        kind = "relaxation" if isinstance(rule, Relaxation) else "grouping"
        relaxed = judge_window(p, q, drafts, u, JacobiConfig(4, **{kind: rule}), neighbors)
        exact = judge_window(p, q, drafts, u, JacobiConfig(4), None)
        assert relaxed.accepted == exact.accepted and torch.equal(relaxed.token, exact.token)

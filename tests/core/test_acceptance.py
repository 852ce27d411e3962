"""Recursive rejection sampling over siblings preserves the target distribution (chi-square over 40,000
draws for several p/q pairs and sibling counts), and the same test rejects deliberately wrong rules."""
import pytest
import torch

import lantern_core.decoding.acceptance.siblings as acceptance
from lantern_core.decoding.acceptance.siblings import SiblingVerdict, accept_siblings
from lantern_core.decoding.trees.drafting import sample_without_replacement
from lantern_core.decoding.sampling import sample_from_probs
from tests.wrong_rules import conditional_draft_floored

CHI2_CRIT_DF5_P001 = 20.515  # V = 6 -> 5 degrees of freedom, alpha = 0.001
N = 40_000


def chi_square(counts, probs):
    expected = probs * counts.sum()
    keep = expected > 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def emitted(P, log_q, children, g, rule=accept_siblings):
    """Run `rule` on sampled siblings and draw the bonus from its residual: (N,) emitted tokens."""
    verdict = rule(P, log_q, children, torch.rand(children.shape, generator=g, dtype=P.dtype))
    fallback = sample_from_probs(verdict.residual, torch.rand(P.shape[0], generator=g, dtype=P.dtype))
    chosen = children.gather(1, verdict.accepted.clamp(min=0)[:, None])[:, 0]
    return torch.where(verdict.accepted >= 0, chosen, fallback), verdict


def outcome_counts(p, q, m, seed, rule=accept_siblings):
    g = torch.Generator().manual_seed(seed)
    P, Q = p.expand(N, -1).contiguous(), q.expand(N, -1).contiguous()
    children = torch.multinomial(Q, m, replacement=False, generator=g)  # draw order = sibling rank
    tokens, verdict = emitted(P, Q.log(), children, g, rule)
    return torch.bincount(tokens, minlength=p.shape[0]).to(p.dtype), verdict


CASES = [
    (torch.tensor([0.30, 0.05, 0.25, 0.10, 0.20, 0.10]), torch.tensor([0.05, 0.40, 0.05, 0.30, 0.10, 0.10]), 1),
    (torch.tensor([0.30, 0.05, 0.25, 0.10, 0.20, 0.10]), torch.tensor([0.05, 0.40, 0.05, 0.30, 0.10, 0.10]), 3),
    (torch.tensor([0.50, 0.00, 0.30, 0.00, 0.20, 0.00]), torch.tensor([0.10, 0.30, 0.10, 0.30, 0.10, 0.10]), 4),
    (torch.tensor([0.10, 0.10, 0.10, 0.30, 0.30, 0.10]), torch.tensor([0.10, 0.10, 0.10, 0.30, 0.30, 0.10]), 2),
]


@pytest.mark.parametrize("p,q,m", CASES)
def test_output_is_distributed_as_the_target(p, q, m):
    p, q = p.double(), q.double()
    counts, verdict = outcome_counts(p, q, m, seed=int(1000 * m + 10 * p[0]))
    assert chi_square(counts, p) < CHI2_CRIT_DF5_P001
    if torch.equal(p, q):
        assert (verdict.accepted == 0).all()  # a perfect drafter is always accepted at the first sibling


def wrong_rule_without_replacement_correction(p, log_q, children, uniforms):
    """Deliberately wrong: tests every sibling against the unconditioned q (ignores sampling without
    replacement)."""
    q = log_q.exp()
    B, m = children.shape
    residual, accepted = p.clone(), torch.full((B,), -1, dtype=torch.long)
    rows = torch.arange(B)
    for j in range(m):
        x = children[:, j]
        ratio = residual[rows, x] / q[rows, x]
        open_rows = accepted < 0
        take = open_rows & (uniforms[:, j] < ratio)
        accepted = torch.where(take, torch.full_like(accepted, j), accepted)
        still = (open_rows & ~take)[:, None]
        diff = (residual - q).clamp(min=0)
        residual = torch.where(still, diff / diff.sum(-1, keepdim=True).clamp(min=1e-30), residual)
    return SiblingVerdict(accepted, residual)


def test_the_chi_square_test_rejects_a_wrong_rule():
    p, q, m = (t.double() if isinstance(t, torch.Tensor) else t for t in CASES[1])
    counts, _ = outcome_counts(p, q, m, seed=7, rule=wrong_rule_without_replacement_correction)
    assert chi_square(counts, p) > CHI2_CRIT_DF5_P001


def nearly_certain_drafter_counts(seed, m=3):
    """q puts all but ~1e-39 of its mass on token 0 (a drafter under CFG): after token 0 is drawn and
    rejected, what is left of q lies below float32's smallest normal number. float32, as on a device."""
    p = torch.tensor([0.05, 0.30, 0.25, 0.20, 0.10, 0.10])
    log_q = torch.tensor([0.0, -90.0, -92.0, -95.0, -98.0, -101.0])  # q(1..5) ~ 8e-40 .. 1.4e-44
    g = torch.Generator().manual_seed(seed)
    P, LQ = p.expand(N, -1).contiguous(), log_q.expand(N, -1).contiguous()
    children = sample_without_replacement(LQ, m, g)
    assert (children[:, 0] == 0).all() and (children[:, 1] == 1).float().mean() > 0.8  # q's own conditional
    tokens, _ = emitted(P, LQ, children, g)
    return torch.bincount(tokens, minlength=6).double(), p.double()


def test_a_nearly_certain_drafter_is_judged_against_its_true_conditional():
    """The renormalisation bug at the unit level: the next sibling is tested against q renormalised in the log
    domain."""
    counts, p = nearly_certain_drafter_counts(seed=21)
    assert chi_square(counts, p) < CHI2_CRIT_DF5_P001


def test_renormalising_what_is_left_of_q_in_probability_space_is_caught(monkeypatch):
    """The pre-fix rule (leftover q divided by its sum floored at float32's tiny) fails the same test."""
    monkeypatch.setattr(acceptance, "conditional_draft", conditional_draft_floored)
    counts, p = nearly_certain_drafter_counts(seed=21)
    assert chi_square(counts, p) > CHI2_CRIT_DF5_P001

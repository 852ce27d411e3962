"""Recursive rejection sampling over siblings preserves the target distribution (chi-square over 40,000
draws for several p/q pairs and sibling counts), and the same test rejects deliberately wrong rules."""
import pytest
import torch

from lantern_core.acceptance import SiblingVerdict, accept_siblings
from lantern_core.sampling import sample_from_probs

CHI2_CRIT_DF5_P001 = 20.515  # V = 6 -> 5 degrees of freedom, alpha = 0.001
N = 40_000


def chi_square(counts, probs):
    expected = probs * counts.sum()
    keep = expected > 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def outcome_counts(p, q, m, seed, rule=accept_siblings):
    g = torch.Generator().manual_seed(seed)
    P, Q = p.expand(N, -1).contiguous(), q.expand(N, -1).contiguous()
    children = torch.multinomial(Q, m, replacement=False, generator=g)  # draw order = sibling rank
    verdict = rule(P, Q, children, torch.rand(N, m, generator=g, dtype=p.dtype))
    fallback = sample_from_probs(verdict.residual, torch.rand(N, generator=g, dtype=p.dtype))
    chosen = children.gather(1, verdict.accepted.clamp(min=0)[:, None])[:, 0]
    tokens = torch.where(verdict.accepted >= 0, chosen, fallback)
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


def wrong_rule_without_replacement_correction(p, q, children, uniforms):
    """Deliberately wrong: tests every sibling against the unconditioned q (ignores sampling without
    replacement)."""
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

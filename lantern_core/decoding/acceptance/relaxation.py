"""LANTERN's latent relaxation of a target distribution, vectorised over candidates.

For a drafted token x with latent neighbours n_1..n_k (nearest first), the relaxed probability moves
the mass of the longest nearest-first prefix A of B_k(x) onto x: p~(x) = p(x) + S_m*, with
S_m = p(n_1) + ... + p(n_m) and m* the largest m whose S_m fits the budget:
  LANTERN   (delta, an absolute total-variation budget):  S_m <= delta          => TVD(p, p~) = S_m* <= delta
  LANTERN++ (lambda >= 1, a multiplicative bound):        S_m <= (lambda-1) p(x) => p~(x) <= lambda p(x)
delta = 0 and lambda = 1 give p~ = p. GSD's grouped acceptance (arXiv 2508.07747) is the other
relaxation here: the group G(x) is x plus those of its k nearest latent neighbours whose target
probability lies within `gap` of p(x), and a draft is judged on the group's mass, min(1, p(G) / q(G)).
Acceptance rules (exact, greedy, relaxed) build on this; they are not here.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import ConfigError


@dataclass(frozen=True)
class Relaxation:
    k: int
    delta: float | None = None  # LANTERN: absolute TVD budget in [0, 1]
    lam: float | None = None  # LANTERN++: multiplicative bound >= 1

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or self.k < 0:
            raise ConfigError("lantern k", "an integer >= 0 (neighbours per token)", self.k)
        if (self.delta is None) == (self.lam is None):
            raise ConfigError("relaxation", "exactly one of delta (LANTERN) or lambda (LANTERN++)",
                              {"delta": self.delta, "lambda": self.lam})
        if self.delta is not None and not 0.0 <= self.delta <= 1.0:
            raise ConfigError("delta", "a total-variation budget in [0, 1]", self.delta)
        if self.lam is not None and not self.lam >= 1.0:
            raise ConfigError("lambda", "a multiplicative bound >= 1", self.lam)

    @property
    def exact(self) -> bool:
        """True when the rule relaxes nothing (k = 0, delta = 0 or lambda = 1): p~ = p, a lossless decoder."""
        return self.k == 0 or self.delta == 0.0 or self.lam == 1.0


EXACT_RULES = ("same_as_ar", "residual")  # how a lossless decoder accepts: AR's own draws, or min(1, p/q)


def relaxes(rule: "Relaxation | Grouping | None") -> bool:
    """Whether an acceptance rule (a `Relaxation`, a `Grouping` or None) moves the target's law at all: a
    lossless decoder is one whose rules do not."""
    return rule is not None and not rule.exact


@dataclass
class RelaxedMass:
    probability: torch.Tensor  # (N,) p~(x) for each candidate
    absorbed: torch.Tensor  # (N,) S_m*: mass moved onto x (= TVD(p, p~))
    count: torch.Tensor  # (N,) m*: how many neighbours were absorbed


def relax(probs: torch.Tensor, tokens: torch.Tensor, neighbors: torch.Tensor, rule: Relaxation) -> RelaxedMass:
    """probs (N, V) target distributions, tokens (N,) candidates, neighbors (V, >=k) -> p~(tokens)."""
    p_x = probs.gather(1, tokens[:, None])[:, 0]  # (N,)
    if rule.k == 0:
        zero = torch.zeros_like(p_x)
        return RelaxedMass(p_x, zero, zero.long())
    near = neighbors[tokens, : rule.k].to(probs.device)  # (N, k)
    prefix = probs.gather(1, near).cumsum(1)  # (N, k): S_1 .. S_k
    budget = prefix.new_full(p_x.shape, rule.delta) if rule.delta is not None else (rule.lam - 1.0) * p_x
    fits = prefix <= budget[:, None]  # monotone in m: a prefix of True
    count = fits.sum(1)  # m*
    absorbed = (prefix * fits).amax(1)  # S_m*: the prefix sums never decrease, so the last that fits (0 if none)
    return RelaxedMass(p_x + absorbed, absorbed, count)


@dataclass(frozen=True)
class Grouping:
    """GSD grouped acceptance: G(x) = x + neighbours among its k nearest with |p(y) - p(x)| < gap."""

    k: int = 14
    gap: float = 0.15

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or self.k < 0:
            raise ConfigError("group size k", "an integer >= 0 (neighbours considered per token)", self.k)
        if not 0.0 <= self.gap <= 1.0:
            raise ConfigError("group gap", "a probability difference in [0, 1]", self.gap)

    @property
    def exact(self) -> bool:
        """True when no neighbour can join a group (k = 0 or gap 0: |p(y) - p(x)| < 0 never holds)."""
        return self.k == 0 or self.gap == 0.0


@dataclass
class GroupMass:
    target: torch.Tensor  # (N,) p(G(x))
    draft: torch.Tensor  # (N,) q(G(x))
    members: torch.Tensor  # (N,) |G(x)| - 1: neighbours in the group


def group_mass(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor, neighbors: torch.Tensor,
               rule: Grouping) -> GroupMass:
    """p, q (N, V) target and draft distributions, tokens (N,) drafts -> group masses under p and q."""
    p_x = p.gather(1, tokens[:, None])[:, 0]
    q_x = q.gather(1, tokens[:, None])[:, 0]
    if rule.k == 0:
        return GroupMass(p_x, q_x, torch.zeros_like(tokens))
    near = neighbors[tokens, : rule.k].to(p.device)  # (N, k)
    p_near = p.gather(1, near)
    inside = (p_near - p_x[:, None]).abs() < rule.gap  # (N, k) group membership
    return GroupMass(p_x + (p_near * inside).sum(1), q_x + (q.gather(1, near) * inside).sum(1), inside.sum(1))

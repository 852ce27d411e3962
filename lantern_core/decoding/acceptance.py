"""Accepting one tree node's children against the target: exact or LANTERN-relaxed rejection sampling,
vectorised over rows.

Sampled siblings (static trees): x_1..x_m were drawn from the drafter distribution q *without
replacement*. Candidate j is tested against the current target residual p_j with the drafter's
conditional q_j = q with x_1..x_{j-1} removed and renormalised:
    accept x_j with probability min(1, p~_j(x_j) / q_j(x_j));
    on rejection p_{j+1} = normalise(max(0, p_j - q'_j)).
q arrives as log-probabilities and q_j is renormalised in the log domain (logsumexp over what is left):
after a sibling holding almost all of q is rejected, what is left of q can be far below float32's
normal range (1e-43 is common under CFG), and a probability-space renormalisation then loses the
scale and accepts the next sibling with a wildly wrong ratio (issue 14).
Without relaxation p~ = p and q' = q_j: each round is standard speculative sampling between p_j and q_j,
so the output is distributed exactly as p (recursive rejection sampling; EAGLE-1's static-tree rule).

Deterministic siblings (dynamic EAGLE-2 trees, chosen by top-k): q_j is a point mass, so x_j is accepted
with probability p~_j(x_j) and on rejection x_j is removed from the residual — again exact when p~ = p.

LANTERN relaxation (`relaxation.py`): p~_j(x) = p_j(x) + mass of the absorbed neighbours A(x), computed
on the current residual. On rejection the absorbed set is carved out as in LANTERN's code: from q'
(sampled: q' = q_j with A(x) zeroed) or from the residual (deterministic: x and A(x) zeroed). We carve
out exactly A(x), not LANTERN's first k+1 neighbours (an off-by-one in the original); with delta = 0 or
lambda = 1, A is empty and every rule is exact. If every sibling is rejected the caller samples from the
returned residual. The tree walk that calls this per depth is in `tree_walk.py`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .relaxation import Relaxation, relax
from .step_graphs import may_read_host


@dataclass
class SiblingVerdict:
    accepted: torch.Tensor  # (B,) index j of the accepted sibling, -1 when all were rejected
    residual: torch.Tensor  # (B, V) the target residual after the rejections (what to sample on -1)
    absorbed: torch.Tensor | None = None  # (B,) relaxed mass moved onto the accepted token (0 if exact)


def normalise(x: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """x (B, V) >= 0 scaled to sum 1 per row, however small its total (no floor on the divisor: a floor
    would leave a tiny row unnormalised); rows that are all zero get `fallback` (B, V) instead."""
    total = x.sum(-1, keepdim=True)
    return torch.where(total > 0, x / torch.where(total > 0, total, torch.ones_like(total)), fallback)


def conditional_draft(log_q_left: torch.Tensor) -> torch.Tensor:
    """(B, V) log-mass of the drafter tokens not drawn yet -> their renormalised probabilities q_j,
    computed in the log domain (exact for any scale); all zeros where nothing is left."""
    total = torch.logsumexp(log_q_left, dim=-1, keepdim=True)
    return (log_q_left - torch.where(torch.isfinite(total), total, torch.zeros_like(total))).exp()


def absorbed_set(tokens: torch.Tensor, count: torch.Tensor, neighbors: torch.Tensor, k: int, V: int) -> torch.Tensor:
    """(B, V) bool: the first count[b] neighbours of tokens[b]."""
    near = neighbors[tokens, :k].to(tokens.device)  # (B, k)
    take = torch.arange(k, device=tokens.device)[None] < count[:, None]
    out = torch.zeros(tokens.shape[0], V, dtype=torch.bool, device=tokens.device)
    return out.scatter(1, near, take)


def accept_siblings(p: torch.Tensor, log_q: torch.Tensor | None, children: torch.Tensor, uniforms: torch.Tensor,
                    valid: torch.Tensor | None = None, rule: Relaxation | None = None,
                    neighbors: torch.Tensor | None = None) -> SiblingVerdict:
    """p (B, V) target distribution; log_q (B, V) log-probabilities of the drafter distribution the
    siblings were drawn from without replacement, or None for deterministic (top-k) siblings; children
    (B, m) in rank order; uniforms (B, m) in [0, 1); valid (B, m) marks real siblings (padding and
    q(x) = 0 are skipped). On accelerators a fixed m-step loop of tensor ops with no host syncs; on the
    CPU it stops early."""
    B, m = children.shape
    V = p.shape[-1]
    device = p.device
    residual = p.clone()
    q_left = None if log_q is None else log_q.to(p.dtype).clone()  # log-mass of the tokens not drawn yet
    accepted = torch.full((B,), -1, dtype=torch.long, device=device)
    absorbed_out = torch.zeros(B, dtype=p.dtype, device=device)
    rows = torch.arange(B, device=device)
    relaxed = rule is not None and rule.k > 0
    if valid is None:
        valid = torch.ones_like(children, dtype=torch.bool)
    if log_q is not None:
        valid = valid & (log_q.gather(1, children.clamp(min=0)) > float("-inf"))
    # reading a flag costs nothing on the CPU, so stop as soon as every row is settled (never in a captured step)
    cpu = may_read_host(p.device)
    for j in range(m):
        if cpu and not bool(((accepted < 0) & valid[:, j]).any()):
            break  # later siblings are padding or unsampled (valid is a prefix of the ranks)
        x = children[:, j].clamp(min=0)
        if relaxed:
            mass = relax(residual, x, neighbors, rule)
            p_x, absorbed, count = mass.probability, mass.absorbed, mass.count
        else:
            p_x, absorbed, count = residual[rows, x], None, None
        # accept iff u < p_x / q_j(x), written as a product (q_j(x) > 0 for every valid sibling)
        q_j = None if q_left is None else conditional_draft(q_left)
        scale = 1.0 if q_j is None else q_j[rows, x]
        open_rows = (accepted < 0) & valid[:, j]
        take = open_rows & (uniforms[:, j] * scale < p_x)
        accepted = torch.where(take, torch.full_like(accepted, j), accepted)
        if absorbed is not None:
            absorbed_out = torch.where(take, absorbed, absorbed_out)
        reject = (open_rows & ~take)[:, None]
        carve = absorbed_set(x, count, neighbors, rule.k, V) if relaxed else None
        # after a rejection the residual is never empty in exact arithmetic; if rounding empties it, keep p_j
        if q_j is not None:
            q_prime = q_j if carve is None else q_j.masked_fill(carve, 0.0)
            updated = normalise((residual - q_prime).clamp(min=0.0), residual)
            kept = torch.where(valid[:, j], torch.full_like(q_left[:, 0], float("-inf")), q_left[rows, x])
            q_left = q_left.index_put((rows, x), kept)
        else:
            drop = torch.zeros(B, V, dtype=torch.bool, device=device).scatter(1, x[:, None], True)
            updated = normalise(residual.masked_fill(drop if carve is None else drop | carve, 0.0), residual)
        residual = torch.where(reject, updated, residual)
    return SiblingVerdict(accepted, residual, absorbed_out)

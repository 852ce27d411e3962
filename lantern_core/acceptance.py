"""Accepting one tree node's children against the target: exact or LANTERN-relaxed rejection sampling,
vectorised over rows.

Sampled siblings (static trees): x_1..x_m were drawn from the drafter distribution q *without
replacement*. Candidate j is tested against the current target residual p_j with the drafter's
conditional q_j = q with x_1..x_{j-1} removed and renormalised:
    accept x_j with probability min(1, p~_j(x_j) / q_j(x_j));
    on rejection p_{j+1} = normalise(max(0, p_j - q'_j)).
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


@dataclass
class SiblingVerdict:
    accepted: torch.Tensor  # (B,) index j of the accepted sibling, -1 when all were rejected
    residual: torch.Tensor  # (B, V) the target residual after the rejections (what to sample on -1)
    absorbed: torch.Tensor | None = None  # (B,) relaxed mass moved onto the accepted token (0 if exact)


def _normalise(x: torch.Tensor) -> torch.Tensor:
    total = x.sum(-1, keepdim=True)
    uniform = torch.full_like(x, 1.0 / x.shape[-1])
    return torch.where(total > 0, x / total.clamp(min=torch.finfo(x.dtype).tiny), uniform)


def absorbed_set(tokens: torch.Tensor, count: torch.Tensor, neighbors: torch.Tensor, k: int, V: int) -> torch.Tensor:
    """(B, V) bool: the first count[b] neighbours of tokens[b]."""
    near = neighbors[tokens, :k].to(tokens.device)  # (B, k)
    take = torch.arange(k, device=tokens.device)[None] < count[:, None]
    out = torch.zeros(tokens.shape[0], V, dtype=torch.bool, device=tokens.device)
    return out.scatter(1, near, take)


def accept_siblings(p: torch.Tensor, q: torch.Tensor | None, children: torch.Tensor, uniforms: torch.Tensor,
                    valid: torch.Tensor | None = None, rule: Relaxation | None = None,
                    neighbors: torch.Tensor | None = None) -> SiblingVerdict:
    """p (B, V) target distribution; q (B, V) the drafter distribution the siblings were drawn from
    without replacement, or None for deterministic (top-k) siblings; children (B, m) in rank order;
    uniforms (B, m) in [0, 1); valid (B, m) marks real siblings (padding and q(x) = 0 are skipped).
    On accelerators a fixed m-step loop of tensor ops with no host syncs; on the CPU it stops early."""
    B, m = children.shape
    V = p.shape[-1]
    device = p.device
    residual = p.clone()
    q_left = None if q is None else q.clone()
    accepted = torch.full((B,), -1, dtype=torch.long, device=device)
    absorbed_out = torch.zeros(B, dtype=p.dtype, device=device)
    rows = torch.arange(B, device=device)
    relaxed = rule is not None and rule.k > 0
    if valid is None:
        valid = torch.ones_like(children, dtype=torch.bool)
    if q is not None:
        valid = valid & (q.gather(1, children.clamp(min=0)) > 0)
    tiny = torch.finfo(p.dtype).tiny
    cpu = p.device.type == "cpu"  # reading a flag costs nothing there, so stop as soon as every row is settled
    for j in range(m):
        if cpu and not bool(((accepted < 0) & valid[:, j]).any()):
            break  # later siblings are padding or unsampled (valid is a prefix of the ranks)
        x = children[:, j].clamp(min=0)
        if relaxed:
            mass = relax(residual, x, neighbors, rule)
            p_x, absorbed, count = mass.probability, mass.absorbed, mass.count
        else:
            p_x, absorbed, count = residual[rows, x], None, None
        if q_left is not None:
            q_j = _normalise(q_left)
            ratio = p_x / q_j[rows, x].clamp(min=tiny)
        else:
            ratio = p_x
        open_rows = (accepted < 0) & valid[:, j]
        take = open_rows & (uniforms[:, j] < ratio)
        accepted = torch.where(take, torch.full_like(accepted, j), accepted)
        if absorbed is not None:
            absorbed_out = torch.where(take, absorbed, absorbed_out)
        reject = (open_rows & ~take)[:, None]
        carve = absorbed_set(x, count, neighbors, rule.k, V) if relaxed else None
        if q_left is not None:
            q_prime = q_j if carve is None else q_j.masked_fill(carve, 0.0)
            updated = _normalise((residual - q_prime).clamp(min=0.0))
            kept = torch.where(valid[:, j], torch.zeros_like(q_left[:, 0]), q_left[rows, x])
            q_left = q_left.index_put((rows, x), kept)
        else:
            drop = torch.zeros(B, V, dtype=torch.bool, device=device).scatter(1, x[:, None], True)
            updated = _normalise(residual.masked_fill(drop if carve is None else drop | carve, 0.0))
        residual = torch.where(reject, updated, residual)
    return SiblingVerdict(accepted, residual, absorbed_out)

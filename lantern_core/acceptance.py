"""Lossless acceptance of sibling candidates (recursive rejection sampling), vectorised over rows.

Siblings x_1..x_m at one tree node were drawn from the drafter distribution q *without replacement*.
Candidate j is tested against the current target residual p_j with the drafter's conditional
q_j = q with x_1..x_{j-1} removed and renormalised:
    accept x_j with probability min(1, p_j(x_j) / q_j(x_j));
    on rejection p_{j+1} = normalise(max(0, p_j - q_j)).
If every sibling is rejected, the token is drawn from the final residual. Each round is standard
speculative sampling between p_j and q_j, so the output is distributed exactly as p (Jeon et al. 2024,
recursive speculative decoding; EAGLE-1's static-tree rule). Relaxed (LANTERN) variants and the walk
down the tree build on this function; they are not here.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SiblingVerdict:
    accepted: torch.Tensor  # (B,) index j of the accepted sibling, -1 when all were rejected
    residual: torch.Tensor  # (B, V) the target residual after the rejections (what to sample on -1)


def _normalise(x: torch.Tensor) -> torch.Tensor:
    total = x.sum(-1, keepdim=True)
    uniform = torch.full_like(x, 1.0 / x.shape[-1])
    return torch.where(total > 0, x / total.clamp(min=torch.finfo(x.dtype).tiny), uniform)


def accept_siblings(p: torch.Tensor, q: torch.Tensor, children: torch.Tensor, uniforms: torch.Tensor) -> SiblingVerdict:
    """p, q (B, V) target and drafter distributions; children (B, m) drawn from q without replacement in
    that order; uniforms (B, m) in [0, 1). No host syncs: a fixed m-step loop of tensor ops."""
    B, m = children.shape
    residual = p.clone()
    q_left = q.clone()
    accepted = torch.full((B,), -1, dtype=torch.long, device=p.device)
    rows = torch.arange(B, device=p.device)
    for j in range(m):
        x = children[:, j]
        q_j = _normalise(q_left)
        ratio = residual[rows, x] / q_j[rows, x].clamp(min=torch.finfo(q.dtype).tiny)
        open_rows = accepted < 0
        take = open_rows & (uniforms[:, j] < ratio)
        accepted = torch.where(take, torch.full_like(accepted, j), accepted)
        still = (open_rows & ~take)[:, None]
        residual = torch.where(still, _normalise((residual - q_j).clamp(min=0.0)), residual)
        q_left = q_left.index_put((rows, x), torch.zeros(B, dtype=q.dtype, device=q.device))
    return SiblingVerdict(accepted, residual)

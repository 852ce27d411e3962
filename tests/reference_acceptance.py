"""The per-sibling acceptance rule as it was before the tree walk was fused into one pass, kept as a test oracle: one
sibling at a time, the drafter's conditional renormalised in the log domain for each, the residual updated
after each rejection. `lantern_core.decoding.acceptance.accept_siblings` must decide the same."""
from __future__ import annotations

import torch

from lantern_core.decoding.acceptance.siblings import SiblingVerdict, absorbed_set, conditional_draft, normalise
from lantern_core.decoding.acceptance.relaxation import Relaxation, relax


def accept_siblings(p: torch.Tensor, log_q: torch.Tensor | None, children: torch.Tensor, uniforms: torch.Tensor,
                    valid: torch.Tensor | None = None, rule: Relaxation | None = None,
                    neighbors: torch.Tensor | None = None) -> SiblingVerdict:
    """p (B, V) target distribution; log_q (B, V) log-probabilities of the drafter distribution the
    siblings were drawn from without replacement, or None for deterministic (top-k) siblings; children
    (B, m) in rank order; uniforms (B, m) in [0, 1); valid (B, m) marks real siblings (padding and
    q(x) = 0 are skipped). Every sibling in turn, no early exit."""
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
    for j in range(m):
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

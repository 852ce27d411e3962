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
scale and accepts the next sibling with a wildly wrong ratio.
Without relaxation p~ = p and q' = q_j: each round is standard speculative sampling between p_j and q_j,
so the output is distributed exactly as p (recursive rejection sampling; EAGLE-1's static-tree rule).

Deterministic siblings (dynamic EAGLE-2 trees, chosen by top-k): q_j is a point mass, so x_j is accepted
with probability p~_j(x_j) and on rejection x_j is removed from the residual — again exact when p~ = p.

LANTERN relaxation (`acceptance/relaxation.py`): p~_j(x) = p_j(x) + mass of the absorbed neighbours A(x), computed
on the current residual. On rejection the absorbed set is carved out as in LANTERN's code: from q'
(sampled: q' = q_j with A(x) zeroed) or from the residual (deterministic: x and A(x) zeroed). We carve
out exactly A(x), not LANTERN's first k+1 neighbours (an off-by-one in the original); with delta = 0 or
lambda = 1, A is empty and every rule is exact. If every sibling is rejected the caller samples from the
returned residual. The tree walk that calls this per depth is in `trees/walk.py`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..step_graphs import may_read_host
from .relaxation import Relaxation, relax


@dataclass
class SiblingVerdict:
    accepted: torch.Tensor  # (B,) index j of the accepted sibling, -1 when all were rejected
    residual: torch.Tensor  # (B, V) the target residual after rejecting every valid sibling: what to sample on -1
    # (rows that accepted one may hold anything: nobody samples from theirs)
    absorbed: torch.Tensor | None = None  # (B,) relaxed mass moved onto the accepted token (0 if exact)


def normalise(x: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """x (B, V) >= 0 scaled to sum 1 per row, however small its total (no floor on the divisor: a floor
    would leave a tiny row unnormalised); rows that are all zero get `fallback` (B, V) instead."""
    total = x.sum(-1, keepdim=True)
    return torch.where(total > 0, x / torch.where(total > 0, total, torch.ones_like(total)), fallback)


def conditional_draft(log_q_left: torch.Tensor) -> torch.Tensor:
    """(..., V) log-mass of the drafter tokens not drawn yet -> their renormalised probabilities q_j,
    computed in the log domain (exact for any scale); all zeros where nothing is left."""
    total = torch.logsumexp(log_q_left, dim=-1, keepdim=True).nan_to_num_(neginf=0.0)  # -inf: nothing left
    return (log_q_left - total).exp()


def absorbed_set(tokens: torch.Tensor, count: torch.Tensor, neighbors: torch.Tensor, k: int, V: int) -> torch.Tensor:
    """(B, V) bool: the first count[b] neighbours of tokens[b]."""
    near = neighbors[tokens, :k].to(tokens.device)  # (B, k)
    take = torch.arange(k, device=tokens.device)[None] < count[:, None]
    out = torch.zeros(tokens.shape[0], V, dtype=torch.bool, device=tokens.device)
    return out.scatter(1, near, take)


def drafter_conditionals(log_q: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The drafter law each sibling was drawn from, for all m siblings at once: q_j = q without the valid
    siblings before j, renormalised in the log domain (one logsumexp over (B, m, V), not m of them).
    log_q (B, V), tokens (B, m), valid (B, m) -> (q_j (B, m, V), q_j(x_j) (B, m)); a q_j with nothing left is 0."""
    B, m = tokens.shape
    ranks = torch.arange(m, device=tokens.device)
    earlier = (ranks[None, :, None] > ranks[None, None, :]) & valid[:, None, :]  # (B, j, i): x_i drawn before x_j
    removed = torch.where(earlier, float("-inf"), float("inf")).to(log_q.dtype)  # amin: -inf removes, +inf keeps
    left = log_q[:, None, :].expand(B, m, -1).scatter_reduce(2, tokens[:, None, :].expand(B, m, m), removed, "amin")
    q_all = conditional_draft(left)  # (B, m, V)
    return q_all, q_all.gather(2, tokens[:, :, None])[..., 0]


def accept_siblings(p: torch.Tensor, log_q: torch.Tensor | None, children: torch.Tensor, uniforms: torch.Tensor,
                    valid: torch.Tensor | None = None, rule: Relaxation | None = None,
                    neighbors: torch.Tensor | None = None) -> SiblingVerdict:
    """p (B, V) target distribution; log_q (B, V) log-probabilities of the drafter distribution the
    siblings were drawn from without replacement, or None for deterministic (top-k) siblings; children
    (B, m) in rank order; uniforms (B, m) in [0, 1); valid (B, m) marks real siblings (padding and
    q(x) = 0 are skipped). The drafter's conditionals of every sibling come first, in one batch
    (`drafter_conditionals`). The exact rule then tests top-k siblings in closed form (`_exact_top_k`, all at
    once) and sampled ones in a lean fixed m-step loop (`_exact_sampled`, 9 kernels a sibling, three over the
    vocabulary); relaxed rules carry their per-row bookkeeping through the same kind of loop. No host syncs on
    accelerators; on the CPU the loops stop early."""
    B, m = children.shape
    device = p.device
    relaxed = rule is not None and rule.k > 0
    x_all = children.clamp(min=0)
    if valid is None:
        valid = torch.ones_like(children, dtype=torch.bool)
    q_all = q_at = None
    if log_q is not None:
        log_q = log_q.to(p.dtype)
        valid = valid & (log_q.gather(1, x_all) > float("-inf"))
        q_all, q_at = drafter_conditionals(log_q, x_all, valid)
    # reading a flag costs nothing on the CPU, so stop as soon as every row is settled (never in a captured step)
    cpu = may_read_host(p.device)
    # u * q_j(x_j) for every sibling at once: accept iff u < p_x / q_j(x), as a product (q_j(x) > 0 when valid)
    bars = uniforms[:, :m] if q_at is None else uniforms[:, :m] * q_at  # (B, m)
    if not relaxed:
        if q_all is None:
            return _exact_top_k(p, x_all, bars, valid)
        return _exact_sampled(p, q_all, x_all, bars, valid, cpu)
    residual = p
    accepted = torch.full((B,), -1, dtype=torch.long, device=device)
    absorbed_out = torch.zeros(B, dtype=p.dtype, device=device)
    ranks = torch.arange(m, device=device)
    ranks_k = torch.arange(rule.k, device=device)
    pending = torch.ones(B, dtype=torch.bool, device=device)  # no sibling accepted yet
    for j in range(m):
        if cpu and not bool((pending & valid[:, j]).any()):
            break  # later siblings are padding or unsampled (valid is a prefix of the ranks)
        x = x_all[:, j]
        if relaxed:
            mass = relax(residual, x, neighbors, rule)
            p_x, absorbed, count = mass.probability, mass.absorbed, mass.count
        else:
            p_x, absorbed, count = residual.gather(1, x[:, None])[:, 0], None, None
        open_rows = pending & valid[:, j]
        take = open_rows & (bars[:, j] < p_x)
        rejected = open_rows ^ take  # take implies open
        pending = pending ^ take
        accepted = torch.where(take, ranks[j], accepted)
        if absorbed is not None:
            absorbed_out = torch.where(take, absorbed, absorbed_out)
        # on rejection the residual becomes normalise(max(0, p_j - q'_j)); if rounding empties it, p_j stays
        if q_all is not None:
            left = (residual - q_all[:, j]).clamp_(min=0.0)
        else:
            left = residual.scatter(1, x[:, None], 0.0)
        if relaxed:  # LANTERN's carve-out of the absorbed set A(x): q' = 0 there (sampled), or p_j = 0 (top-k)
            near = neighbors[x, :rule.k].to(device)  # (B, k) nearest first
            carved = ranks_k < count[:, None]  # (B, k): the first count[b] neighbours
            if q_all is not None:  # max(0, p_j - 0) = p_j on A(x); elsewhere amax with 0 keeps max(0, p_j - q_j)
                left = left.scatter_reduce_(1, near, torch.where(carved, residual.gather(1, near), 0.0), "amax")
            else:  # 0 on A(x); elsewhere amin with +inf keeps p_j
                left = left.scatter_reduce_(1, near, torch.where(carved, 0.0, float("inf")).to(left.dtype), "amin")
        total = left.sum(-1, keepdim=True)
        residual = torch.where(rejected[:, None] & (total > 0), left / total, residual)
    return SiblingVerdict(accepted, residual, absorbed_out)


def _first_taken(take: torch.Tensor) -> torch.Tensor:
    """(B, m) bool -> (B,) the first True's index, -1 where none."""
    return torch.where(take.any(-1), take.float().argmax(-1), -1)


def _exact_sampled(p: torch.Tensor, q_all: torch.Tensor, x: torch.Tensor, bars: torch.Tensor, valid: torch.Tensor,
                   cpu: bool) -> SiblingVerdict:
    """The exact rule for siblings drawn without replacement, lean: each sibling's test and the residual update
    run for every row (9 kernels a sibling, 3 of them over the vocabulary); which sibling a row accepted is read
    once at the end (its first passing test), and a row's residual only moves on its valid siblings. Rows that
    accepted keep updating a residual nobody reads (the walk samples the bonus from it only where all were
    rejected). The same decisions as the per-sibling bookkeeping of the relaxed loop."""
    B, m = x.shape
    residual = p
    passed = []
    for j in range(m):
        if cpu and not bool(valid[:, j].any()):
            break  # valid is a prefix of the ranks: nothing left to test
        passed.append(bars[:, j:j + 1] < residual.gather(1, x[:, j:j + 1]))
        left = (residual - q_all[:, j]).clamp_(min=0.0)  # normalise(max(0, p_j - q_j)) on rejection
        total = left.sum(-1, keepdim=True)
        residual = torch.where(valid[:, j:j + 1] & (total > 0), left / total, residual)  # rounding may empty it
    accepted = _first_taken(torch.cat(passed, 1) & valid[:, :len(passed)]) if passed else torch.full_like(x[:, 0], -1)
    return SiblingVerdict(accepted, residual, torch.zeros(B, dtype=p.dtype, device=p.device))


def _exact_top_k(p: torch.Tensor, x: torch.Tensor, u: torch.Tensor, valid: torch.Tensor) -> SiblingVerdict:
    """The exact rule for deterministic (top-k) siblings in closed form, every sibling at once: x_j is tested
    against p with the earlier siblings removed, p(x_j) / (total - mass of x_1..x_{j-1}), and on rejecting them
    all the residual is p without them, renormalised. About 15 kernels however many siblings."""
    p_x = p.gather(1, x)  # (B, m)
    mass = torch.where(valid, p_x, 0.0)
    left = p.sum(-1, keepdim=True) - (mass.cumsum(-1) - mass)  # (B, m) mass still in the residual at x_j's test
    accepted = _first_taken(valid & (u * left < p_x))
    carved = p.scatter_reduce(1, x, torch.where(valid, 0.0, float("inf")).to(p.dtype), "amin")  # valid x_j -> 0
    total = carved.sum(-1, keepdim=True)
    residual = torch.where(total > 0, carved / torch.where(total > 0, total, 1.0), p)
    return SiblingVerdict(accepted, residual, torch.zeros(x.shape[0], dtype=p.dtype, device=p.device))
